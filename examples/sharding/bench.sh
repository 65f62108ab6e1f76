#!/usr/bin/env bash
# examples/sharding/bench.sh: what the PL/Proxy hop costs.
#
# Starts a throwaway cluster (scripts/lib.sh), sets up the layout of
# layout.sh in it, and measures with pgbench the transactions per second of
# the one-transaction pattern (pay(): claim, payment, completion) called
# directly on a shard against the same calls through the proxy, as a ratio:
#
#   new       pay() of a new key
#   replay    pay() of a key already paid (the stored answer)
#
# The direct and the proxied runs use the same tenants, all of shard 0, so
# that the only difference is the proxy's hop; a third run ("proxy, all
# shards") sends tenants of all four shards through the proxy.  All of it
# runs on one machine: the figures are the hop's cost, not what separate
# servers would add in capacity.  The variants alternate, ROUNDS times, and
# the medians are reported.
#
#   PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config bash examples/sharding/bench.sh
#
# Environment: ROUNDS (3), SECONDS_PER_RUN (10), CLIENTS (4), THREADS (2),
# REPLAY_KEYS (1000 per tenant), KEEP_TMP=1 keeps the cluster's folder.
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib.sh"

ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-4}
THREADS=${THREADS:-2}
REPLAY_KEYS=${REPLAY_KEYS:-1000}

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster "shared_buffers = 256MB" "max_connections = 200"
. "$IDEM_TMP/src/examples/sharding/layout.sh"
sharding_install_plproxy
sharding_setup

bindir=$("$PG_CONFIG" --bindir)
sql() { as_postgres "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

# Eight tenants of shard 0, and eight spread over all four shards.
tenants_of() {
    sql -d "$SHARDING_PROXY_DB" -c "SELECT string_agg(quote_literal(t), ', ')
        FROM (SELECT 'tenant-' || i AS t FROM generate_series(0, 999) i
               WHERE $1 ORDER BY i LIMIT 8) s"
}
shard0=$(tenants_of "hashtext('tenant-' || i) & 3 = 0")
spread=$(tenants_of "true")

# The workloads: one transaction each, a call of pay().
w=$IDEM_TMP/bench
as_root install -d -o postgres -g postgres "$w"
workload() {    # NAME TENANTS KEY
    as_postgres tee "$w/$1.sql" >/dev/null <<EOF
\set t random(1, 8)
\set k random(1, $REPLAY_KEYS)
\set n random(1, 1000000000000)
SELECT * FROM pay((ARRAY[$2])[:t], $3, 100, 'EUR');
EOF
}
workload new-shard0 "$shard0" "format('n-%s-%s', :client_id::int, :n::bigint)"
workload new-spread "$spread" "format('n-%s-%s', :client_id::int, :n::bigint)"
workload replay-shard0 "$shard0" "format('r-%s', :k::int)"
workload replay-spread "$spread" "format('r-%s', :k::int)"

log "loading ${REPLAY_KEYS} paid keys for each of 16 tenants"
sql -h 127.0.0.1 -U idem_app -d "$SHARDING_PROXY_DB" -c "SELECT count(*)
    FROM unnest(ARRAY[$shard0, $spread]) t, generate_series(1, $REPLAY_KEYS) k,
         LATERAL pay(t, 'r-' || k, 100, 'EUR')" >/dev/null

# tps DB WORKLOAD: pgbench's transactions per second.
tps() {
    as_postgres "$bindir/pgbench" -n -M prepared -h 127.0.0.1 -U idem_app -d "$1" \
        -c "$CLIENTS" -j "$THREADS" -T "$SECONDS_PER_RUN" -f "$w/$2.sql" 2>&1 \
        | sed -nE 's/^tps = ([0-9.]+) .*/\1/p'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A runs
for round in $(seq "$ROUNDS"); do
    for kind in new replay; do
        log "round $round: $kind"
        runs[$kind-direct]+="$(tps "${SHARDING_SHARD_DBS[0]}" "$kind-shard0") "
        runs[$kind-proxy]+="$(tps "$SHARDING_PROXY_DB" "$kind-shard0") "
        runs[$kind-spread]+="$(tps "$SHARDING_PROXY_DB" "$kind-spread") "
    done
done

echo
echo "PL/Proxy hop, $CLIENTS clients, $ROUNDS rounds of ${SECONDS_PER_RUN} s, medians (tps):"
echo
echo "| pay() | direct on shard 0 | through the proxy, shard 0's tenants | ratio | through the proxy, all shards |"
echo "| --- | --- | --- | --- | --- |"
for kind in new replay; do
    d=$(echo "${runs[$kind-direct]}" | tr ' ' '\n' | grep . | median)
    p=$(echo "${runs[$kind-proxy]}" | tr ' ' '\n' | grep . | median)
    s=$(echo "${runs[$kind-spread]}" | tr ' ' '\n' | grep . | median)
    printf '| %s | %.0f | %.0f | %.2f | %.0f |\n' "$kind key" "$d" "$p" "$(awk -v p="$p" -v d="$d" 'BEGIN { print p / d }')" "$s"
done
