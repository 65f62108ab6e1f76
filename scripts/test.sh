#!/usr/bin/env bash
# scripts/test.sh: run every test of the idempotency extension.
#
# Installs what is missing from Debian's packages, builds and installs the
# extension, starts a throwaway cluster with the library preloaded, runs the
# pg_regress (sql/), isolation (specs/) and TAP (t/) suites and the
# end-to-end tests of the example clients (examples/python, node, java, go),
# stops the services and the cluster whatever happens, and exits non-zero on
# any failure with the diffs printed.  Works as root or as a user with sudo.
#
#   bash scripts/test.sh                    every suite
#   bash scripts/test.sh regress tap        only the suites named (those of
#                                           IDEM_SUITES; another name is an
#                                           error)
#   REGRESS="setup expiry" PROVE_TESTS=t/005_worker_tombstones.pl \
#       bash scripts/test.sh regress tap    only these tests of a suite
#   CITUS_PG_CONFIG=/path/to/pg_config bash scripts/test.sh citus
#                                           the Citus layout on a coordinator
#                                           and two workers of a PostgreSQL
#                                           with Citus installed (skipped,
#                                           and said so, without it)
#   PG_VERSIONS="15 17 18" bash scripts/test.sh
#                                           every suite on the first version
#                                           (the distribution's own when
#                                           PG_VERSIONS is not set: 15 on
#                                           Debian 12, 17 on Debian 13), then
#                                           the regress, isolation and TAP
#                                           suites on each other version:
#                                           on this machine when it is
#                                           installed here, else in a root of
#                                           its distribution (17 Debian 13's,
#                                           18 unstable's, from their binary
#                                           packages: scripts/roots.sh), with
#                                           pg_upgrade from the version
#                                           before it (15 to 17, 17 to 18)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/suite_exporter.sh"
. "$(dirname "$0")/suite_package.sh"
. "$(dirname "$0")/suite_release.sh"
. "$(dirname "$0")/roots.sh"
. "$(dirname "$0")/suite_sql_edition.sh"

IDEM_SUITES="regress isolation tap walkthrough clients sharding consumer exporter package release citus sql_edition"

# wanted NAME: whether the suite NAME was asked for (all when none was).
wanted() {
    [ ${#IDEM_WANTED[@]} -eq 0 ] && return 0
    local s
    for s in "${IDEM_WANTED[@]}"; do [ "$s" = "$1" ] && return 0; done
    return 1
}
IDEM_WANTED=("$@")
for suite in "$@"; do
    case " $IDEM_SUITES " in
        *" $suite "*) ;;
        *) echo "scripts/test.sh: no suite \"$suite\"; the suites are: $IDEM_SUITES" >&2
           exit 2 ;;
    esac
done

# Built with the pause points of the concurrency specs (src/test_pause.h);
# make reads IDEM_TEST_PAUSE from the environment, installcheck included.
export IDEM_TEST_PAUSE=1

# PG_VERSIONS names the versions; without it, PG_CONFIG (the
# distribution's own PostgreSQL by default) says which PostgreSQL the
# suites run against.
read -ra idem_versions <<<"${PG_VERSIONS:-$IDEM_PG_MAJOR}"
if [ -n "${PG_VERSIONS:-}" ]; then
    PG_CONFIG=$(pg_config_for "${idem_versions[0]}")
    if [ -z "$PG_CONFIG" ]; then
        echo "scripts/test.sh: PostgreSQL ${idem_versions[0]} is not installed here; the first of PG_VERSIONS is one this machine runs (the distribution's own is $IDEM_PG_MAJOR)" >&2
        exit 2
    fi
fi

trap cleanup EXIT
install_packages
# The example clients' languages only for the suites that run them (the
# SQL edition's runs its clients on the first version only).
if wanted clients || { wanted sql_edition && [ -z "${IDEM_RUN_LABEL:-}" ]; }; then
    install_client_packages
elif wanted sharding || wanted consumer; then
    install_packages python3 python3-psycopg2
fi
# t/023 holds a backend with gdb; it would skip without it.
if wanted tap; then
    install_packages gdb
