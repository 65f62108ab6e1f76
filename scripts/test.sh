#!/usr/bin/env bash
# scripts/test.sh: run every test of the idempotency extension.
#
# Installs what is missing from Debian's packages, builds and installs the
# extension, starts a throwaway cluster with the library preloaded, runs the
# pg_regress (sql/), isolation (specs/) and TAP (t/) suites and the
# end-to-end tests of the example clients (examples/python, node, java, go),
# stops the services and the cluster whatever happens, and exits non-zero on
# any failure with the diffs printed.  Works as root or as a user with sudo.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

trap cleanup EXIT
install_packages
install_client_packages
build_and_install
make_workdir
# The worker serves "postgres" only, so that it never touches the records
# the regression tests inspect; the TAP tests start clusters of their own.
start_cluster "idempotency.database = 'postgres'"

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
    # pg_regress and pg_isolation_regress print "test NAME ... ok|FAILED",
    # prove prints "t/NAME.pl .. ok" or "Failed N/M subtests".
    passed=$((passed + $(grep -cE '(\.\.\. +ok|^t/.*\.\. ok$)' "$out" || true)))
    failed=$((failed + $(grep -cE '(\.\.\. +FAILED|^t/.*\.\. $|^t/.*Failed|Dubious)' "$out" || true)))
}

run_suite regress ISOLATION= TAP_TESTS=
run_suite isolation REGRESS= TAP_TESTS=
run_suite tap REGRESS= ISOLATION=

# The example clients: each test starts its HTTP service on 127.0.0.1 and
# sends it real requests.  They run as the invoking user, from a copy of
# examples/ of their own, in a process group that is ended afterwards, with a
# time limit; the services connect over TCP as the role idem_app.  The Java
# and Go services, and the Node one a second time, are checked by the Python
# service's test (test_payments_service.py --service-command).
clients_dir=$IDEM_TMP/clients
IDEM_GROUPS=$clients_dir/groups
client_env=(PGHOST=127.0.0.1 PGPORT="$PGPORT" PGDATABASE=idem_examples PGUSER=idem_app)
jdbc_jar=/usr/share/java/postgresql.jar

# Called as an if condition, where set -e does not apply: every step says
# whether it failed.
setup_clients() {
    local bindir
    bindir=$("$PG_CONFIG" --bindir)
    as_root install -d -o "$(id -u)" -g "$(id -g)" "$clients_dir" || return
    tar -C "$IDEM_ROOT/examples" --exclude=node_modules --exclude=__pycache__ \
        --exclude=./java/classes --exclude=./go/payments_service -cf - . \
        | tar -C "$clients_dir" -xf - || return
    as_postgres "$bindir/createdb" idem_examples || return
    as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d idem_examples \
        -f "$IDEM_TMP/src/examples/schema.sql" || return
    log "npm ci (examples/node)"
    (cd "$clients_dir/node" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) || return
}

# run_client NAME DIR COMMAND...: counts the "N passed, N failed" line of
# the Python test or the "# pass N" / "# fail N" lines of node's TAP output.
run_client() {
    local name=$1 dir=$2 out=$IDEM_TMP/$1.out p f status=0
    shift 2
    log "suite: $name"
    (cd "$dir" && in_own_group timeout -k 10 300 env "${client_env[@]}" "$@") 2>&1 \
        | tee "$out" || status=$?
    stop_groups
    p=$(sed -nE 's/^([0-9]+) passed, [0-9]+ failed$/\1/p; s/^# pass ([0-9]+)$/\1/p' "$out" | tail -n 1)
    f=$(sed -nE 's/^[0-9]+ passed, ([0-9]+) failed$/\1/p; s/^# fail ([0-9]+)$/\1/p' "$out" | tail -n 1)
    passed=$((passed + ${p:-0}))
    if [ "$status" -ne 0 ] || [ "${f:-1}" -ne 0 ]; then
        failed_suites+=("$name")
        # a run that failed without saying so counts as one failure
        failed=$((failed + (${f:-0} > 0 ? ${f:-0} : 1)))
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

if setup_clients; then
    run_client clients-python "$clients_dir/python" \
        /usr/bin/python3 -u test_payments_service.py
    run_client clients-node "$clients_dir/node" \
        node --test --test-reporter=tap test/payments.test.js
    run_client clients-node-py "$clients_dir/node" \
        /usr/bin/python3 -u ../python/test_payments_service.py --service-command "node server.js"
    if build_client clients-java "$clients_dir/java" \
        javac -Xlint:all -Werror -cp "$jdbc_jar" -d classes PaymentsService.java; then
        run_client clients-java "$clients_dir/java" \
            /usr/bin/python3 -u ../python/test_payments_service.py \
            --service-command "java -cp $jdbc_jar:classes PaymentsService"
    fi
    # pgx v4 and what it imports from Debian's sources in GOPATH mode: no
    # module download.
    if build_client clients-go "$clients_dir/go" \
        env GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE="$clients_dir/go-cache" \
        go build -o payments_service .; then
        run_client clients-go "$clients_dir/go" \
            /usr/bin/python3 -u ../python/test_payments_service.py \
            --service-command ./payments_service
    fi
else
    log "setting up the example clients failed"
    failed_suites+=(clients)
    failed=$((failed + 1))
fi

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

echo "tests: $passed passed, $failed failed"
[ ${#failed_suites[@]} -eq 0 ]
