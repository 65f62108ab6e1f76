#!/usr/bin/env bash
# scripts/fuzz.sh: throw random and edge arguments at every function of the
# extension for a bounded time and fail if the server crashed or restarted,
# an assertion or a sanitizer fired, a function raised an internal error
# (SQLSTATE XX...), or the records table holds a row no API call could have
# left behind.  Not part of scripts/test.sh: it runs for minutes.
#
#   scripts/fuzz.sh                      # 3 minutes, 4 clients
#   FUZZ_SECONDS=600 FUZZ_CLIENTS=8 scripts/fuzz.sh
#   FUZZ_SQLSMITH=1 scripts/fuzz.sh      # also run sqlsmith (Debian package) as an app role
#
# Builds and installs the extension, starts a throwaway cluster as in
# scripts/test.sh (PG_CONFIG and KEEP_TMP are honoured), creates two
# application roles with only EXECUTE on the functions, and runs
# FUZZ_CLIENTS clients: half as one role, half as the other, plus one
# superuser client (the operator, who may resolve any role's records).  The
# callers are in scripts/fuzz.sql.  IDEM_EXTRA_CONF adds postgresql.conf
# lines; IDEM_PRELOAD_ENV (used by scripts/sanitize.sh) runs the server
# with extra environment variables.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

FUZZ_SECONDS=${FUZZ_SECONDS:-180}
FUZZ_CLIENTS=${FUZZ_CLIENTS:-4}
FUZZ_SQLSMITH=${FUZZ_SQLSMITH:-0}

trap cleanup EXIT
install_packages
if [ -z "${FUZZ_SKIP_BUILD:-}" ]; then
    build_and_install
fi
make_workdir
# shellcheck disable=SC2086
start_cluster "idempotency.database = 'fuzz'" "statement_timeout = '60s'" \
    "log_min_messages = warning" "log_min_error_statement = panic" \
    "max_locks_per_transaction = 256" ${IDEM_EXTRA_CONF:+"$IDEM_EXTRA_CONF"}

bindir=$("$PG_CONFIG" --bindir)
psql_as() {
    local user=$1
    shift
    as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -U "$user" -d fuzz "$@"
}

as_postgres "$bindir/psql" -X -q -d postgres -c "CREATE DATABASE fuzz"
psql_as postgres <<'SQL'
CREATE EXTENSION idempotency;
CREATE ROLE fuzz_a LOGIN;
CREATE ROLE fuzz_b LOGIN;
DO $$
DECLARE f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                             AND d.deptype = 'e'
             JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fuzz_a, fuzz_b', f);
  END LOOP;
END $$;
SQL
psql_as postgres -f "$IDEM_TMP/src/scripts/fuzz.sql"

start_time=$(psql_as postgres -At -c "SELECT pg_postmaster_start_time()")
deadline=$(psql_as postgres -At -c "SELECT now() + interval '$FUZZ_SECONDS seconds'")
log "fuzzing for $FUZZ_SECONDS s with $FUZZ_CLIENTS clients (+ an operator) until $deadline"

# One client: rounds of 100 calls, each round its own transaction, until
# the deadline.  A round that fails as a whole (a lock or statement timeout)
# is just lost; a lost connection is reported below.
end_epoch=$(( $(date +%s) + FUZZ_SECONDS ))
run_client() {
    local user=$1 out=$IDEM_TMP/client.$2.log
    {
        echo "SET lock_timeout = '2s';"
        while [ "$(date +%s)" -lt "$end_epoch" ]; do
            echo "SELECT fuzz_round(100, '$deadline');"
        done
    } | as_postgres "$bindir/psql" -X -q -At -U "$user" -d fuzz -v ON_ERROR_STOP=0 \
        >/dev/null 2>"$out"
}

pids=()
for i in $(seq 1 "$FUZZ_CLIENTS"); do
    if [ $((i % 2)) -eq 1 ]; then user=fuzz_a; else user=fuzz_b; fi
    run_client "$user" "$i" &
    pids+=("$!")
done
run_client postgres operator &
pids+=("$!")

if [ "$FUZZ_SQLSMITH" != 0 ] && command -v sqlsmith >/dev/null; then
    log "running sqlsmith as fuzz_a"
    as_postgres timeout "$FUZZ_SECONDS" sqlsmith \
        --target="host=$PGHOST port=$PGPORT dbname=fuzz user=fuzz_a" \
        --exclude-catalog >"$IDEM_TMP/sqlsmith.log" 2>&1 &
    pids+=("$!")
