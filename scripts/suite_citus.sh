# scripts/suite_citus.sh: the Citus layout of examples/sharding/citus, end
# to end, and the refusal of idem_records as a Citus table.  Sourced by
# scripts/test.sh (suite "citus"), after its other suites.
#
# Citus is in no Debian suite: CITUS_PG_CONFIG names the pg_config of a
# PostgreSQL with Citus installed; without it the suite says it is skipped.
# The extension is built and installed into that PostgreSQL; a coordinator
# and two workers (shared_preload_libraries = 'citus,idempotency') run as
# the postgres OS user on free ports, with their data under $IDEM_TMP/citus,
# and are stopped whatever happens (an EXIT trap before cleanup's).  On
# every node, the database "idem_citus" holds the supported layout
# (schema.sql), on which examples/sharding/citus/test_citus.py runs; in
# three more (idem_citus_distributed, _reference, _local) the test makes
# idem_records a Citus table in each way Citus allows and checks that every
# claim, completion and maintenance pass refuses there with 55000 and
# writes nothing.  Uses passed, failed and failed_suites of
# scripts/test.sh, and run_client.

CITUS_NODES=()

# citus_stop_nodes: stop the nodes started, whatever state they are in.
citus_stop_nodes() {
    local dir
    for dir in "${CITUS_NODES[@]}"; do
        as_postgres "$CITUS_BINDIR/pg_ctl" -D "$dir" -m immediate -w stop >/dev/null 2>&1 || true
    done
    CITUS_NODES=()
}

# citus_start_node NAME PORT: initdb and start a node on PORT (in this
# shell, not a subshell: CITUS_NODES lists it for citus_stop_nodes).
citus_start_node() {
    local name=$1 dir=$IDEM_TMP/citus/$1 port=$2
    as_postgres "$CITUS_BINDIR/initdb" -D "$dir/data" -A trust -U postgres \
        --no-sync -E UTF8 --locale=C >"$dir.initdb.log" 2>&1 \
        || { cat "$dir.initdb.log" >&2; return 1; }
    {
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$dir'"
        echo "shared_preload_libraries = 'citus,idempotency'"
        echo "fsync = off"
        echo "max_prepared_transactions = 20"
        echo "wal_level = logical"
        # Citus's daemons (one per database) and the idempotency workers
        echo "max_worker_processes = 64"
        echo "log_line_prefix = '%m [%p] %e %q%a '"
        # the worker is started by the test, from SQL (idem_launch_worker)
        echo "idempotency.naptime = '1s'"
        # expired records are deleted at once, without tombstones: the test of
        # the cleanup pass
        echo "idempotency.cleanup_grace = 0"
        echo "idempotency.tombstone_ttl = 0"
    } | as_postgres tee -a "$dir/data/postgresql.conf" >/dev/null
    CITUS_NODES+=("$dir/data")
    as_postgres env PGCTLTIMEOUT=600 "$CITUS_BINDIR/pg_ctl" -D "$dir/data" \
        -l "$dir/server.log" -w start >/dev/null \
        || { cat "$dir/server.log" >&2; return 1; }
}

citus_sql() {
    local port=$1
    shift
    as_postgres "$CITUS_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"
}

# citus_cluster DB: the database DB on every node, Citus in it, the
# workers added to the coordinator's metadata.
citus_cluster() {
    local db=$1 port
    for port in "$CITUS_COORD" "${CITUS_WORKERS[@]}"; do
        citus_sql "$port" -d postgres -c "CREATE DATABASE $db" || return 1
        citus_sql "$port" -d "$db" -c "CREATE EXTENSION citus" || return 1
    done
    citus_sql "$CITUS_COORD" -d "$db" \
        -c "SELECT citus_set_coordinator_host('127.0.0.1', $CITUS_COORD)" >/dev/null || return 1
    for port in "${CITUS_WORKERS[@]}"; do
        citus_sql "$CITUS_COORD" -d "$db" -c "SELECT citus_add_node('127.0.0.1', $port)" >/dev/null \
            || return 1
    done
}

run_citus_suite() {
    local dir=$IDEM_TMP/src/examples/sharding/citus node log hits
    CITUS_WORKERS=()
    if [ -z "${CITUS_PG_CONFIG:-}" ]; then
        log "suite: citus skipped"
        echo "skipped citus: CITUS_PG_CONFIG is not set (the pg_config of a PostgreSQL with Citus installed)"
        return 0
    fi
    log "suite: citus ($("$CITUS_PG_CONFIG" --version), against $CITUS_PG_CONFIG)"
    CITUS_BINDIR=$("$CITUS_PG_CONFIG" --bindir)
    if ! (PG_CONFIG=$CITUS_PG_CONFIG build_and_install) \
        || [ ! -f "$("$CITUS_PG_CONFIG" --sharedir)/extension/citus.control" ]; then
        echo "FAILED citus: the extension could not be installed into $CITUS_PG_CONFIG, or Citus is not there"
        failed_suites+=(citus)
        failed=$((failed + 1))
        return 0
    fi
    as_root install -d -o postgres -g postgres "$IDEM_TMP/citus"
    for node in coordinator worker1 worker2; do
        as_root install -d -o postgres -g postgres -m 700 "$IDEM_TMP/citus/$node"
    done
    # The nodes are stopped before cleanup removes their folders.
    trap 'citus_status=$?; citus_stop_nodes; (exit $citus_status); cleanup' EXIT
    if ! CITUS_COORD=$(free_port) || ! citus_start_node coordinator "$CITUS_COORD" \
        || ! CITUS_WORKERS[0]=$(free_port) || ! citus_start_node worker1 "${CITUS_WORKERS[0]}" \
        || ! CITUS_WORKERS[1]=$(free_port) || ! citus_start_node worker2 "${CITUS_WORKERS[1]}"; then
        echo "FAILED citus: a node could not be started"
        failed_suites+=(citus)
        failed=$((failed + 1))
    elif ! citus_cluster idem_citus || ! citus_cluster idem_citus_distributed \
        || ! citus_cluster idem_citus_reference || ! citus_cluster idem_citus_local \
        || ! citus_sql "$CITUS_COORD" -d idem_citus -f "$dir/schema.sql" >"$IDEM_TMP/citus/schema.out" 2>&1; then
        cat "$IDEM_TMP/citus/schema.out" 2>/dev/null || true
        echo "FAILED citus: the cluster or the layout could not be set up"
        failed_suites+=(citus)
        failed=$((failed + 1))
    else
        IDEM_GROUPS=$IDEM_TMP/citus.groups
        : >"$IDEM_GROUPS"
        run_client citus "$dir" \
            /usr/bin/python3 -u test_citus.py --coordinator "$CITUS_COORD" \
            --workers "$(IFS=,; echo "${CITUS_WORKERS[*]}")"
    fi
    # No internal error and no crash on any node.
    hits=
    for log in "$IDEM_TMP"/citus/*/server.log; do
        [ -f "$log" ] || continue
        hits+=$(grep -HE ' XX000 (ERROR|FATAL|PANIC):|terminated by signal (4|6|7|8|11)\b' "$log" || true)
    done
    if [ -n "$hits" ]; then
        echo "FAILED citus: internal errors or crashes in the nodes' logs"
        echo "$hits" | head -n 40
        failed_suites+=(citus-logs)
        failed=$((failed + 1))
    else
        echo "ok     citus: no internal error, no crash in the three nodes' logs"
        passed=$((passed + 1))
    fi
    citus_stop_nodes
    trap cleanup EXIT
}

run_citus_suite
