#!/usr/bin/env bash
# bench/batches.sh: batches of 1,000 items per transaction.
#
# Starts a throwaway cluster (scripts/lib.sh), loads bench/baselines.sql and
# runs pgbench on one script per variant, side by side in one run,
# alternating the variants and repeating the round.  Every transaction
# handles ITEMS (1,000) new keys or message ids, each with a small request:
#
#   Claims (new keys, no completion)
#     many          one idem_claim_many call of ITEMS keys
#     loop_sql      ITEMS idem_claim calls in one statement (generate_series)
#     loop_client   ITEMS idem_claim statements sent one by one
#     peer_sql      ITEMS calls of the PL/pgSQL peer_claim in one statement
#   Claims and completions
#     many_complete idem_claim_many, then idem_complete of every token
#   Inbox (new message ids)
#     inbox_client  ITEMS SELECT idem_inbox(...) statements sent one by one
#     hand_client   ITEMS INSERT ... ON CONFLICT DO NOTHING into a table of
#                   the same shape (floor_records), one by one
#     inbox_sql     ITEMS idem_inbox calls in one statement
#     hand_sql      one INSERT ... SELECT ... ON CONFLICT DO NOTHING of ITEMS rows
#
# The hand-written inbox stores what idem_inbox stores (fingerprint
# sha256(message::text::bytea), state succeeded, expiry) but cannot answer
# in_progress without blocking, nor mismatch.  Prints the median items per
# second of each variant and the ratios, then the WAL one transaction of
# each kind writes per item and the locks it holds at its end.
#
# Environment: PG_CONFIG (as scripts/test.sh), ITEMS (1000), BENCH_SECONDS
# per pgbench run (10), BENCH_REPEATS rounds (3), BENCH_CLIENTS (2),
# BENCH_JOBS (2), KEEP_TMP=1.
set -euo pipefail
. "$(dirname "$0")/../scripts/lib.sh"

ITEMS=${ITEMS:-1000}
SECONDS_PER_RUN=${BENCH_SECONDS:-10}
REPEATS=${BENCH_REPEATS:-3}
CLIENTS=${BENCH_CLIENTS:-2}
JOBS=${BENCH_JOBS:-2}
VARIANTS="many loop_sql loop_client peer_sql many_complete inbox_client hand_client inbox_sql hand_sql"

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster "synchronous_commit = off" "idempotency.database = 'postgres'" \
    "shared_buffers = 256MB" "max_wal_size = 4GB"

BINDIR=$("$PG_CONFIG" --bindir)
psql_q() { as_postgres "$BINDIR/psql" -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }

psql_q -c "CREATE EXTENSION idempotency" -f "$(dirname "$0")/baselines.sql"

SCRIPTS=$IDEM_TMP/bench
as_postgres mkdir -p "$SCRIPTS"
# The keys of one transaction: unique per client and transaction.
K="'-' || :client_id || '-' || :n || '-'"
write() { as_postgres tee "$SCRIPTS/$1.sql" >/dev/null; }