fi

for pid in "${pids[@]}"; do
    wait "$pid" || true
done

failed=0
fail() { echo "FUZZ FAILURE: $*"; failed=1; }

# 1. The server is up, never restarted, and no backend crashed (a crashed
#    backend makes the postmaster reinitialize without a new start time:
#    the log tells).
now_start=$(psql_as postgres -At -c "SELECT pg_postmaster_start_time()" 2>&1) \
    || fail "the server is not answering: $now_start"
[ "$now_start" = "$start_time" ] || fail "the server restarted ($start_time -> $now_start)"
if grep -E "terminated by signal|was terminated by exception|TRAP:|PANIC:|server process .* exited with exit code [^0]|AddressSanitizer|runtime error:|all server processes terminated" \
    "$IDEM_TMP/server.log" >"$IDEM_TMP/crashes.log"; then
    fail "the server log shows a crash or an assertion:"
    head -n 40 "$IDEM_TMP/crashes.log"
fi
for f in "$IDEM_TMP"/client.*.log; do
    if grep -E "server closed the connection|connection to server .* lost|terminating connection because of crash" "$f" >/dev/null; then
        fail "a client lost its connection: $f"
        head -n 5 "$f"
    fi
done

# 2. The callers ran, no internal error, no call the generator got wrong.
calls=$(psql_as postgres -At -c "SELECT coalesce(sum(calls), 0) FROM fuzz_counts")
[ "$calls" -gt 0 ] || fail "no call was made; the clients said:
$(head -n 5 "$IDEM_TMP"/client.*.log)"
psql_as postgres -c "SELECT sqlstate, message, count(*), min(left(stmt, 300)) AS example
                       FROM fuzz_failures GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 20"
n=$(psql_as postgres -At -c "SELECT count(*) FROM fuzz_failures WHERE sqlstate LIKE 'XX%'")
[ "$n" -eq 0 ] || fail "$n calls raised an internal error (XX...)"
n=$(psql_as postgres -At -c "SELECT count(*) FROM fuzz_failures")
[ "$n" -eq 0 ] || fail "$n calls were malformed by the generator (scripts/fuzz.sql)"

# 3. Every record is one the API could have left: the role of a client,
#    a valid key and scope, and the columns each state implies.
psql_as postgres -At -c "
  SELECT 'bad record ' || id || ': ' || why FROM (
    SELECT id, CASE
      WHEN role NOT IN ('fuzz_a', 'fuzz_b', 'postgres') THEN 'unknown role'
      WHEN key !~ '^[ -~]+\$' OR octet_length(key) > 255 THEN 'invalid key'
      WHEN operation = '' OR octet_length(operation) > 255 OR octet_length(tenant) > 255
           OR caller = '' OR octet_length(caller) > 255 THEN 'invalid scope'
      WHEN state = 'processing' AND (attempt_token IS NULL OR locked_until IS NULL) THEN 'processing without a lease'
      WHEN state IN ('succeeded', 'failed', 'retryable') AND (response_status IS NULL OR completed_at IS NULL) THEN 'finished without a response'
      WHEN octet_length(response_body::text) > 2 * (SELECT setting::bigint FROM pg_settings
                                                    WHERE name = 'idempotency.max_response_size')
           THEN 'body over the limit'
      END AS why
    FROM idem_records) r WHERE why IS NOT NULL LIMIT 20" >"$IDEM_TMP/bad_records.log"
if [ -s "$IDEM_TMP/bad_records.log" ]; then
    fail "records no API call could have left:"
    cat "$IDEM_TMP/bad_records.log"
fi

echo "calls per function and result:"
psql_as postgres -c "SELECT fn, result, calls FROM fuzz_counts ORDER BY fn, calls DESC"
psql_as postgres -c "SELECT sum(calls) AS calls FROM fuzz_counts"
psql_as postgres -c "SELECT role, state, count(*) FROM idem_records GROUP BY 1, 2 ORDER BY 1, 2"
if [ "$FUZZ_SQLSMITH" != 0 ] && [ -f "$IDEM_TMP/sqlsmith.log" ]; then
    echo "sqlsmith (last lines):"
    tail -n 5 "$IDEM_TMP/sqlsmith.log"
fi

if [ "$failed" -ne 0 ]; then
    echo "fuzz: FAILED"
    exit 1
fi
echo "fuzz: passed (server up, no crash, no internal error, no stray record)"