fi
build_and_install
make_workdir
# The worker serves "postgres" only, so that it never touches the records
# the regression tests inspect; the TAP tests start clusters of their own.
# specs/claim_prepared.spec prepares transactions.
# Every server line names its SQLSTATE (check_server_logs), the TAP
# suite's clusters' too (PostgreSQL::Test::Cluster appends TEMP_CONFIG).
idem_log_prefix="log_line_prefix = '%m [%p] %e %q%a '"
echo "$idem_log_prefix" >"$IDEM_TMP/log_prefix.conf"
chmod 644 "$IDEM_TMP/log_prefix.conf"
export TEMP_CONFIG=$IDEM_TMP/log_prefix.conf
start_cluster "idempotency.database = 'postgres'" "max_prepared_transactions = 4" \
    "$idem_log_prefix"

cd "$IDEM_TMP/src"
failed_suites=()
passed=0
failed=0

# Run one suite through PGXS's installcheck with the other two switched off,
# so that all three run even when one fails.
run_suite() {
    local name=$1 out=$IDEM_TMP/$1.out
    shift
    log "suite: $name"
    if as_postgres make -s installcheck PG_CONFIG="$PG_CONFIG" "$@" 2>&1 | tee "$out"; then
        :
    else
        failed_suites+=("$name")
    fi
    # pg_regress and pg_isolation_regress print "test NAME ... ok|FAILED"
    # (15) or "ok|not ok N - NAME" (16 and later), prove prints
    # "t/NAME.pl .. ok" or "Failed N/M subtests".
    passed=$((passed + $(grep -cE '(\.\.\. +ok|^ok [0-9]+ +[-+] |^t/.*\.\. ok$)' "$out" || true)))
    failed=$((failed + $(grep -cE '(\.\.\. +FAILED|^not ok [0-9]+ +[-+] |^t/.*\.\. $|^t/.*Failed|Dubious)' "$out" || true)))
}

# Our files compile without a warning under -Wall -Wextra against this
# PostgreSQL (its own headers' warnings, -Wunused-parameter in ilist.h say,
# are not ours): a build of its own, in a copy of the tree, with the pause
# points as the suites build it.  With the regress suite.
check_warnings() {
    local dir=$IDEM_TMP/wextra ours
    log "suite: warnings (-Wall -Wextra)"
    mkdir -p "$dir"
    tar -C "$IDEM_TMP/src" --exclude=./results --exclude=./output_iso --exclude=./tmp_check \
        -cf - . | tar -C "$dir" -xf -
    make -s -C "$dir" PG_CONFIG="$PG_CONFIG" clean >/dev/null 2>&1 || true
    if ! make -s -C "$dir" -j2 PG_CONFIG="$PG_CONFIG" with_llvm=no COPT='-Wall -Wextra' \
        >/dev/null 2>"$dir/warnings.log"; then
        cat "$dir/warnings.log"
        ours=build-failed
    else
        ours=$(grep -E '^[^/][^:]*:[0-9]+:[0-9]+: warning:' "$dir/warnings.log" || true)
    fi
    if [ -z "$ours" ]; then
        echo "warnings (-Wall -Wextra, $("$PG_CONFIG" --version)) ... ok"
        passed=$((passed + 1))
    else
        echo "$ours"
        echo "warnings (-Wall -Wextra, $("$PG_CONFIG" --version)) ... FAILED"
        failed_suites+=(warnings)
        failed=$((failed + 1))
    fi
    rm -rf "$dir"
}
wanted regress && check_warnings
wanted regress && run_suite regress ISOLATION= TAP_TESTS= ${REGRESS:+"REGRESS=$REGRESS"}
wanted isolation && run_suite isolation REGRESS= TAP_TESTS= ${ISOLATION:+"ISOLATION=$ISOLATION"}
wanted tap && run_suite tap REGRESS= ISOLATION= ${PROVE_TESTS:+"PROVE_TESTS=$PROVE_TESTS"}