{
    echo '\set n random(1, 2000000000)'
    echo "SELECT count(*) FROM idem_claim_many('bulk', ARRAY(SELECT 'm' || $K || g FROM generate_series(1, $ITEMS) g), ARRAY(SELECT jsonb_build_object('amount', g) FROM generate_series(1, $ITEMS) g));"
} | write many
{
    echo '\set n random(1, 2000000000)'
    echo "SELECT count(*) FROM generate_series(1, $ITEMS) g, idem_claim('bulk', 'l' || $K || g, jsonb_build_object('amount', g)) c;"
} | write loop_sql
{
    echo '\set n random(1, 2000000000)'
    echo 'BEGIN;'
    for i in $(seq 1 "$ITEMS"); do
        echo "SELECT outcome FROM idem_claim('bulk', 'c' || $K || '$i', '{\"amount\": $i}');"
    done
    echo 'COMMIT;'
} | write loop_client
{
    echo '\set n random(1, 2000000000)'
    echo "SELECT count(*) FROM generate_series(1, $ITEMS) g, peer_claim('bulk', 'p' || $K || g, jsonb_build_object('amount', g)) c;"
} | write peer_sql
{
    echo '\set n random(1, 2000000000)'
    echo "SELECT count(idem_complete(c.token, 201, '{\"ok\": true}')) FROM idem_claim_many('bulk', ARRAY(SELECT 'x' || $K || g FROM generate_series(1, $ITEMS) g), ARRAY(SELECT jsonb_build_object('amount', g) FROM generate_series(1, $ITEMS) g)) c;"
} | write many_complete
{
    echo '\set n random(1, 2000000000)'
    echo 'BEGIN;'
    for i in $(seq 1 "$ITEMS"); do
        echo "SELECT idem_inbox('consumer', 'i' || $K || '$i', '{\"amount\": $i}');"
    done
    echo 'COMMIT;'
} | write inbox_client
{
    echo '\set n random(1, 2000000000)'
    echo 'BEGIN;'
    for i in $(seq 1 "$ITEMS"); do
        echo "INSERT INTO floor_records (tenant, caller, operation, key, fingerprint, state, attempt, on_lease_expiry, ttl, created_at, claimed_at, updated_at, completed_at, expires_at) VALUES ('', '', 'consumer', 'h' || $K || '$i', sha256('{\"amount\": $i}'::jsonb::text::bytea), 'succeeded', 1, 'unknown', '1 day', now(), now(), now(), now(), now() + interval '1 day') ON CONFLICT DO NOTHING;"
    done
    echo 'COMMIT;'
} | write hand_client
{
    echo '\set n random(1, 2000000000)'
    echo "SELECT count(*) FROM generate_series(1, $ITEMS) g WHERE idem_inbox('consumer', 'j' || $K || g, jsonb_build_object('amount', g)) = 'proceed';"
} | write inbox_sql
{
    echo '\set n random(1, 2000000000)'
    echo "INSERT INTO floor_records (tenant, caller, operation, key, fingerprint, state, attempt, on_lease_expiry, ttl, created_at, claimed_at, updated_at, completed_at, expires_at) SELECT '', '', 'consumer', 'k' || $K || g, sha256(jsonb_build_object('amount', g)::text::bytea), 'succeeded', 1, 'unknown', '1 day', now(), now(), now(), now(), now() + interval '1 day' FROM generate_series(1, $ITEMS) g ON CONFLICT DO NOTHING;"
} | write hand_sql

RESULTS=$SCRIPTS/results.txt
as_postgres touch "$RESULTS"
log "pgbench: $REPEATS rounds of ${SECONDS_PER_RUN}s per variant, $CLIENTS clients, $ITEMS items per transaction"
for round in $(seq 1 "$REPEATS"); do
    variants=$VARIANTS
    [ $((round % 2)) -eq 0 ] && variants=$(echo "$VARIANTS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for variant in $variants; do
        tps=$(as_postgres "$BINDIR/pgbench" -U postgres -n -M prepared \
            -c "$CLIENTS" -j "$JOBS" -T "$SECONDS_PER_RUN" \
            -f "$SCRIPTS/$variant.sql" postgres 2>&1 |
            awk '/^tps = / { print $3; exit }')
        [ -n "$tps" ] || { log "pgbench failed for $variant"; exit 1; }
        printf '%s %s %s\n' "$round" "$variant" "$tps" | as_postgres tee -a "$RESULTS" >/dev/null
        log "round $round $variant: $tps tps"
    done
    # the tables grow by the same amount for every variant; keep them lean
    psql_q -c "VACUUM idem_records" -c "VACUUM floor_records" -c "VACUUM peer_records"
done

echo
echo "Median items per second of $REPEATS runs of ${SECONDS_PER_RUN}s, $CLIENTS clients," \
     "$ITEMS items per transaction, $(nproc) cores"
echo
awk -v items="$ITEMS" '
function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++)
        for (j = i + 1; j <= n; j++)
            if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ runs[$2] = runs[$2] " " $3 }
