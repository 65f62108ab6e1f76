#!/usr/bin/env bash
# scripts/test.sh: run every test of the idempotency extension.
#
# Installs what is missing from Debian's packages, builds and installs the
# extension, starts a throwaway cluster with the library preloaded, runs the
# pg_regress (sql/), isolation (specs/) and TAP (t/) suites, stops the
# cluster whatever happens, and exits non-zero on any failure with the diffs
# printed.  Works as root or as a user with sudo.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

trap cleanup EXIT
install_packages
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

if [ ${#failed_suites[@]} -gt 0 ]; then
    for f in regression.diffs output_iso/regression.diffs; do
        if [ -s "$f" ]; then
            echo "===== $f"
            cat "$f"
        fi
    done
    if [ -d tmp_check/log ]; then
        for f in tmp_check/log/*; do
            echo "===== $f (last 60 lines)"
            tail -n 60 "$f"
        done
    fi
    echo "failed suites: ${failed_suites[*]}"
    [ "$failed" -gt 0 ] || failed=${#failed_suites[@]}
fi

echo "tests: $passed passed, $failed failed"
[ ${#failed_suites[@]} -eq 0 ]