# The README's walkthrough, its sql blocks run as written with psql by an
# application role set up as the README's install steps say: it must run
# without error and give the answers the README describes, in order.
run_walkthrough() {
    local bindir out=$IDEM_TMP/walkthrough.out sql=$IDEM_TMP/walkthrough.sql got
    local want="proceed replay mismatch in_progress replay unknown replay"
    bindir=$("$PG_CONFIG" --bindir)
    log "suite: walkthrough (README.md)"
    sed -n '/^## Walkthrough/,/^## Using it/p' "$IDEM_ROOT/README.md" |
        awk '/^```sql$/ { code = 1; next } /^```$/ { code = 0 } code' >"$sql"
    chmod 644 "$sql"
    if as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d postgres \
            -c "CREATE ROLE app LOGIN" -c "CREATE DATABASE appdb OWNER app" &&
        as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d appdb \
            -c "CREATE EXTENSION idempotency" \
            -c "GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_heartbeat, idem_checkpoint, idem_replay, idem_resolve TO app" &&
        as_postgres "$bindir/psql" -X -v ON_ERROR_STOP=1 -U app -d appdb -f "$sql" >"$out" 2>&1; then
        got=$(grep -oE '^ *(proceed|replay|mismatch|in_progress|unknown)\b' "$out" | tr -d ' ' | tr '\n' ' ')
        if [ "${got% }" = "$want" ]; then
            echo "walkthrough ... ok"
            passed=$((passed + 1))
            return
        fi
        echo "walkthrough: answers \"${got% }\", expected \"$want\""
    fi
    cat "$out"
    echo "walkthrough ... FAILED"
    failed_suites+=(walkthrough)
    failed=$((failed + 1))
}
# Then the README's "Uninstalling" block, as written, in the walkthrough's
# database: the records are kept, as text where the extension had types.
run_uninstall() {
    local bindir out=$IDEM_TMP/uninstall.out sql=$IDEM_TMP/uninstall.sql got
    local want="3|succeeded|0"
    bindir=$("$PG_CONFIG" --bindir)
    sed -n '/^## Uninstalling/,/^## /p' "$IDEM_ROOT/README.md" |
        awk '/^```sql$/ { code = 1; next } /^```$/ { code = 0 } code' >"$sql"
    chmod 644 "$sql"
    if as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d appdb -f "$sql" >"$out" 2>&1 &&
        got=$(as_postgres "$bindir/psql" -X -At -d appdb -c "SELECT count(*) || '|' ||
                (SELECT state FROM idem_records_saved WHERE key = 'key-001') || '|' ||
                (SELECT count(*) FROM pg_extension WHERE extname = 'idempotency')
                FROM idem_records_saved" 2>>"$out") &&
        [ "$got" = "$want" ]; then
        echo "uninstall (README.md) ... ok"
        passed=$((passed + 1))
        return
    fi
    cat "$out"
    echo "uninstall: got \"${got:-}\", expected \"$want\""
    echo "uninstall (README.md) ... FAILED"
    failed_suites+=(walkthrough)
    failed=$((failed + 1))
}
wanted walkthrough && run_walkthrough && run_uninstall

# The example clients: each test starts its HTTP service on 127.0.0.1 and
# sends it real requests.  They run as the invoking user, from a copy of
# examples/ of their own, in a process group that is ended afterwards, with a
# time limit; the services connect over TCP as the role idem_app.  The Java
# and Go services, and the Node one a second time, are checked by the Python
# service's test (test_payments_service.py --service-command).
# examples/ and clients/ (the client libraries, which the examples use)
# are copied side by side.
clients_tree=$IDEM_TMP/clients
clients_dir=$clients_tree/examples
IDEM_GROUPS=$clients_tree/groups
# The Python test's checks of the expired and rate_limited answers need a
# superuser connection besides, always to the server itself.
client_env=(PGHOST=127.0.0.1 PGPORT="$PGPORT" PGDATABASE=idem_examples PGUSER=idem_app
            IDEM_ADMIN_DSN="host=127.0.0.1 port=$PGPORT dbname=idem_examples user=postgres")
jdbc_jar=/usr/share/java/postgresql.jar
servlet_jar=/usr/share/java/servlet-api.jar

# Called as an if condition, where set -e does not apply: every step says
# whether it failed.
setup_clients() {
    local bindir
    bindir=$("$PG_CONFIG" --bindir)
    as_root install -d -o "$(id -u)" -g "$(id -g)" "$clients_tree" || return
    tar -C "$IDEM_ROOT" --exclude=node_modules --exclude=__pycache__ \
        --exclude=examples/java/classes --exclude=examples/go/payments_service \
        --exclude=clients/java/classes --exclude=clients/java/test-classes --exclude=clients/java/idempotency.jar \
        -cf - examples clients \
        | tar -C "$clients_tree" -xf - || return
    as_postgres "$bindir/createdb" idem_examples || return
    as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d idem_examples \
        -f "$IDEM_TMP/src/examples/schema.sql" || return
    log "npm ci (clients/node, examples/node)"
    (cd "$clients_tree/clients/node" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) || return
    (cd "$clients_dir/node" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) || return
}

# run_client NAME DIR COMMAND...: counts the "N passed, N failed" line of
# the Python test or the "# pass N" / "# fail N" lines of node's TAP output.
# The process groups left are ended afterwards, unless keep_groups is set
# (pgbouncer's, while more suites use it).
run_client() {
    local name=$1 dir=$2 out=$IDEM_TMP/$1.out p f status=0
    shift 2
    log "suite: $name"
    (cd "$dir" && in_own_group timeout -k 10 300 env "${client_env[@]}" "$@") 2>&1 \
        | tee "$out" || status=$?
    [ -n "${keep_groups:-}" ] || stop_groups
    p=$(sed -nE 's/^([0-9]+) passed, [0-9]+ failed$/\1/p; s/^# pass ([0-9]+)$/\1/p' "$out" | tail -n 1)
    f=$(sed -nE 's/^[0-9]+ passed, ([0-9]+) failed$/\1/p; s/^# fail ([0-9]+)$/\1/p' "$out" | tail -n 1)
    passed=$((passed + ${p:-0}))
    if [ "$status" -ne 0 ] || [ "${f:-1}" -ne 0 ]; then
        failed_suites+=("$name")
        # a run that failed without saying so counts as one failure
        failed=$((failed + (${f:-0} > 0 ? ${f:-0} : 1)))
    fi
}

# examples/schema.sql refuses a payments table of another shape with its
# error, and keeps nothing (the file is one transaction).  One test.
check_schema_refusal() {
    local bindir db=idem_wrong_payments out=$IDEM_TMP/schema-refusal.out
    local name="examples/schema.sql refuses a payments table of another shape, and keeps nothing"
    bindir=$("$PG_CONFIG" --bindir)
    log "suite: schema-refusal"
    if as_postgres "$bindir/createdb" "$db" \
        && as_postgres "$bindir/psql" -X -q -d "$db" \
            -c 'CREATE TABLE payments (id bigserial PRIMARY KEY, amount numeric)' \
        && ! as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "$db" \
            -f "$IDEM_TMP/src/examples/schema.sql" >"$out" 2>&1 \
        && grep -q 'ERROR:  relation "payments" exists and is not the payments table' "$out" \
        && [ "$(as_postgres "$bindir/psql" -X -At -d "$db" \
            -c "SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'")" = 0 ]; then
        passed=$((passed + 1))
        echo "ok     $name"
    else
        failed=$((failed + 1))
        failed_suites+=(schema-refusal)
        echo "FAILED $name"
        cat "$out"
    fi
}

# The Python client's suite again, on each framework, and the Node one on
# each framework, through a real pgbouncer in transaction mode, and checks of what
# docs/poolers.md says: a session SET reaches the next client of its server
# connection and SET LOCAL does not; a claim that
# waits holds its server connection, and a wait => 0 claim queues in
# pgbouncer behind it.  pgbouncer (Debian's package, installed when missing;
# its service is not used) runs as postgres, since it refuses root, from its
# own files, in a process group that stop_groups ends: this function's when
# the suites are done, cleanup's whatever happens.
run_pgbouncer() {
    local dir=$IDEM_TMP/pgbouncer out=$IDEM_TMP/pgbouncer.out bindir port pid v token
    local sudo=() waiter queued before ok=1
    bindir=$("$PG_CONFIG" --bindir)
    log "suite: pgbouncer"
    pgb_sql() {
        timeout 60 "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U idem_app -d "$@"
    }
    # pgb_check NAME EXPECTED ACTUAL
    pgb_check() {
        if [ "$2" = "$3" ]; then
            passed=$((passed + 1))
            echo "ok     $1"
        else
            failed=$((failed + 1))
            echo "FAILED $1: expected '$2', got '$3'"
            ok=0
        fi
    }
    # pgb_poll EXPECTED COMMAND...: run COMMAND until it prints EXPECTED, for
    # 30 s at most; its last output is left in v for pgb_check.
    pgb_poll() {
        local want=$1 end=$((SECONDS + 30))
        shift
        while [ "$SECONDS" -lt "$end" ]; do
            v=$("$@" 2>/dev/null) || true
            [ "$v" = "$want" ] && break
            sleep 0.1
        done
        return 0
    }
    # the column $2 of SHOW POOLS for the pool of database $1
    pgb_pool() {
        pgb_sql pgbouncer -A -c 'SHOW POOLS' -P tuples_only=off | awk -F'|' -v db="$1" -v col="$2" \
            'NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next } $1 == db { print $c }'
    }
    # "started", or "exited" once pgbouncer has exited
    pgb_started() {
        kill -0 "$pid" || { echo exited; return; }
        pgb_sql pgbouncer -c 'SHOW VERSION' | grep -q '^PgBouncer ' && echo started
    }
    # Debian's package starts and enables its own service: installed by
    # install_service_packages, it is neither started nor left enabled.
    if ! install_service_packages pgbouncer || ! port=$(free_port); then
        pgb_check "pgbouncer installed" yes no
        failed_suites+=(pgbouncer)
        return 0
    fi
    as_root install -d -o postgres -g postgres "$dir"
    as_postgres tee "$dir/pgbouncer.ini" >/dev/null <<EOF
[databases]
idem_examples = host=127.0.0.1 port=$PGPORT dbname=idem_examples
; one server connection, for the checks
idem_one = host=127.0.0.1 port=$PGPORT dbname=idem_examples pool_size=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
; the JDBC driver sends it at startup; pgbouncer refuses what it does not track
ignore_startup_parameters = extra_float_digits
default_pool_size = 4
stats_users = idem_app
logfile = $dir/pgbouncer.log
EOF
    echo '"idem_app" ""' | as_postgres tee "$dir/userlist.txt" >/dev/null
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    in_own_group timeout -k 5 600 "${sudo[@]}" /usr/sbin/pgbouncer -q -u postgres "$dir/pgbouncer.ini" \
        >"$out" 2>&1 &
    pid=$!
    pgb_poll started pgb_started
    pgb_check "pgbouncer starts on 127.0.0.1:$port" started "$v"
    if [ "$ok" = 1 ]; then
        # pool_size = 1: every client of idem_one gets the same server connection.
        pgb_sql idem_one -c "SET idempotency.claim_wait = '2s'" || true
        v=$(pgb_sql idem_one -c 'SHOW idempotency.claim_wait') || true
        pgb_check "transaction mode: a session SET reaches the next client of its server connection" 2s "$v"
        pgb_sql idem_one -c 'RESET idempotency.claim_wait' \
            -c "BEGIN; SET LOCAL idempotency.claim_wait = '2s'; COMMIT" || true
        v=$(pgb_sql idem_one -c 'SHOW idempotency.claim_wait') || true
        pgb_check "transaction mode: SET LOCAL does not" 0 "$v"

        # A committed claim with a lease (the three-transaction pattern), a
        # claim that waits for it, and a claim of another key with wait => 0.
        token=$(pgb_sql idem_one -c "SELECT token FROM idem_claim('pgbouncer.check', 'held-$port', lease => '5min')") || true
        pgb_sql idem_one -c "SELECT outcome FROM idem_claim('pgbouncer.check', 'held-$port', wait => '50s')" \
            >"$out.waiter" 2>&1 &
        waiter=$!
        pgb_poll 1 as_postgres "$bindir/psql" -X -At -d idem_examples -c "SELECT count(*) FROM pg_stat_activity
            WHERE state = 'active' AND query LIKE '%''held-$port'', wait =>%' AND pid <> pg_backend_pid()"
        pgb_check "a claim with wait => '50s' waits on the only server connection" 1 "$v"
        pgb_sql idem_one -c "SELECT outcome FROM idem_claim('pgbouncer.check', 'queued-$port')" >"$out.queued" 2>&1 &
        queued=$!
        pgb_poll 1 pgb_pool idem_one cl_waiting
        pgb_check "  ... and a wait => 0 claim of another key waits in pgbouncer (SHOW POOLS: cl_waiting)" 1 "$v"
        # The first attempt completes, directly on the server since the
        # pool's one connection is taken: the waiting claim replays, then the
        # queued one gets the connection.
        echo "SELECT idem_complete(:'token', 201, '{}')" \
            | timeout 60 "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -v token="$token" \
                -h 127.0.0.1 -p "$PGPORT" -U idem_app -d idem_examples >/dev/null || true
        wait "$waiter" || true
        wait "$queued" || true
        pgb_check "  ... the waiting claim answers replay once the attempt completes" replay "$(cat "$out.waiter")"
        pgb_check "  ... then the queued claim proceeds" proceed "$(cat "$out.queued")"
        [ "$ok" = 1 ] || failed_suites+=(pgbouncer)
        before=${#failed_suites[@]}
        local keep_groups=1
        run_client clients-python-pgbouncer "$clients_dir/python" \
            env PGPORT="$port" /usr/bin/python3 -u test_payments_service.py
        for framework in "wsgi --driver psycopg" asgi; do
            run_client "clients-python-${framework%% *}-psycopg-pgbouncer" "$clients_dir/python" \
                env PGPORT="$port" /usr/bin/python3 -u test_payments_service.py --service-command \
                "/usr/bin/python3 -u payments_service.py --framework $framework --no-prepared-statements"
        done
        for framework in http express fastify; do
            run_client "clients-node-$framework-pgbouncer" "$clients_dir/node" \
                env PGPORT="$port" /usr/bin/python3 -u ../python/test_payments_service.py \
                --service-command "node server.js --framework $framework"
        done
        # The Java and Go services too, when they were built, with no named
        # prepared statement (docs/clients.md).
        if [ -d "$clients_dir/java/classes" ]; then
            run_client clients-java-pgbouncer "$clients_dir/java" \
                env PGPORT="$port" /usr/bin/python3 -u ../python/test_payments_service.py \
                --service-command "java -cp $java_cp:classes PaymentsService --no-prepared-statements" \
                --known-limit jdk-httpserver
        fi
        if [ -x "$clients_dir/go/payments_service" ]; then
            run_client clients-go-pgbouncer "$clients_dir/go" \
                env PGPORT="$port" /usr/bin/python3 -u ../python/test_payments_service.py \
                --service-command "./payments_service --no-prepared-statements"
        fi
        keep_groups=
        [ "${#failed_suites[@]}" -eq "$before" ] || ok=0
    else
        failed_suites+=(pgbouncer)
    fi
    stop_groups
    if [ "$ok" = 0 ]; then
        echo "===== $dir/pgbouncer.log (last 40 lines)"
        tail -n 40 "$dir/pgbouncer.log" "$out" 2>/dev/null || true
    fi
}

# build_client NAME DIR COMMAND...: the build step of a compiled client,
# time-limited; when it fails, the client's suite counts as one failure.
build_client() {
    local name=$1 dir=$2
    shift 2
    log "building $name"
    if (cd "$dir" && timeout -k 10 600 "$@"); then
        return 0
    fi
    log "building $name failed"
    failed_suites+=("$name")
    failed=$((failed + 1))
    return 1
}

if ! wanted clients; then
    :
elif setup_clients; then
    # The client libraries' own tests, in their ecosystems' runners.
    run_client clients-node-lib "$clients_tree/clients/node" \
        node --test --test-reporter=tap test/
    run_client clients-python-lib "$clients_tree/clients/python" \
        /usr/bin/python3 -m pytest -p no:cacheprovider tests
    run_client clients-python "$clients_dir/python" \
        /usr/bin/python3 -u test_payments_service.py
    run_client clients-python-wsgi-psycopg "$clients_dir/python" \
        /usr/bin/python3 -u test_payments_service.py \
        --service-command "/usr/bin/python3 -u payments_service.py --framework wsgi --driver psycopg"
    run_client clients-python-asgi "$clients_dir/python" \
        /usr/bin/python3 -u test_payments_service.py \
        --service-command "/usr/bin/python3 -u payments_service.py --framework asgi"
    run_client clients-node "$clients_dir/node" \
        node --test --test-reporter=tap test/payments.test.js
    for framework in http express fastify; do
        run_client "clients-node-$framework" "$clients_dir/node" \
            /usr/bin/python3 -u ../python/test_payments_service.py \
            --service-command "node server.js --framework $framework"
    done
    # clients/java: javac into idempotency.jar, its test a plain main; the
    # example on the jar.
    java_lib=$clients_tree/clients/java
    java_cp=$jdbc_jar:$servlet_jar:$java_lib/idempotency.jar
    if build_client clients-java-lib "$java_lib" bash -c \
        "javac -Xlint:all -Werror -cp $servlet_jar -d classes src/idempotency/*.java &&
         jar cf idempotency.jar -C classes . &&
         javac -Xlint:all -Werror -cp $java_cp -d test-classes test/IdempotencyTest.java"; then
        run_client clients-java-lib "$java_lib" java -cp "$java_cp:test-classes" IdempotencyTest
    fi
    if build_client clients-java "$clients_dir/java" \
        javac -Xlint:all -Werror -cp "$java_cp" -d classes PaymentsService.java; then
        run_client clients-java "$clients_dir/java" \
            /usr/bin/python3 -u ../python/test_payments_service.py \
            --service-command "java -cp $java_cp:classes PaymentsService" --known-limit jdk-httpserver
    fi
    # pgx v4 and what it imports from Debian's sources in GOPATH mode: no
    # module download.  clients/go is idempotency/idem in a GOPATH of its
    # own; go test's verbose lines are counted.
    go_path=$clients_tree/gopath
    go_env=(env GO111MODULE=off GOPATH="$go_path:/usr/share/gocode" GOFLAGS= GOCACHE="$clients_tree/go-cache")
    # (the conformance fixture beside it, as in clients/)
    mkdir -p "$go_path/src/idempotency" && cp -r "$clients_tree/clients/go" "$go_path/src/idempotency/idem" &&
        cp "$clients_tree/clients/conformance.json" "$go_path/src/idempotency/"
    run_client clients-go-lib "$go_path/src/idempotency/idem" "${go_env[@]}" bash -c \
        'go test -v -count=1 . >go-test.out 2>&1; s=$?; cat go-test.out
         echo "$(grep -c "^--- PASS" go-test.out) passed, $(grep -c "^--- FAIL" go-test.out) failed"; exit $s'
    if build_client clients-go "$clients_dir/go" "${go_env[@]}" go build -o payments_service .; then
        run_client clients-go "$clients_dir/go" \
            /usr/bin/python3 -u ../python/test_payments_service.py \
            --service-command ./payments_service
    fi
    check_schema_refusal
    run_pgbouncer
else
    log "setting up the example clients failed"
    failed_suites+=(clients)
    failed=$((failed + 1))
fi

# The PL/Proxy layout of examples/sharding (scripts/suite_sharding.sh).
wanted sharding && . "$IDEM_ROOT/scripts/suite_sharding.sh"

# monitoring/: alert rules checked by promtool, queries scraped through
# prometheus-postgres-exporter (scripts/suite_exporter.sh).
wanted exporter && run_exporter_suite

# The RabbitMQ consumer (examples/consumer) against a private broker.
wanted consumer && . "$IDEM_ROOT/scripts/suite_consumer.sh"

# The Debian package, installed on a fresh Debian 12 (scripts/suite_package.sh).
wanted package && run_package_suite

# Release 1.1.0: the version is the same everywhere (scripts/suite_release.sh).
wanted release && run_release_suite

# The Citus layout of examples/sharding/citus, against the PostgreSQL with
# Citus that CITUS_PG_CONFIG names, skipped without it (scripts/suite_citus.sh).
wanted citus && . "$IDEM_ROOT/scripts/suite_citus.sh"

# The SQL edition on a cluster without our library (scripts/suite_sql_edition.sh).
wanted sql_edition && run_sql_edition_suite

# No internal error (XX000) and no crash in the log of any server the
# suites above ran: what an owner or a caller may do is refused with a
# SQLSTATE of its own, never with XX000, and never kills a backend.  (The
# tests that end a backend on purpose use SIGKILL.)  One test of the count.
check_server_logs() {
    local logs=() f hits
    [ -f "$IDEM_TMP/server.log" ] && logs+=("$IDEM_TMP/server.log")
    [ -f "$IDEM_TMP/sqled-server.log" ] && logs+=("$IDEM_TMP/sqled-server.log")
    for f in "$IDEM_TMP"/src/tmp_check/log/*.log; do
        [ -f "$f" ] && logs+=("$f")
    done
    [ ${#logs[@]} -gt 0 ] || return 0
    hits=$(grep -HE ' XX000 (ERROR|FATAL|PANIC):|terminated by signal (4|6|7|8|11)\b' \
        "${logs[@]}" || true)
    if [ -n "$hits" ]; then
        echo "===== internal errors or crashes in the server logs"
        echo "$hits" | head -n 40
        failed_suites+=("server-logs")
        failed=$((failed + 1))
    else
        log "server logs: no internal error, no crash (${#logs[@]} logs)"
        passed=$((passed + 1))
    fi
}
check_server_logs

# The other versions of PG_VERSIONS: the regress, isolation and TAP suites
# (those asked for) in a run of this script of its own against each, which
# builds and installs the extension there, starts a cluster of that version
# and shows its own failures; its count is added to this run's.  A version
# installed on this machine runs here, and its TAP suite upgrades a cluster
# of the first version, where the extension is installed now, with
# pg_upgrade (t/030_pg_upgrade.pl).  Another runs in a fresh root of its
# distribution (scripts/roots.sh: 17 in Debian 13's, 18 in unstable's),
# which holds the PostgreSQL before it too, for pg_upgrade from 15 to 17
# and from 17 to 18.
run_version() {
    local version=$1 out=$IDEM_TMP/pg$1.out suites=() s counts pg_config
    for s in regress isolation tap sql_edition; do wanted "$s" && suites+=("$s"); done
    [ ${#suites[@]} -gt 0 ] || return 0
    pg_config=$(pg_config_for "$version")
    if [ -n "$pg_config" ]; then
        log "PostgreSQL $version: ${suites[*]}"
        if PG_VERSIONS=$version IDEM_RUN_LABEL="PostgreSQL $version" \
            IDEM_UPGRADE_FROM=$(dirname "$("$PG_CONFIG" --bindir)") \
            bash "$IDEM_ROOT/scripts/test.sh" "${suites[@]}" 2>&1 | tee "$out"; then
            :
        else
            failed_suites+=("pg$version")
        fi
    else
        log "PostgreSQL $version, in a root of Debian $(idem_root_distribution "$version" || echo '?'): ${suites[*]}"
        if idem_run_in_root "$version" "PostgreSQL $version" "${suites[@]}" 2>&1 | tee "$out"; then
            :
        else
            failed_suites+=("pg$version")
        fi
    fi
    counts=$(sed -nE "s/^PostgreSQL $version tests: ([0-9]+) passed, ([0-9]+) failed\$/\1 \2/p" "$out")
    if [ -n "$counts" ]; then
        passed=$((passed + ${counts% *}))
        failed=$((failed + ${counts#* }))
    else
        # a run that ended without its count counts as one failure
        failed=$((failed + 1))
    fi
}
for idem_version in "${idem_versions[@]:1}"; do
    run_version "$idem_version"
done

# On failure, show what failed and nothing else: the diffs of the failed
# pg_regress and isolation tests, and the logs of the failed TAP files (a
# passing TAP file's logs would bury them).
failed_suite() {
    local s
    for s in "${failed_suites[@]}"; do [ "$s" = "$1" ] && return 0; done
    return 1
}
if [ ${#failed_suites[@]} -gt 0 ]; then
    if failed_suite regress && [ -s regression.diffs ]; then
        echo "===== regression.diffs"
        cat regression.diffs
    fi
    if failed_suite isolation && [ -s output_iso/regression.diffs ]; then
        echo "===== output_iso/regression.diffs"
        cat output_iso/regression.diffs
    fi
    if failed_suite tap && [ -d tmp_check/log ]; then
        # prove's summary names each failed file: "t/NAME.pl (Wstat: ...".
        for name in $(sed -nE 's|^t/([^ ]+)\.pl +\(Wstat.*|\1|p' "$IDEM_TMP/tap.out" | sort -u); do
            for f in tmp_check/log/regress_log_"$name" tmp_check/log/"$name"_*.log; do
                [ -f "$f" ] || continue
                echo "===== $f (last 80 lines)"
                tail -n 80 "$f"
            done
        done
    fi
    echo "failed suites: ${failed_suites[*]}"
    [ "$failed" -gt 0 ] || failed=${#failed_suites[@]}
fi

# (the versions, when there were several: "tests: N passed, N failed
# (PostgreSQL 15, 17, 18)")
idem_versions_note=
if [ ${#idem_versions[@]} -gt 1 ]; then
    idem_versions_note=" (PostgreSQL $(echo "${idem_versions[*]}" | sed 's/ /, /g'))"
fi
echo "${IDEM_RUN_LABEL:+$IDEM_RUN_LABEL }tests: $passed passed, $failed failed$idem_versions_note"
[ ${#failed_suites[@]} -eq 0 ]