END {
    split("many loop_sql loop_client peer_sql many_complete inbox_client hand_client inbox_sql hand_sql", v, " ")
    for (i = 1; i <= 9; i++) m[v[i]] = median(runs[v[i]]) * items
    printf "| variant | items/s | ratio |\n| --- | ---: | --- |\n"
    printf "| idem_claim_many | %.0f | |\n", m["many"]
    printf "| idem_claim x %d in one statement | %.0f | many / this = %.2f |\n", items, m["loop_sql"], m["many"] / m["loop_sql"]
    printf "| idem_claim x %d statements | %.0f | many / this = %.2f |\n", items, m["loop_client"], m["many"] / m["loop_client"]
    printf "| peer_claim (PL/pgSQL) x %d in one statement | %.0f | many / this = %.2f |\n", items, m["peer_sql"], m["many"] / m["peer_sql"]
    printf "| idem_claim_many + idem_complete of each | %.0f | completion share of the time = %.2f |\n", m["many_complete"], 1 - m["many_complete"] / m["many"]
    printf "| idem_inbox x %d statements | %.0f | inbox / hand = %.2f |\n", items, m["inbox_client"], m["inbox_client"] / m["hand_client"]
    printf "| INSERT ... ON CONFLICT DO NOTHING x %d statements | %.0f | |\n", items, m["hand_client"]
    printf "| idem_inbox x %d in one statement | %.0f | inbox / hand = %.2f |\n", items, m["inbox_sql"], m["inbox_sql"] / m["hand_sql"]
    printf "| one INSERT ... SELECT ... ON CONFLICT DO NOTHING of %d rows | %.0f | |\n", items, m["hand_sql"]
}' "$RESULTS"

# WAL and locks of one transaction of each kind.
echo
echo "One transaction of $ITEMS items: WAL bytes per item, and the locks it holds before COMMIT"
echo
psql_q -A -F ' | ' -P footer=off <<SQL | sed -e 's/^/| /' -e 's/$/ |/' -e '2i| --- | ---: | ---: |'
CREATE FUNCTION bench_one(label text, stmt text) RETURNS TABLE (variant text, wal_bytes_per_item numeric, locks_held bigint)
LANGUAGE plpgsql AS \$\$
DECLARE
  lsn0 pg_lsn := pg_current_wal_insert_lsn();
  locks bigint;
BEGIN
  EXECUTE stmt;
  SELECT count(*) INTO locks FROM pg_locks WHERE pid = pg_backend_pid();
  RETURN QUERY SELECT label, round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), lsn0) / $ITEMS, 0), locks;
END \$\$;
SELECT * FROM bench_one('idem_claim_many', \$q\$SELECT count(*) FROM idem_claim_many('walbulk', ARRAY(SELECT 'w-' || g FROM generate_series(1, $ITEMS) g), ARRAY(SELECT jsonb_build_object('amount', g) FROM generate_series(1, $ITEMS) g))\$q\$)
UNION ALL
SELECT * FROM bench_one('idem_claim_many + idem_complete', \$q\$SELECT count(idem_complete(c.token, 201, '{"ok": true}')) FROM idem_claim_many('walbulk', ARRAY(SELECT 'v-' || g FROM generate_series(1, $ITEMS) g), ARRAY(SELECT jsonb_build_object('amount', g) FROM generate_series(1, $ITEMS) g)) c\$q\$)
UNION ALL
SELECT * FROM bench_one('idem_inbox', \$q\$SELECT count(*) FROM generate_series(1, $ITEMS) g WHERE idem_inbox('walconsumer', 'w-' || g, jsonb_build_object('amount', g)) = 'proceed'\$q\$)
UNION ALL
SELECT * FROM bench_one('INSERT ... ON CONFLICT DO NOTHING', \$q\$INSERT INTO floor_records (tenant, caller, operation, key, fingerprint, state, attempt, on_lease_expiry, ttl, created_at, claimed_at, updated_at, completed_at, expires_at) SELECT '', '', 'walconsumer', 'w-' || g, sha256(jsonb_build_object('amount', g)::text::bytea), 'succeeded', 1, 'unknown', '1 day', now(), now(), now(), now(), now() + interval '1 day' FROM generate_series(1, $ITEMS) g ON CONFLICT DO NOTHING\$q\$);
SQL
