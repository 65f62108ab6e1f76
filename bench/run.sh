#!/usr/bin/env bash
# bench/run.sh: measure the extension side by side with its baselines.
#
# Starts a throwaway cluster (as scripts/test.sh does), loads the baselines
# of bench/baselines.sql, and runs each workload's variants in alternation,
# ROUNDS times, with pgbench (prepared statements, CLIENTS clients,
# SECONDS seconds each).  Prints the median tps of every variant and the
# ratios the targets are about, as a Markdown table.
#
# Environment: ROUNDS (5), SECONDS (10), CLIENTS (4), KEYS (100000),
# WORKLOADS (new replay inprogress).
set -euo pipefail
. "$(dirname "$0")/../scripts/lib.sh"

ROUNDS=${ROUNDS:-5}
SECONDS_PER_RUN=${SECONDS:-10}
CLIENTS=${CLIENTS:-4}
KEYS=${KEYS:-100000}
WORKLOADS=${WORKLOADS:-new replay inprogress}

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster "idempotency.database = 'postgres'" \
    "synchronous_commit = off" \
    "shared_buffers = '512MB'" \
    "max_wal_size = '4GB'" \
    "checkpoint_timeout = '30min'"

bindir=$("$PG_CONFIG" --bindir)
psql_bench() { as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d bench "$@"; }

as_postgres "$bindir/createdb" bench
psql_bench -c "CREATE EXTENSION idempotency"
psql_bench -f "$IDEM_TMP/src/bench/baselines.sql"
log "loading $KEYS finished and $KEYS running keys into each table"
psql_bench -v keys="$KEYS" -f "$IDEM_TMP/src/bench/load.sql"

results=$IDEM_TMP/results.tsv
: >"$results"

# Run one variant once; append "variant<TAB>tps" to the results.
run_variant() {
    local variant=$1 out tps
    out=$(as_postgres "$bindir/pgbench" -n -M prepared -c "$CLIENTS" -j 2 \
        -T "$SECONDS_PER_RUN" -D keys="$KEYS" \
        -f "$IDEM_TMP/src/bench/workloads/$variant.sql" bench 2>&1) \
        || { echo "$out" >&2; return 1; }
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
    printf '%s\t%s\n' "$variant" "$tps" >>"$results"
    printf '  %-16s %10.0f tps\n' "$variant" "$tps" >&2
}

variants_of() {
    case $1 in
        new) echo "new_floor new_peer new_ext" ;;
        replay) echo "replay_floor replay_peer replay_ext" ;;
        inprogress) echo "inprogress_peer inprogress_ext" ;;
    esac
}

for round in $(seq 1 "$ROUNDS"); do
    log "round $round of $ROUNDS"
    for w in $WORKLOADS; do
        for v in $(variants_of "$w"); do
            run_variant "$v"
        done
    done
    psql_bench -c "VACUUM ANALYZE"
done

median() {
    sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
tps_of() { awk -F'\t' -v v="$1" '$1 == v { print $2 }' "$results" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo
echo "| workload | extension tps | floor tps | peer tps | extension / floor | extension / peer |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for w in $WORKLOADS; do
    ext=$(tps_of "${w}_ext")
    peer=$(tps_of "${w}_peer")
    if [ "$w" = inprogress ]; then
        printf '| %s | %.0f | - | %.0f | - | %s |\n' "$w" "$ext" "$peer" "$(ratio "$ext" "$peer")"
    else
        floor=$(tps_of "${w}_floor")
        printf '| %s | %.0f | %.0f | %.0f | %s | %s |\n' "$w" "$ext" "$floor" "$peer" \
            "$(ratio "$ext" "$floor")" "$(ratio "$ext" "$peer")"
    fi
done
echo
echo "medians of $ROUNDS rounds, $CLIENTS clients, ${SECONDS_PER_RUN}s per run, $(nproc) cores, PostgreSQL $("$bindir/postgres" --version | awk '{ print $3 }')"
