#!/usr/bin/env bash
# bench/run.sh: measure the extension side by side with its baselines.
#
#   bench/run.sh [quick|full|tps|fingerprint|cleanup|size|memory|responses|counters|instructions|profile]
#
# One command, one throwaway cluster (scripts/lib.sh), a Markdown report
# printed at the end.  The parts (bench/README.md says what each measures):
#
#   tps          new keys, replays, in-progress answers: the extension, the
#                floors and the PL/pgSQL peer (bench/baselines.sql), in each
#                of PROTOCOLS (pgbench -M), a request that differs per call,
#                ROUNDS alternating rounds of RUN_SECONDS each; median tps,
#                medians of the rounds' ratios.
#   fingerprint  bench/fingerprint.sh (its own cluster): idem_fingerprint
#                against sha256(doc::text::bytea) on 1 KB, 10 KB, 1 MB.
#   cleanup      claim p50/p99 while the worker drains an expired backlog of
#                BACKLOG records, against the same run without a backlog,
#                CLEANUP_ROUNDS alternating rounds; drain time.
#   size         new-key claim+complete p50/p99 and tps with SIZES records
#                already in idem_records (one database per size, the sizes
#                alternating in SIZE_ROUNDS rounds).
#   memory       pgbench backends' RssAnon and memory-context totals sampled
#                every MEM_INTERVAL seconds over a MEM_SECONDS mixed run.
#   responses    new keys and replays with a 1 KB response stored as jsonb,
#                as raw bytes, and as raw bytes encrypted at rest
#                (idempotency.encryption_key), ROUNDS alternating rounds;
#                ratios to the jsonb path.
#   counters     new keys and replays with idem_stat_operations counting
#                (idempotency.track_operations on, the default) and not
#                (off), COUNTER_ROUNDS rounds alternating the order;
#                median of the rounds' on/off ratios.
#
#   instructions the tps part's variants counted in instructions instead of
#                time: the server runs under valgrind's callgrind (its own
#                run, not part of quick or full), one client runs 100 and
#                then INSTR_TX + 100 transactions of each variant in each
#                protocol, and the backend's instruction count difference
#                is divided by INSTR_TX.  Deterministic: the measure for a
#                machine shared with other work.
#   profile      where the time goes that instructions do not show: for
#                PROFILE_VARIANTS, the pgbench backends' user and system CPU
#                time and the other server processes' per transaction, and
#                their wait events sampled every 20 ms (its own run; PROTOCOLS
#                defaults to prepared there).
#
#   editions     the SQL edition (sql_edition/) beside the C edition and the
#                PL/pgSQL peer (the C edition in database bench, the SQL
#                edition in bench_sql of a second cluster that loads no
#                library of ours, as on a managed service; loaded alike): new keys
#                and replays of a request of about 300 bytes that differs per
#                call, in each of PROTOCOLS, ROUNDS alternating rounds; then
#                where the SQL edition's time goes: each of its functions'
#                own time per transaction (track_functions), in a run of its
#                own (not part of quick or full).
#
#   quick        all seven, small: a smoke test of a few minutes.
#   full         all seven at full size (about 75 minutes on 2 cores).
#
# Environment (defaults for full / quick; a single part uses full's):
#   PG_CONFIG, KEEP_TMP=1 (scripts/lib.sh), REPORT=file (also write the report there)
#   CLIENTS 4, KEYS 100000 / 20000 (finished and running keys for replays)
#   ROUNDS 5 / 2, RUN_SECONDS 10 / 3, WORKLOADS "new replay inprogress" (and
#   replay300: replays of a request of about 300 bytes),
#   PROTOCOLS "simple extended prepared" (the tps part's pgbench -M modes)
#   FP_ROUNDS 3 / 1, FP_SECONDS 10 / 3 (fingerprint.sh's BENCH_REPEATS, BENCH_SECONDS)
#   BACKLOG 1000000 / 100000, CLEANUP_ROUNDS 3 / 1, CLEANUP_SECONDS 130 / 15,
#   NAPTIME 1s (the worker's naptime while it drains), WORKER_SETTINGS
#   (other worker settings for the cleanup part, "name=value ...", e.g.
#   "cleanup_batch_size=100"; unset: the defaults)
#   SIZES "10000 1000000 10000000" / "10000 200000", SIZE_ROUNDS 3 / 1, SIZE_SECONDS 20 / 5
#   MEM_SECONDS 300 / 30, MEM_INTERVAL 30 / 5
#   COUNTER_ROUNDS 7 / 2 (RUN_SECONDS each)
#   INSTR_TX 1000 (instructions; KEYS defaults to 5000 there), INSTR_VARIANTS (the
#   workloads/ scripts counted; default all ten of the tps part), INSTR_EDITIONS=1
#   (also the SQL edition beside the C extension and the peer, prepared)
#   PROFILE_VARIANTS "new_floor_hot new_ext" (profile; any of the workloads/ scripts)
#   TPS_VARIANTS (tps: only these variants, e.g. "new_floor_hot new_ext
#   replay_floor_hash replay_ext"; unset: all), BENCH_SQL (statements run in
#   the bench database once it is loaded, before any part)
set -euo pipefail
BENCH_DIR=$(cd "$(dirname "$0")" && pwd)
. "$BENCH_DIR/../scripts/lib.sh"

MODE=${1:-quick}
case $MODE in
    quick)
        PARTS="tps fingerprint cleanup size memory responses counters"
        : "${KEYS:=20000}" "${ROUNDS:=2}" "${RUN_SECONDS:=3}" "${FP_ROUNDS:=1}" "${FP_SECONDS:=3}"
        : "${BACKLOG:=100000}" "${CLEANUP_ROUNDS:=1}" "${CLEANUP_SECONDS:=15}"
        : "${SIZES:=10000 200000}" "${SIZE_ROUNDS:=1}" "${SIZE_SECONDS:=5}"
        : "${MEM_SECONDS:=30}" "${MEM_INTERVAL:=5}" "${COUNTER_ROUNDS:=2}" ;;
    full) PARTS="tps fingerprint cleanup size memory responses counters" ;;
    tps|fingerprint|cleanup|size|memory|responses|counters) PARTS=$MODE ;;
    instructions) PARTS=$MODE; : "${KEYS:=5000}" ;;
    profile) PARTS=$MODE; : "${PROTOCOLS:=prepared}" ;;
    editions) PARTS=$MODE ;;
    *) echo "usage: $0 [quick|full|tps|fingerprint|cleanup|size|memory|responses|counters|instructions|profile|editions]" >&2; exit 2 ;;
esac
CLIENTS=${CLIENTS:-4}
KEYS=${KEYS:-100000}
ROUNDS=${ROUNDS:-5}
RUN_SECONDS=${RUN_SECONDS:-10}
WORKLOADS=${WORKLOADS:-new replay inprogress}
PROTOCOLS=${PROTOCOLS:-simple extended prepared}
FP_ROUNDS=${FP_ROUNDS:-3}
FP_SECONDS=${FP_SECONDS:-10}
BACKLOG=${BACKLOG:-1000000}
CLEANUP_ROUNDS=${CLEANUP_ROUNDS:-3}
CLEANUP_SECONDS=${CLEANUP_SECONDS:-130}
NAPTIME=${NAPTIME:-1s}
WORKER_SETTINGS=${WORKER_SETTINGS:-}
SIZES=${SIZES:-10000 1000000 10000000}
SIZE_ROUNDS=${SIZE_ROUNDS:-3}
SIZE_SECONDS=${SIZE_SECONDS:-20}
MEM_SECONDS=${MEM_SECONDS:-300}
MEM_INTERVAL=${MEM_INTERVAL:-30}
COUNTER_ROUNDS=${COUNTER_ROUNDS:-7}
INSTR_TX=${INSTR_TX:-1000}
PROFILE_VARIANTS=${PROFILE_VARIANTS:-new_floor_hot new_ext}
INSTR_VARIANTS=${INSTR_VARIANTS:-new_floor_hot new_floor new_peer new_ext new_ext_text replay_floor replay_floor_hash replay_peer replay_ext replay_ext_text replay_floor_hash_300 replay_ext_300 replay_ext_text_300 inprogress_peer inprogress_ext}
has_part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

START_TIME=$(date +%s)
FP_REPORT=""
if has_part fingerprint; then
    # fingerprint.sh runs its own throwaway cluster; it is done before ours starts.
    log "fingerprint: bench/fingerprint.sh ($FP_ROUNDS rounds of ${FP_SECONDS}s)"
    FP_REPORT=$(BENCH_SECONDS=$FP_SECONDS BENCH_REPEATS=$FP_ROUNDS BENCH_CLIENTS=$CLIENTS \
        bash "$BENCH_DIR/fingerprint.sh")
fi

trap cleanup EXIT
install_packages
build_and_install
make_workdir
if has_part instructions; then
    # The server under callgrind, one output file per process; autovacuum
    # off, so that the only processes that start and end are the backends.
    install_packages valgrind
    as_postgres mkdir -p "$IDEM_TMP/cg"
    IDEM_POSTGRES=$IDEM_TMP/postgres-callgrind
    printf '#!/bin/sh\nTMPDIR=%s exec valgrind --quiet --tool=callgrind --callgrind-out-file=%s/cg/cg.%%p %s/postgres "$@"\n' \
        "$IDEM_TMP" "$IDEM_TMP" "$("$PG_CONFIG" --bindir)" | as_postgres tee "$IDEM_POSTGRES" >/dev/null
    as_postgres chmod 755 "$IDEM_POSTGRES"
    export IDEM_POSTGRES
    start_cluster "idempotency.database = 'bench'" "idempotency.naptime = '1h'" \
        "synchronous_commit = off" "idempotency.synchronous_outcomes = off" \
        "shared_buffers = '512MB'" "autovacuum = off"
fi
if has_part tps || has_part cleanup || has_part size || has_part memory || has_part responses \
    || has_part counters || has_part profile || has_part editions; then
    start_cluster "idempotency.database = 'bench'" \
        "idempotency.naptime = '1h'" \
        "synchronous_commit = off" \
        "idempotency.synchronous_outcomes = off" \
        "shared_buffers = '512MB'" \
        "maintenance_work_mem = '512MB'" \
        "max_wal_size = '8GB'" \
        "checkpoint_timeout = '30min'" \
        "log_line_prefix = '%m [%p] '"
fi

bindir=$("$PG_CONFIG" --bindir)
REPORT_MD=$IDEM_TMP/report.md
LOGS=$IDEM_TMP/logs
as_postgres mkdir -p "$LOGS"
: >"$REPORT_MD"
W=$IDEM_TMP/src/bench/workloads
out() { cat >>"$REPORT_MD"; }
psql_db() { local db=$1; shift; as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "$db" "$@"; }
psql_bench() { psql_db bench "$@"; }
sql_value() { as_postgres "$bindir/psql" -X -At -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
now() { date +%s.%N; }

# Over the file $results of a part ("variant<TAB>tps" per run): the median
# tps of a variant, whether it ran, and the median over rounds of the ratio
# a/b measured within each round.
tps_of() { awk -F'\t' -v v="$1" '$1 == v { print $2 }' "$results" | median; }
has_variant() { grep -q "^$1	" "$results"; }
round_ratio() {
    awk -F'\t' -v a="$1" -v b="$2" '$1 == a { x[++na] = $2 } $1 == b { y[++nb] = $2 }
        END { for (i = 1; i <= na && i <= nb; i++) printf "%.4f\n", x[i] / y[i] }' "$results" |
        median | awk '{ printf "%.2f", $1 }'
}

# Set one of the worker's settings and reload (the worker wakes up at once).
worker_setting() {
    psql_bench -c "ALTER SYSTEM SET idempotency.$1 = '$2'" -c "SELECT pg_reload_conf()" >/dev/null
}

# COPY n finished records (succeeded, with a response) into db's idem_records,
# numbered from..to, with keys spread over the key space of the new-key
# workload ('n-<client>-<number>-...').  age "live": expires in a day; age
# "expired": expired nine days ago, past cleanup_grace and tombstone_ttl
# (10 min and 7 days by default), so that cleanup deletes it (a record
# expired less than tombstone_ttl ago is only purged).  COPY FROM is the
# one way the state-machine trigger lets a record be born finished.
copy_records() {
    local db=$1 from=$2 to=$3 age=$4 ts
    case $age in
        live) ts="now()" ;;
        expired) ts="now() - interval '10 days'" ;;
    esac
    as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "$db" -c "COPY (
        SELECT current_user, '', '', 'payments.create',
               'n-' || g % 4 || '-' || (g * 2654435761) % 2000000000 || '-$age' || g,
               fp, 'succeeded', 1, 'unknown', interval '1 day', 201,
               '{\"Location\": \"/payments/PAY-1\"}',
               '{\"id\": \"PAY-1\", \"amount\": 100, \"currency\": \"EUR\", \"status\": \"captured\"}',
               ts, ts, ts, ts, ts + interval '1 day'
          FROM (SELECT idem_fingerprint('{\"amount\": 100.00, \"currency\": \"EUR\", \"customer\": \"cus_123\", \"description\": \"order 42\"}') AS fp,
                       $ts AS ts) c,
               generate_series($from::bigint, $to::bigint) AS g) TO STDOUT" |
    as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "$db" -c "COPY idem_records
        (role, tenant, caller, operation, key, fingerprint, state, attempt,
         on_lease_expiry, ttl, response_status, response_headers, response_body,
         created_at, claimed_at, updated_at, completed_at, expires_at) FROM STDIN"
}

# COPY n records in chunks of a million (progress in the log).
load_records() {
    local db=$1 n=$2 age=$3 from=1 to
    while [ "$from" -le "$n" ]; do
        to=$((from + 999999)); [ "$to" -le "$n" ] || to=$n
        copy_records "$db" "$from" "$to" "$age"
        [ "$n" -le 1000000 ] || log "  $db: $to of $n records"
        from=$((to + 1))
    done
}

# pgbench with per-transaction logs: pgbench_logged db name seconds args...
# The logs are $LOGS/name.*; prints pgbench's tps.
pgbench_logged() {
    local db=$1 name=$2 secs=$3 out; shift 3
    out=$(as_postgres "$bindir/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$secs" \
        -D keys="$KEYS" -l --log-prefix="$LOGS/$name" "$@" "$db" 2>&1) \
        || { echo "$out" >&2; return 1; }
    echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}

# Transactions of $LOGS/name.* that ended between from and to (epoch seconds):
# prints "count p50_ms p99_ms".
lat_stats() {
    local name=$1 from=${2:-0} to=${3:-1e12}
    cat "$LOGS/$name".* | awk -v f="$from" -v t="$to" '{ e = $5 + $6 / 1e6; if (e >= f && e <= t) print $3 }' |
        sort -n | awk '
        function pct(p,   i) { i = int(NR * p); if (i < NR * p) i++; if (i < 1) i = 1; return v[i] / 1000 }
        { v[NR] = $1 }
        END { if (NR == 0) { print "0 0 0"; exit } printf "%d %.3f %.3f\n", NR, pct(0.5), pct(0.99) }'
}

# The CPU time, in clock ticks, the server has used so far: the postmaster,
# its live children and (cutime, cstime) the children it has reaped, such
# as the backends of a pgbench run that ended.  Unlike tps, it does not
# depend on what else the machine runs.
server_ticks() {
    local pm
    pm=$(head -1 "$IDEM_TMP/data/postmaster.pid")
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v pm="$pm" '
        { pid = $1; sub(/^.*\) /, "") }
        pid == pm { t += $12 + $13 + $14 + $15 }
        $2 == pm { t += $12 + $13 }
        END { print t }'
}

# Wait until the postmaster has no more children than n: a run's backends
# have exited and been reaped, so that their time is in server_ticks.
wait_children() {
    local i
    for i in $(seq 1 100); do
        [ "$(children "${2:-}")" -le "$1" ] && return 0
        sleep 0.05
    done
}
children() {
    local pm
    pm=$(head -1 "${1:-$IDEM_TMP/data}/postmaster.pid")
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v pm="$pm" '{ sub(/^.*\) /, "") } $2 == pm' | wc -l
}

needs_bench_db() {
    as_postgres "$bindir/createdb" bench
    psql_bench -c "CREATE EXTENSION idempotency"
    psql_bench -f "$IDEM_TMP/src/bench/baselines.sql"
    log "loading $KEYS finished and $KEYS running keys into each table"
    psql_bench -v keys="$KEYS" -f "$IDEM_TMP/src/bench/load.sql"
}

# In simple mode pgbench pastes a variable's value into the statement's
# text: the token (text) needs quotes there, and only there.  The workloads
# for -M simple are written to $IDEM_TMP/simple; workload_dir p prints the
# folder for protocol p.
make_simple_workloads() {
    local f
    as_postgres mkdir -p "$IDEM_TMP/simple"
    for f in "$W"/*.sql; do
        sed "s/(:token,/(':token',/" "$f" | as_postgres tee "$IDEM_TMP/simple/${f##*/}" >/dev/null
    done
}
workload_dir() { if [ "$1" = simple ]; then echo "$IDEM_TMP/simple"; else echo "$W"; fi; }

# --- tps: the extension against the floors and the peer, three protocols -----
# Every variant runs in each of PROTOCOLS (pgbench -M simple: text
# interpolated, parsed and planned every call, as psycopg2 sends it;
# extended: unnamed statements, parsed every call, as node-postgres and
# psycopg 3 send them; prepared: named statements, as pgx and JDBC after
# five executions).  A round runs every variant of every protocol one
# after the other; results are "protocol:variant<TAB>tps".
part_tps() {
    local results=$IDEM_TMP/results.tsv cpu_results=$IDEM_TMP/cpu.tsv
    local round w v p tps opts dir out tx ticks kids cpu
    : >"$results"; : >"$cpu_results"
    # Each round ends with VACUUM ANALYZE: an autovacuum started by one
    # variant's writes must not run during (and count against) another's.
    psql_bench -c "ALTER SYSTEM SET autovacuum = off" -c "SELECT pg_reload_conf()" >/dev/null
    make_simple_workloads
    variants_of() {
        case $1 in
            new) echo "new_floor_hot new_floor new_peer new_ext new_ext_text" ;;
            replay) echo "replay_floor replay_floor_hash replay_peer replay_ext replay_ext_text" ;;
            replay300) echo "replay_floor_hash_300 replay_ext_300 replay_ext_text_300" ;;
            inprogress) echo "inprogress_peer inprogress_ext" ;;
        esac
    }
    for round in $(seq 1 "$ROUNDS"); do
        log "tps: round $round of $ROUNDS"
        for w in $WORKLOADS; do
            for p in $PROTOCOLS; do
                for v in $(variants_of "$w") $([ "$w" = new ] && [ "$p" = prepared ] && echo new_ext_sync); do
                    # TPS_VARIANTS, when set, names the only variants run
                    case " ${TPS_VARIANTS:-$v} " in *" $v "*) ;; *) continue ;; esac
                    # new_ext_sync: the extension with idempotency.synchronous_outcomes
                    # on, its default; every other variant commits asynchronously.
                    opts=""
                    [ "$v" = new_ext_sync ] && opts="-c idempotency.synchronous_outcomes=on"
                    dir=$(workload_dir "$p")
                    kids=$(children); ticks=$(server_ticks)
                    out=$(as_postgres env PGOPTIONS="$opts" "$bindir/pgbench" -n -M "$p" -c "$CLIENTS" -j 2 \
                        -T "$RUN_SECONDS" -D keys="$KEYS" -f "$dir/${v%_sync}.sql" bench 2>&1)
                    wait_children "$kids"
                    ticks=$(( $(server_ticks) - ticks ))
                    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
                    tx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
                    [ -n "$tps" ] && [ -n "$tx" ] || { log "pgbench failed for $v ($p)"; return 1; }
                    # the server's CPU time per transaction, in microseconds
                    cpu=$(awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" -v n="$tx" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
                    printf '%s:%s\t%s\n' "$p" "$v" "$tps" >>"$results"
                    printf '%s:%s\t%s\n' "$p" "$v" "$cpu" >>"$cpu_results"
                    printf '  %-9s %-18s %10.0f tps %8.1f µs server CPU per transaction\n' "$p" "$v" "$tps" "$cpu" >&2
                done
            done
        done
        psql_bench -c "VACUUM ANALYZE"
    done
    psql_bench -c "ALTER SYSTEM RESET autovacuum" -c "SELECT pg_reload_conf()" >/dev/null
    {
        echo "### Throughput: the extension against the floors and the PL/pgSQL peer, three protocols"
        echo
        echo "Median tps of $ROUNDS alternating rounds, $CLIENTS clients, ${RUN_SECONDS}s per run, a request that differs per call."
        echo
        echo "| protocol | workload | extension | HOT floor | floor (same indexes) | bare SELECT | SELECT + sha256 | peer |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            for w in $WORKLOADS; do
                case $w in
                    new) printf '| %s | new keys | %s | %s | %s | - | - | %s |\n' "$p" \
                            "$(tps_or_dash "$p:new_ext")" "$(tps_or_dash "$p:new_floor_hot")" \
                            "$(tps_or_dash "$p:new_floor")" "$(tps_or_dash "$p:new_peer")" ;;
                    replay) printf '| %s | replays | %s | - | - | %s | %s | %s |\n' "$p" \
                            "$(tps_or_dash "$p:replay_ext")" "$(tps_or_dash "$p:replay_floor")" \
                            "$(tps_or_dash "$p:replay_floor_hash")" "$(tps_or_dash "$p:replay_peer")" ;;
                    inprogress) printf '| %s | in progress | %s | - | - | - | - | %s |\n' "$p" \
                            "$(tps_or_dash "$p:inprogress_ext")" "$(tps_or_dash "$p:inprogress_peer")" ;;
                esac
            done
        done
        echo
        echo "Medians over the rounds of the ratio measured within each round (extension / baseline):"
        echo
        echo "| protocol | new keys / peer (≥ 1.1) | new keys / HOT floor (≥ 1.0) | new keys / floor | replays / bare SELECT (≥ 1.0) | replays / SELECT + sha256 (≥ 0.9) | replays / peer | in progress / peer |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$p" \
                "$(rr "$p:new_ext" "$p:new_peer")" "$(rr "$p:new_ext" "$p:new_floor_hot")" \
                "$(rr "$p:new_ext" "$p:new_floor")" "$(rr "$p:replay_ext" "$p:replay_floor")" \
                "$(rr "$p:replay_ext" "$p:replay_floor_hash")" "$(rr "$p:replay_ext" "$p:replay_peer")" \
                "$(rr "$p:inprogress_ext" "$p:inprogress_peer")"
        done
        echo
        echo "The server's CPU time (user + system, every server process) per transaction, in µs, median of the rounds;"
        echo "steadier than tps on a shared machine. Ratios are baseline / extension, medians of the rounds' ratios:"
        echo "above 1 the extension uses less CPU than the baseline."
        echo
        echo "| protocol | new keys: extension | HOT floor | floor | peer | replays: extension | bare SELECT | SELECT + sha256 | peer | new keys vs peer | vs HOT floor | replays vs bare SELECT | vs SELECT + sha256 |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            (
                results=$cpu_results
                c() { if has_variant "$1"; then tps_of "$1" | awk '{ printf "%.0f", $1 }'; else echo -; fi; }
                printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$p" \
                    "$(c "$p:new_ext")" "$(c "$p:new_floor_hot")" "$(c "$p:new_floor")" "$(c "$p:new_peer")" \
                    "$(c "$p:replay_ext")" "$(c "$p:replay_floor")" "$(c "$p:replay_floor_hash")" "$(c "$p:replay_peer")" \
                    "$(rr "$p:new_peer" "$p:new_ext")" "$(rr "$p:new_floor_hot" "$p:new_ext")" \
                    "$(rr "$p:replay_floor" "$p:replay_ext")" "$(rr "$p:replay_floor_hash" "$p:replay_ext")"
            )
        done
        echo
        if has_variant "${PROTOCOLS%% *}:replay_ext_text" || has_variant "${PROTOCOLS%% *}:new_ext_text" \
            || has_variant "${PROTOCOLS%% *}:replay_ext_text_300"; then
            echo "idem_claim_text (the request as JSON text, four arguments) beside idem_claim; replays of the"
            echo "request of about 300 bytes (workload replay300) beside the SELECT with sha256 of the same text."
            echo "Median tps, and medians of the rounds' ratios:"
            echo
            echo "| protocol | replays: idem_claim_text | / SELECT + sha256 | / idem_claim | 300 B: idem_claim_text | idem_claim | SELECT + sha256 | idem_claim_text / SELECT + sha256 | new keys: idem_claim_text | / idem_claim |"
            echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            for p in $PROTOCOLS; do
                printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$p" \
                    "$(tps_or_dash "$p:replay_ext_text")" "$(rr "$p:replay_ext_text" "$p:replay_floor_hash")" \
                    "$(rr "$p:replay_ext_text" "$p:replay_ext")" \
                    "$(tps_or_dash "$p:replay_ext_text_300")" "$(tps_or_dash "$p:replay_ext_300")" \
                    "$(tps_or_dash "$p:replay_floor_hash_300")" \
                    "$(rr "$p:replay_ext_text_300" "$p:replay_floor_hash_300")" \
                    "$(tps_or_dash "$p:new_ext_text")" "$(rr "$p:new_ext_text" "$p:new_ext")"
            done
            echo
        fi
        if has_variant prepared:new_ext_sync; then
            echo "Every variant commits asynchronously (synchronous_commit = off, idempotency.synchronous_outcomes = off)."
            echo "With idempotency.synchronous_outcomes on, its default, every new key's transaction waits for its WAL"
            echo "flush: $(tps_of prepared:new_ext_sync | awk '{ printf "%.0f", $1 }') tps (prepared), $(round_ratio prepared:new_ext_sync prepared:new_ext) × the"
            echo "asynchronous extension (median of the rounds' ratios; fsync = off here, so a real disk's flush costs more)."
            echo
        fi
    } | out
}
# The median tps of a variant, rounded, or "-" when it did not run
# (TPS_VARIANTS).
tps_or_dash() { if has_variant "$1"; then tps_of "$1" | awk '{ printf "%.0f", $1 }'; else echo -; fi; }
# The median of the rounds' ratio a/b, or "-" when either did not run.
rr() { if has_variant "$1" && has_variant "$2"; then round_ratio "$1" "$2"; else echo -; fi; }

# --- instructions: the tps part's variants, counted in instructions ----------
# The instructions the backend of one pgbench client executes for n
# transactions of a workload in database db (bench, or bench_sql of the
# second cluster): the largest count among the cluster's processes that
# ended meanwhile, the client's backend.
instructions_of() {
    local p=$1 file=$2 n=$3 db=${4:-bench} before f best=0 v i data=$IDEM_TMP/data
    [ "$db" = bench ] || data=$IDEM_TMP/data-sql
    before=$(ls "$IDEM_TMP/cg")
    as_postgres "$bindir/pgbench" -n -M "$p" -c 1 -t "$n" -D keys="$KEYS" -f "$file" "$db" >/dev/null 2>&1 \
        || { log "pgbench failed for $file ($p)"; return 1; }
    # callgrind writes its file as the backend exits, its totals last: wait
    # (at most a minute, on a busy machine) until the new files all have
    # them and no other has come for a second
    local files= last=
    for i in $(seq 1 60); do
        files=$(comm -13 <(echo "$before") <(ls "$IDEM_TMP/cg"))
        if [ -n "$files" ] && [ "$files" = "$last" ] \
            && [ -z "$(cd "$IDEM_TMP/cg" && grep -LE '^(summary|totals):' $files)" ]; then
            break
        fi
        last=$files
        sleep 1
    done
    # (only the processes of the cluster measured: the other's may end
    # meanwhile)
    for f in $files; do
        grep -qx "cmd:  .* -D $data" "$IDEM_TMP/cg/$f" || continue
        v=$(awk '/^(summary|totals):/ { print $2; exit }' "$IDEM_TMP/cg/$f")
        [ "${v:-0}" -le "$best" ] || best=$v
    done
    echo "$best"
}
part_instructions() {
    local results=$IDEM_TMP/instructions.tsv p v dir a b
    : >"$results"
    make_simple_workloads
    for p in $PROTOCOLS; do
        dir=$(workload_dir "$p")
        for v in $INSTR_VARIANTS; do
            a=$(instructions_of "$p" "$dir/$v.sql" 100)
            b=$(instructions_of "$p" "$dir/$v.sql" $((INSTR_TX + 100)))
            printf '%s:%s\t%s\n' "$p" "$v" $(( (b - a) / INSTR_TX )) >>"$results"
            printf '  %-9s %-18s %10d instructions per transaction\n' "$p" "$v" $(( (b - a) / INSTR_TX )) >&2
        done
    done
    {
        echo "### Instructions per transaction (callgrind, one client)"
        echo
        echo "The server's backend, $INSTR_TX transactions of each variant (a request that differs per call); fewer is better."
        echo
        echo "| protocol | new keys: extension | HOT floor | floor (same indexes) | peer | replays: extension | bare SELECT | SELECT + sha256 | peer | in progress: extension | peer |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            printf '| %s |' "$p"
            for v in new_ext new_floor_hot new_floor new_peer replay_ext replay_floor replay_floor_hash replay_peer \
                     inprogress_ext inprogress_peer; do
                printf ' %s |' "$(awk -F'\t' -v v="$p:$v" '$1 == v { printf "%.0f", $2 }' "$results")"
            done
            echo
        done
        echo
        echo "idem_claim_text (the request as JSON text, four arguments) beside idem_claim, and replays of a request"
        echo "of about 300 bytes; in brackets the SELECT with sha256's count / the extension's (above 1: fewer):"
        echo
        echo "| protocol | replays: idem_claim | idem_claim_text | SELECT + sha256 | 300 B: idem_claim | idem_claim_text | SELECT + sha256 | new keys: idem_claim | idem_claim_text |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            awk -F'\t' -v p="$p" '{ split($1, k, ":"); if (k[1] == p) n[k[2]] = $2 }
                function c(v) { return (v in n) ? sprintf("%.0f", n[v]) : "" }
                function r(v, b) { return (v in n && b in n) ? sprintf("%.0f (%.2f)", n[v], n[b] / n[v]) : c(v) }
                END { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p,
                      r("replay_ext", "replay_floor_hash"), r("replay_ext_text", "replay_floor_hash"),
                      c("replay_floor_hash"), r("replay_ext_300", "replay_floor_hash_300"),
                      r("replay_ext_text_300", "replay_floor_hash_300"), c("replay_floor_hash_300"),
                      c("new_ext"), c("new_ext_text") }' "$results"
        done
        echo
    } | out
}

# INSTR_EDITIONS=1: the editions side by side in instructions, prepared
# protocol: the C extension and the PL/pgSQL peer in bench, the SQL edition
# in bench_sql of a second cluster without our library (start_sql_cluster),
# its server under callgrind too.
part_editions_instructions() {
    local results=$IDEM_TMP/editions_instructions.tsv v ed w db a b
    : >"$results"
    start_sql_cluster
    PGPORT=$SQL_PORT as_postgres "$bindir/createdb" bench_sql
    psql_sql -f "$IDEM_TMP/src/sql_edition/idempotency_sql.sql" >/dev/null
    psql_sql -f "$IDEM_TMP/src/bench/baselines.sql"
    psql_sql -v keys="$KEYS" -f "$IDEM_TMP/src/bench/load.sql"
    psql_sql -c "VACUUM ANALYZE" >/dev/null
    for v in c:new_ext_300 sql:new_ext_300 peer:new_peer_300 \
             c:replay_ext_300 sql:replay_ext_300 peer:replay_peer_300; do
        ed=${v%%:*} w=${v#*:}
        if [ "$ed" = sql ]; then
            a=$(PGPORT=$SQL_PORT instructions_of prepared "$W/$w.sql" 100 bench_sql)
            b=$(PGPORT=$SQL_PORT instructions_of prepared "$W/$w.sql" $((INSTR_TX + 100)) bench_sql)
        else
            a=$(instructions_of prepared "$W/$w.sql" 100)
            b=$(instructions_of prepared "$W/$w.sql" $((INSTR_TX + 100)))
        fi
        printf '%s\t%s\n' "$v" $(( (b - a) / INSTR_TX )) >>"$results"
        printf '  %-22s %10d instructions per transaction\n' "$v" $(( (b - a) / INSTR_TX )) >&2
    done
    {
        echo "### The editions in instructions (callgrind, one client, prepared)"
        echo
        echo "The server's backend, $INSTR_TX transactions of a request of about 300 bytes that differs per call; the SQL edition in a"
        echo "cluster that loads no library of ours. Fewer is better."
        echo
        echo "| workload | C extension | SQL edition | PL/pgSQL peer |"
        echo "| --- | ---: | ---: | ---: |"
        for w in new replay; do
            awk -F'\t' -v w="$w" '{ n[$1] = $2 }
                END { printf "| %s | %s | %s | %s |\n", (w == "new" ? "new key" : "replay"),
                      n["c:" w "_ext_300"], n["sql:" w "_ext_300"], n["peer:" w "_peer_300"] }' "$results"
        done
        echo
    } | out
}

# --- profile: where a transaction's time goes, side by side -------------------
# The user and system clock ticks the processes pids... have used so far.
pid_ticks() {
    local pid
    for pid in "$@"; do cat "/proc/$pid/stat" 2>/dev/null || true; done |
        awk '{ sub(/^.*\) /, ""); u += $12; s += $13 } END { print u + 0, s + 0 }'
}
# Each of PROFILE_VARIANTS in each of PROTOCOLS, ROUNDS alternating rounds:
# from a second into a pgbench run to a second before its end, the CPU time of
# its backends (user and system) and of the server's other processes per
# transaction, and what the backends were doing, sampled every 20 ms from
# pg_stat_activity by a session of its own.  It says where the time goes
# that an instruction count does not show: the kernel, waits on locks and
# buffers, waits for the client.
part_profile() {
    local results=$IDEM_TMP/profile.tsv round p v dir pb sampler
    local launched window pids aux client i t0 t1 u0 s0 u1 s1 a0 as0 a1 as1 c0 cs0 c1 cs1 tx hz
    hz=$(getconf CLK_TCK)
    : >"$results"
    make_simple_workloads
    psql_bench -c "ALTER SYSTEM SET autovacuum = off" -c "SELECT pg_reload_conf()" >/dev/null
    psql_bench -c "CREATE TABLE bench_waits (run text, event text, n bigint)"
    for round in $(seq 1 "$ROUNDS"); do
        log "profile: round $round of $ROUNDS"
        for p in $PROTOCOLS; do
            dir=$(workload_dir "$p")
            for v in $PROFILE_VARIANTS; do
                as_postgres rm -f "$LOGS"/profile.*
                launched=$(now)
                as_postgres "$bindir/pgbench" -n -M "$p" -c "$CLIENTS" -j 2 -T "$RUN_SECONDS" -D keys="$KEYS" \
                    -l --log-prefix="$LOGS/profile" -f "$dir/$v.sql" bench >"$IDEM_TMP/profile.out" 2>&1 &
                pb=$!
                # pgbench opens and closes a connection of its own before its
                # clients connect: the measure starts a second into the run
                # (or later: starting psql on a busy machine takes a while)
                # and ends a second before pgbench does.
                sleep 1
                pids=$(sql_value bench "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity
                    WHERE application_name = 'pgbench' HAVING count(*) = $CLIENTS")
                client=$(pgrep -d ' ' -u postgres -x pgbench || true)
                [ -n "$pids" ] && [ -n "$client" ] || { wait "$pb" || true; log "profile: pgbench or its $CLIENTS backends not found ($v, $p)"; return 1; }
                aux=$(sql_value bench "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity
                    WHERE backend_type <> 'client backend'")
                as_postgres env PGAPPNAME=bench_profile "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d bench -c "DO \$\$
                    BEGIN
                        CREATE TEMP TABLE samples (event text);
                        FOR i IN 1..$((RUN_SECONDS * 50)) LOOP
                            PERFORM pg_stat_clear_snapshot();
                            INSERT INTO samples
                                SELECT coalesce(wait_event_type || ':' || wait_event, 'running')
                                  FROM pg_stat_activity WHERE application_name = 'pgbench';
                            EXIT WHEN NOT FOUND;    -- pgbench has ended
                            PERFORM pg_sleep(0.02);
                        END LOOP;
                        INSERT INTO bench_waits SELECT '$p:$v', event, count(*) FROM samples GROUP BY event;
                    END \$\$" &
                sampler=$!
                read -r u0 s0 < <(pid_ticks $pids); read -r a0 as0 < <(pid_ticks $aux)
                read -r c0 cs0 < <(pid_ticks $client); t0=$(now)
                window=$(awk -v l="$launched" -v t="$t0" -v r="$RUN_SECONDS" 'BEGIN { printf "%.2f", l + r - 1 - t }')
                awk -v w="$window" 'BEGIN { exit !(w >= 1) }' \
                    || { wait "$pb" "$sampler" || true; log "profile: less than a second left to measure ($v, $p): raise RUN_SECONDS"; return 1; }
                sleep "$window"
                read -r u1 s1 < <(pid_ticks $pids); read -r a1 as1 < <(pid_ticks $aux)
                read -r c1 cs1 < <(pid_ticks $client); t1=$(now)
                wait "$sampler"
                wait "$pb" || { cat "$IDEM_TMP/profile.out" >&2; log "pgbench failed for $v ($p)"; return 1; }
                tx=$(lat_stats profile "$t0" "$t1" | awk '{ print $1 }')
                [ "$tx" -gt 0 ] || { log "profile: no transaction measured ($v, $p)"; return 1; }
                awk -v r="$p:$v" -v n="$tx" -v dt="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" -v hz="$hz" \
                    -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v a=$((a1 - a0 + as1 - as0)) -v c=$((c1 - c0 + cs1 - cs0)) \
                    -v cores="$(nproc)" \
                    'BEGIN { f = 1e6 / hz / n
                             printf "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\n", r, n / dt, u * f, s * f, a * f, c * f,
                                 cores * dt * 1e6 / n }' \
                    | tee -a "$results" | awk -F'\t' '{ printf "  %-24s %6.0f tps, µs per transaction: backend user %5.1f, system %5.1f, other processes %4.1f, pgbench %5.1f, machine %5.1f\n", $1, $2, $3, $4, $5, $6, $7 }' >&2
            done
        done
        psql_bench -c "VACUUM ANALYZE"
    done
    psql_bench -c "ALTER SYSTEM RESET autovacuum" -c "SELECT pg_reload_conf()" >/dev/null
    {
        echo "### Profile: where a transaction's time goes"
        echo
        echo "$CLIENTS clients, $ROUNDS alternating rounds of ${RUN_SECONDS}s, each measured from its first second (or later) to its last;"
        echo "medians of the rounds. CPU time in µs per transaction from /proc: the backends of pgbench (user, system),"
        echo "the server's other processes (WAL writer, checkpointer, background writer, the worker), pgbench itself;"
        echo "\"machine\" is all the CPU there was: $(nproc) cores × the time / the transactions."
        echo
        echo "| run | tps | backend user µs | backend system µs | other processes µs | pgbench µs | machine µs |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            for v in $PROFILE_VARIANTS; do
                printf '| %s |' "$p:$v"
                for i in 2 3 4 5 6 7; do
                    awk -F'\t' -v r="$p:$v" -v i=$i '$1 == r { print $i }' "$results" | median |
                        awk -v i=$i '{ printf (i == 2 ? " %.0f |" : " %.1f |"), $1 }'
                done
                echo
            done
        done
        echo
        echo "What the backends were doing, share of the samples (every 20 ms, all rounds): \"running\" is on a CPU or"
        echo "waiting for one; Client:ClientRead is waiting for the client's next message. Events under 0.5% are left out."
        echo
        echo "| run | event | share |"
        echo "| --- | --- | ---: |"
        sql_value bench "SELECT format('| %s | %s | %s%% |', run, event, round(100.0 * n / total, 1))
            FROM (SELECT run, event, sum(n) AS n, sum(sum(n)) OVER (PARTITION BY run) AS total
                    FROM bench_waits GROUP BY run, event) w
           WHERE n >= 0.005 * total ORDER BY run, n DESC"
        echo
    } | out
    psql_bench -c "DROP TABLE bench_waits"
}

# --- cleanup: claim latency while the worker drains a backlog ------------------
part_cleanup() {
    local round t0 t1 d0 d drained base with line progress elapsed n
    local base_stats with_stats len tps_b tps_w
    local res=$IDEM_TMP/cleanup.tsv
    : >"$res"
    local setting
    for setting in $WORKER_SETTINGS; do
        worker_setting "${setting%%=*}" "${setting#*=}"
    done
    for round in $(seq 1 "$CLEANUP_ROUNDS"); do
        # Without a backlog: the worker runs its (empty) cycles every NAPTIME.
        log "cleanup: round $round of $CLEANUP_ROUNDS, without a backlog (${CLEANUP_SECONDS}s)"
        worker_setting naptime "$NAPTIME"
        psql_bench -c "VACUUM ANALYZE idem_records" -c CHECKPOINT
        t0=$(now)
        pgbench_logged bench "base$round" "$CLEANUP_SECONDS" -f "$W/new_ext.sql" >/dev/null

        # With: BACKLOG expired records, which the worker starts deleting
        # when pgbench starts.
        worker_setting naptime 1h
        log "cleanup: loading $BACKLOG expired records"
        load_records bench "$BACKLOG" expired
        psql_bench -c "VACUUM ANALYZE idem_records" -c CHECKPOINT
        d0=$(sql_value bench "SELECT rows_deleted FROM idem_worker_status() WHERE database = 'bench'")
        log "cleanup: round $round, draining the backlog while claims run (${CLEANUP_SECONDS}s)"
        progress=$IDEM_TMP/drain$round.txt
        : >"$progress"
        as_postgres "$bindir/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$CLEANUP_SECONDS" \
            -l --log-prefix="$LOGS/with$round" -f "$W/new_ext.sql" bench >"$IDEM_TMP/with$round.out" 2>&1 &
        local pg=$!
        t1=$(now)
        worker_setting naptime "$NAPTIME"
        drained=""
        while kill -0 "$pg" 2>/dev/null; do
            d=$(sql_value bench "SELECT rows_deleted FROM idem_worker_status() WHERE database = 'bench'")
            elapsed=$(awk -v a="$(now)" -v b="$t1" 'BEGIN { printf "%.1f", a - b }')
            echo "$elapsed $((d - d0))" >>"$progress"
            if [ -z "$drained" ] && [ $((d - d0)) -ge "$BACKLOG" ]; then
                drained=$elapsed
                log "cleanup: backlog drained after ${drained}s"
            fi
            sleep 0.5
        done
        wait "$pg" || { cat "$IDEM_TMP/with$round.out" >&2; return 1; }
        n=$(sql_value bench "SELECT count(*) FROM idem_records WHERE key LIKE '%-expired%'")
        # What the worker did not get to in the window must not meet the
        # next round's backlog (same keys) or run during its baseline.
        worker_setting naptime 1h
        [ "$n" -eq 0 ] || psql_bench -c "DELETE FROM idem_records WHERE key LIKE '%-expired%'" >/dev/null
        # Compare the drain window with the same length of the run without.
        len=${drained:-$CLEANUP_SECONDS}
        base_stats=$(lat_stats "base$round" "$t0" "$(awk -v a="$t0" -v l="$len" 'BEGIN { printf "%.3f", a + l }')")
        with_stats=$(lat_stats "with$round" "$t1" "$(awk -v a="$t1" -v l="$len" 'BEGIN { printf "%.3f", a + l }')")
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$len" "${drained:-not drained}" "$base_stats" "$with_stats" "$n" >>"$res"
        log "cleanup: round $round: without $base_stats, with $with_stats (count p50 p99), $n left"
        cp "$progress" "$IDEM_TMP/progress_last.txt"
        worker_setting naptime 1h
    done
    {
        echo "### Claims while the worker drains a backlog of $BACKLOG expired records"
        echo
        echo "| round | drain time (s) | records left | claims/s without | claims/s during | p50 without (ms) | p50 during (ms) | p99 without (ms) | p99 during (ms) | p99 during / without |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        awk -F'\t' '{
            split($4, b, " "); split($5, w, " ")
            printf "| %s | %s | %s | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                $1, $3, $6, b[1] / $2, w[1] / $2, b[2], w[2], b[3], w[3], w[3] / b[3]
        }' "$res"
        local m50b m50w m99b m99w
        m50b=$(awk -F'\t' '{ split($4, b, " "); print b[2] }' "$res" | median)
        m50w=$(awk -F'\t' '{ split($5, b, " "); print b[2] }' "$res" | median)
        m99b=$(awk -F'\t' '{ split($4, b, " "); print b[3] }' "$res" | median)
        m99w=$(awk -F'\t' '{ split($5, b, " "); print b[3] }' "$res" | median)
        printf '| median | %s | | | | %.2f | %.2f | %.2f | %.2f | %s |\n' \
            "$(cut -f2 "$res" | median)" "$m50b" "$m50w" "$m99b" "$m99w" \
            "$(awk -F'\t' '{ split($4, b, " "); split($5, w, " "); printf "%.2f\n", w[3] / b[3] }' "$res" | median)"
        echo
        echo "New-key claim+complete transactions (bench/workloads/new_ext.sql), $CLIENTS clients; the worker"
        echo "with idempotency.naptime = $NAPTIME and the default batch settings in both runs; latencies over"
        echo "the drain window (the same length from the start of the run without a backlog)."
        echo "Drain progress of the last round (seconds since pgbench started, records deleted):"
        echo
        echo '```'
        awk 'NR % 4 == 1' "$IDEM_TMP/progress_last.txt" | tr '\n' ';' | sed 's/;$//; s/;/; /g'
        echo
        echo '```'
        echo
    } | out
    psql_bench -c "VACUUM ANALYZE idem_records"
}

# --- size: claim latency with 10k, 1M, 10M records -----------------------------
part_size() {
    local n db t0 round order tps stats res=$IDEM_TMP/size.tsv
    : >"$res"
    for n in $SIZES; do
        db=size_$n
        t0=$(date +%s)
        as_postgres "$bindir/createdb" "$db"
        psql_db "$db" -c "CREATE EXTENSION idempotency" \
            -c "CREATE TABLE payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, amount numeric NOT NULL, currency text NOT NULL)"
        log "size: loading $n records into $db"
        load_records "$db" "$n" live
        psql_db "$db" -c "VACUUM ANALYZE idem_records" -c CHECKPOINT
        log "size: $db loaded in $(( $(date +%s) - t0 ))s"
        printf '%s load %s\n' "$n" "$(( $(date +%s) - t0 ))" >>"$IDEM_TMP/size_load.txt"
    done
    for round in $(seq 1 "$SIZE_ROUNDS"); do
        order=$SIZES
        [ $((round % 2)) -eq 1 ] || order=$(echo "$SIZES" | tr ' ' '\n' | tac | tr '\n' ' ')
        for n in $order; do
            tps=$(pgbench_logged "size_$n" "size_${n}_$round" "$SIZE_SECONDS" -f "$W/new_ext.sql")
            stats=$(lat_stats "size_${n}_$round")
            printf '%s\t%s\t%s\n' "$n" "$tps" "$stats" >>"$res"
            log "size: round $round, $n records: $tps tps, $stats (count p50 p99)"
        done
    done
    {
        echo "### New-key claim+complete latency against the size of idem_records"
        echo
        echo "| records before | records after | table + indexes | load time (s) | tps | p50 (ms) | p99 (ms) | p50 / first | p99 / first |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        local first50="" first99="" tps50 p50 p99 after sz lt
        for n in $SIZES; do
            tps50=$(awk -F'\t' -v n="$n" '$1 == n { print $2 }' "$res" | median)
            p50=$(awk -F'\t' -v n="$n" '$1 == n { split($3, s, " "); print s[2] }' "$res" | median)
            p99=$(awk -F'\t' -v n="$n" '$1 == n { split($3, s, " "); print s[3] }' "$res" | median)
            [ -n "$first50" ] || { first50=$p50; first99=$p99; }
            after=$(sql_value "size_$n" "SELECT count(*) FROM idem_records")
            sz=$(sql_value "size_$n" "SELECT pg_size_pretty(pg_total_relation_size('idem_records'))")
            lt=$(awk -v n="$n" '$1 == n { print $3 }' "$IDEM_TMP/size_load.txt")
            printf '| %s | %s | %s | %s | %.0f | %.2f | %.2f | %s | %s |\n' "$n" "$after" "$sz" "$lt" \
                "$tps50" "$p50" "$p99" "$(ratio "$p50" "$first50")" "$(ratio "$p99" "$first99")"
        done
        echo
        echo "bench/workloads/new_ext.sql in one database per size, $CLIENTS clients, medians of $SIZE_ROUNDS"
        echo "rounds of ${SIZE_SECONDS}s, the sizes alternating; records loaded with COPY (finished, keys spread"
        echo "over the new keys' key space), then VACUUM ANALYZE; shared_buffers = 512MB."
        echo
    } | out
}

# --- memory: backends over a long mixed run ------------------------------------
part_memory() {
    local pg pids pid t0 t off line series=$IDEM_TMP/memory.tsv el rss ctx
    : >"$series"
    log "memory: ${MEM_SECONDS}s of new keys, replays and in-progress answers, sampled every ${MEM_INTERVAL}s"
    as_postgres "$bindir/pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T "$MEM_SECONDS" -D keys="$KEYS" \
        -f "$W/new_ext.sql@1" -f "$W/replay_ext.sql@1" -f "$W/inprogress_ext.sql@1" \
        bench >"$IDEM_TMP/memory.out" 2>&1 &
    pg=$!
    t0=$(now)
    sleep 3
    pids=$(sql_value bench "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' AND datname = 'bench' ORDER BY pid")
    while kill -0 "$pg" 2>/dev/null; do
        el=$(awk -v a="$(now)" -v b="$t0" 'BEGIN { printf "%.0f", a - b }')
        off=$(stat -c %s "$IDEM_TMP/server.log")
        for pid in $pids; do
            sql_value bench "SELECT pg_log_backend_memory_contexts($pid)" >/dev/null || true
        done
        sleep 1
        for pid in $pids; do
            # A backend gone (pgbench ended meanwhile) gives no sample.
            rss=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status" 2>/dev/null) || true
            ctx=$(tail -c +"$((off + 1))" "$IDEM_TMP/server.log" |
                sed -n "s/.*\[$pid\] LOG:  Grand total: \([0-9]*\) bytes.*/\1/p" | tail -1)
            [ -n "$rss" ] && [ -n "$ctx" ] || continue
            printf '%s\t%s\t%s\t%s\n' "$el" "$pid" "$rss" "$ctx" >>"$series"
        done
        # Sleep to the next multiple of MEM_INTERVAL, or until pgbench ends.
        t=$(awk -v a="$(now)" -v b="$t0" -v i="$MEM_INTERVAL" 'BEGIN { printf "%.3f", b + (int((a - b) / i) + 1) * i }')
        while kill -0 "$pg" 2>/dev/null && awk -v a="$(now)" -v t="$t" 'BEGIN { exit !(a < t - 0.5) }'; do
            sleep 0.5
        done
    done
    wait "$pg" || { cat "$IDEM_TMP/memory.out" >&2; return 1; }
    {
        echo "### Backend memory over a ${MEM_SECONDS}s run of claims"
        echo
        echo "RssAnon (kB, /proc/<pid>/status) / memory contexts' grand total (kB, pg_log_backend_memory_contexts) of each pgbench backend:"
        echo
        awk -F'\t' '
            { if (!($2 in seen)) { seen[$2] = 1; order[++np] = $2 }
              if (!($1 in tseen)) { tseen[$1] = 1; times[++nt] = $1 }
              v[$1, $2] = sprintf("%d / %d", $3, $4 / 1024)
              if (!(($2) in first)) { first[$2] = $3; firstc[$2] = $4 }
              last[$2] = $3; lastc[$2] = $4
              if ($3 > max[$2]) max[$2] = $3 }
            END {
                printf "| t (s) |"; for (p = 1; p <= np; p++) printf " backend %d |", p; print ""
                printf "| ---: |"; for (p = 1; p <= np; p++) printf " ---: |"; print ""
                for (i = 1; i <= nt; i++) { printf "| %s |", times[i]; for (p = 1; p <= np; p++) printf " %s |", v[times[i], order[p]]; print "" }
                printf "| growth, first to last |"
                for (p = 1; p <= np; p++) printf " %+d / %+d |", last[order[p]] - first[order[p]], (lastc[order[p]] - firstc[order[p]]) / 1024
                print ""
            }' "$series"
        echo
        echo "$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$IDEM_TMP/memory.out") transactions"\
             "($(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$IDEM_TMP/memory.out" | cut -d. -f1) tps), a third each new keys, replays and in-progress"\
             "answers, $CLIENTS clients."
        echo
    } | out
}

# --- responses: jsonb, raw and encrypted bodies ----------------------------------
# A throwaway key: the benchmark's records are deleted with the cluster.
RESPONSE_KEY=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
part_responses() {
    local results=$IDEM_TMP/responses.tsv body round w v prefix file tps opts
    : >"$results"
    # A 1 KB JSON document, the body every variant stores.
    body=$(python3 -c 'import json; print(json.dumps({"id": "PAY-1", "status": "captured",
        "items": [{"sku": "SKU-%04d" % i, "qty": i, "price": "%d.99" % i} for i in range(22)]}))')
    as_postgres "$bindir/createdb" bench_resp
    psql_db bench_resp -c "CREATE EXTENSION idempotency"
    log "responses: loading $KEYS replayable keys of each kind"
    for v in jsonb raw enc; do
        opts=""
        [ "$v" = enc ] && opts="-c idempotency.encryption_key=$RESPONSE_KEY"
        as_postgres env PGOPTIONS="$opts" "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d bench_resp \
            -v keys="$KEYS" -v body="$body" -v kind="$v" <<'SQL'
SELECT count(*) FROM (
  SELECT CASE WHEN :'kind' = 'jsonb'
              THEN idem_complete(c.token, 201, :'body'::jsonb, '[["Content-Type", "application/json"]]')
              ELSE idem_complete(c.token, 201, headers => '[["Content-Type", "application/json"]]',
                                 raw_body => convert_to(:'body', 'UTF8')) END
    FROM generate_series(1, :keys) g,
         LATERAL idem_claim('responses', :'kind' || '-' || g) c) s;
SQL
    done
    psql_db bench_resp -c "VACUUM ANALYZE"
    for round in $(seq 1 "$ROUNDS"); do
        log "responses: round $round of $ROUNDS"
        for w in replay new; do
            for v in jsonb raw enc; do
                file=$W/resp_${w}_raw.sql
                [ "$v" = jsonb ] && file=$W/resp_${w}_jsonb.sql
                opts=""
                [ "$v" = enc ] && opts="-c idempotency.encryption_key=$RESPONSE_KEY"
                tps=$(as_postgres env PGOPTIONS="$opts" "$bindir/pgbench" -n -M prepared \
                    -c "$CLIENTS" -j 2 -T "$RUN_SECONDS" -D keys="$KEYS" -D prefix="$v" \
                    -D body="$body" -f "$file" bench_resp 2>&1 |
                    sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
                [ -n "$tps" ] || { log "pgbench failed for $w $v"; return 1; }
                printf '%s_%s\t%s\n' "$w" "$v" "$tps" >>"$results"
                printf '  %-16s %10.0f tps\n' "${w}_$v" "$tps" >&2
            done
        done
    done
    {
        echo "### Responses: jsonb, raw bytes, encrypted at rest (1 KB body)"
        echo
        echo "| workload | jsonb tps | raw tps | raw + encryption tps | raw / jsonb | encrypted / jsonb | encrypted / raw |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        for w in replay new; do
            printf '| %s | %.0f | %.0f | %.0f | %s | %s | %s |\n' "$w" \
                "$(tps_of "${w}_jsonb")" "$(tps_of "${w}_raw")" "$(tps_of "${w}_enc")" \
                "$(round_ratio "${w}_raw" "${w}_jsonb")" "$(round_ratio "${w}_enc" "${w}_jsonb")" \
                "$(round_ratio "${w}_enc" "${w}_raw")"
        done
        echo
        echo "Medians of $ROUNDS alternating rounds, $CLIENTS clients, ${RUN_SECONDS}s per run, -M prepared;"
        echo "ratios are the median of the ratio within each round."
        echo
    } | out
}

# --- counters: idem_stat_operations on and off ----------------------------------
# The same workloads of the extension, with idempotency.track_operations on
# (its default: every claim counted, completions at commit) and off (the
# claim path then tests one boolean and counts nothing), in one server, the
# order alternating between rounds so that neither always runs on a warmer
# cache.
part_counters() {
    local results=$IDEM_TMP/counters.tsv round w v tps order
    : >"$results"
    for round in $(seq 1 "$COUNTER_ROUNDS"); do
        log "counters: round $round of $COUNTER_ROUNDS"
        if [ $((round % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
        for w in new replay; do
            for v in $order; do
                tps=$(as_postgres env PGOPTIONS="-c idempotency.track_operations=$v" \
                    "$bindir/pgbench" -n -M prepared -c "$CLIENTS" -j 2 \
                    -T "$RUN_SECONDS" -D keys="$KEYS" -f "$W/${w}_ext.sql" bench 2>&1 |
                    sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
                [ -n "$tps" ] || { log "pgbench failed for $w with counting $v"; return 1; }
                printf '%s\t%s\n' "${w}_$v" "$tps" >>"$results"
                printf '  %-16s %10.0f tps\n' "${w}_$v" "$tps" >&2
            done
        done
        psql_bench -c "VACUUM ANALYZE"
    done
    {
        echo "### Counters: idem_stat_operations on and off"
        echo
        echo "| workload | counting on tps | counting off tps | on / off | median of the rounds' on / off | rounds' on / off |"
        echo "| --- | ---: | ---: | ---: | ---: | --- |"
        for w in new replay; do
            printf '| %s | %.0f | %.0f | %s | %s | %s |\n' "$w" "$(tps_of "${w}_on")" "$(tps_of "${w}_off")" \
                "$(ratio "$(tps_of "${w}_on")" "$(tps_of "${w}_off")")" "$(round_ratio "${w}_on" "${w}_off")" \
                "$(awk -F'\t' -v a="${w}_on" -v b="${w}_off" '$1 == a { x[++na] = $2 } $1 == b { y[++nb] = $2 }
                    END { for (i = 1; i <= na && i <= nb; i++) printf "%s%.3f", (i > 1 ? " " : ""), x[i] / y[i] }' "$results")"
        done
        echo
        echo "idempotency.track_operations on and off in the same server, $COUNTER_ROUNDS rounds alternating the order,"
        echo "$CLIENTS clients, ${RUN_SECONDS}s per run; medians, and the median of the ratio measured within each round."
        echo
    } | out

    # The per-call cost in one backend (bench/counters_percall.sql): the
    # steadier measure on a shared machine.
    local percall=$IDEM_TMP/counters_percall.tsv k on off
    log "counters: per-call cost in one backend ($COUNTER_ROUNDS rounds)"
    psql_bench -v rounds="$COUNTER_ROUNDS" -f "$IDEM_TMP/src/bench/counters_percall.sql" >"$percall"
    {
        echo "Per call in one backend (bench/counters_percall.sql: 20,000 replay claims in one statement, 1,000 new keys"
        echo "claimed and completed in a PL/pgSQL loop, one transaction), µs per call, median of $COUNTER_ROUNDS alternating rounds:"
        echo
        echo "| workload | counting on µs | counting off µs | on - off µs | median of the rounds' on / off |"
        echo "| --- | ---: | ---: | ---: | ---: |"
        for k in replay new; do
            on=$(awk -F'\t' -v k="$k" '$2 == k && $3 == "on" { print $4 }' "$percall" | median)
            off=$(awk -F'\t' -v k="$k" '$2 == k && $3 == "off" { print $4 }' "$percall" | median)
            printf '| %s | %.2f | %.2f | %.2f | %s |\n' "$k" "$on" "$off" \
                "$(awk -v a="$on" -v b="$off" 'BEGIN { print a - b }')" \
                "$(awk -F'\t' -v k="$k" '$2 == k { v[$1 "," $3] = $4; r[$1] = 1 }
                    END { for (i in r) printf "%.4f\n", v[i ",on"] / v[i ",off"] }' "$percall" |
                    median | awk '{ printf "%.3f", $1 }')"
        done
        echo
    } | out
}

# --- editions: the SQL edition beside the C edition and the peer -------------
# The SQL edition runs where it is meant to: in a second cluster of the same
# PostgreSQL, with the same settings, that loads no library of ours (as a
# managed service does not), so that its idempotency.* settings are unset
# placeholders, but for idempotency.synchronous_outcomes, off in both
# clusters, so that neither edition flushes its outcomes' commits when
# synchronous_commit is off.  Its database bench_sql holds the SQL edition,
# installed as its README says, with the same baselines and the same
# records as bench (load.sql).  Results are
# "protocol:edition:workload<TAB>tps"; c and peer run in bench, sql in
# bench_sql, the same workload files.
start_sql_cluster() {
    local conf=$IDEM_TMP/data-sql/postgresql.conf
    SQL_PORT=$(free_port)
    as_postgres "$bindir/initdb" -D "$IDEM_TMP/data-sql" -A trust -U postgres \
        --no-sync -E UTF8 --locale=C >"$IDEM_TMP/initdb-sql.log" 2>&1 \
        || { cat "$IDEM_TMP/initdb-sql.log"; return 1; }
    {
        echo "port = $SQL_PORT"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$IDEM_TMP'"
        echo "fsync = off"
        echo "synchronous_commit = off"
        echo "shared_buffers = '512MB'"
        echo "maintenance_work_mem = '512MB'"
        echo "max_wal_size = '8GB'"
        echo "checkpoint_timeout = '30min'"
        echo "autovacuum = off"
        # as the C edition's cluster: outcomes committed as synchronous_commit says
        echo "idempotency.synchronous_outcomes = off"
    } | as_postgres tee -a "$conf" >/dev/null
    IDEM_STOP_CLUSTERS+=("$bindir/pg_ctl|$IDEM_TMP/data-sql")
    as_postgres env PGCTLTIMEOUT=600 "$bindir/pg_ctl" ${IDEM_POSTGRES:+-p "$IDEM_POSTGRES"} \
        -D "$IDEM_TMP/data-sql" -l "$IDEM_TMP/server-sql.log" -w start >/dev/null \
        || { cat "$IDEM_TMP/server-sql.log"; return 1; }
}
psql_sql() { PGPORT=$SQL_PORT psql_db bench_sql "$@"; }

part_editions() {
    local results=$IDEM_TMP/editions.tsv round p v ed w db port dir out tps
    : >"$results"
    start_sql_cluster
    PGPORT=$SQL_PORT as_postgres "$bindir/createdb" bench_sql
    psql_sql -f "$IDEM_TMP/src/sql_edition/idempotency_sql.sql" >/dev/null
    psql_sql -f "$IDEM_TMP/src/bench/baselines.sql"
    log "loading $KEYS finished and $KEYS running keys into bench_sql"
    psql_sql -v keys="$KEYS" -f "$IDEM_TMP/src/bench/load.sql"
    psql_sql -c "VACUUM ANALYZE" >/dev/null
    psql_bench -c "ALTER SYSTEM SET autovacuum = off" -c "SELECT pg_reload_conf()" >/dev/null
    make_simple_workloads
    for round in $(seq 1 "$ROUNDS"); do
        log "editions: round $round of $ROUNDS"
        for p in $PROTOCOLS; do
            dir=$(workload_dir "$p")
            for v in c:new_ext_300 sql:new_ext_300 peer:new_peer_300 \
                     c:replay_ext_300 sql:replay_ext_300 peer:replay_peer_300; do
                ed=${v%%:*} w=${v#*:}
                db=bench port=$PGPORT
                if [ "$ed" = sql ]; then db=bench_sql port=$SQL_PORT; fi
                out=$(PGPORT=$port as_postgres "$bindir/pgbench" -n -M "$p" -c "$CLIENTS" -j 2 \
                    -T "$RUN_SECONDS" -D keys="$KEYS" -f "$dir/$w.sql" "$db" 2>&1) \
                    || { echo "$out" >&2; log "pgbench failed for $v ($p)"; return 1; }
                tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
                printf '%s:%s\t%s\n' "$p" "$v" "$tps" >>"$results"
                printf '  %-9s %-22s %10.0f tps\n' "$p" "$v" "$tps" >&2
            done
        done
        psql_bench -c "VACUUM ANALYZE"
        psql_sql -c "VACUUM ANALYZE"
    done
    psql_bench -c "ALTER SYSTEM RESET autovacuum" -c "SELECT pg_reload_conf()" >/dev/null

    # Where the SQL edition's time goes: each of its functions' own time
    # (track_functions = all: its own run, as the tracking costs time too),
    # per transaction of each workload, in the prepared protocol.
    local profile=$IDEM_TMP/editions_profile.txt tx lat kids
    : >"$profile"
    psql_sql -c "ALTER DATABASE bench_sql SET track_functions = 'all'" >/dev/null
    for w in new_ext_300 replay_ext_300; do
        psql_sql -c "SELECT pg_stat_reset()" >/dev/null
        kids=$(children "$IDEM_TMP/data-sql")
        out=$(PGPORT=$SQL_PORT as_postgres "$bindir/pgbench" -n -M prepared -c "$CLIENTS" -j 2 \
            -T "$RUN_SECONDS" -D keys="$KEYS" -f "$W/$w.sql" bench_sql 2>&1) \
            || { echo "$out" >&2; return 1; }
        tx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
        lat=$(echo "$out" | sed -n 's/^latency average = \([0-9.]*\) ms/\1/p')
        # the backends report their function counts as they exit
        wait_children "$kids" "$IDEM_TMP/data-sql"
        {
            echo "$w: $tx transactions, $lat ms average latency ($CLIENTS clients)"
            echo
            echo "| function | calls per transaction | own time per transaction (µs) | with what it calls (µs) |"
            echo "| --- | ---: | ---: | ---: |"
            PGPORT=$SQL_PORT sql_value bench_sql "SELECT format('| %s | %s | %s | %s |', funcname,
                                          round(calls::numeric / $tx, 2),
                                          round((self_time * 1000 / $tx)::numeric, 1),
                                          round((total_time * 1000 / $tx)::numeric, 1))
                                   FROM pg_stat_user_functions
                                  WHERE funcname LIKE 'idem%' OR funcname LIKE '%canonical%'
                                  ORDER BY self_time DESC"
            echo
        } >>"$profile"
    done
    psql_sql -c "ALTER DATABASE bench_sql RESET track_functions" >/dev/null
    {
        echo "### The SQL edition beside the C edition and the PL/pgSQL peer"
        echo
        echo "A request of about 300 bytes that differs per call; median tps of $ROUNDS alternating rounds, $CLIENTS clients, ${RUN_SECONDS}s per run;"
        echo "the C edition and the peer in one database of a cluster that preloads the C edition's library, the SQL edition in a"
        echo "database of a second cluster of the same PostgreSQL and settings that loads no library of ours, loaded alike."
        echo
        echo "| protocol | new keys: C | SQL | peer | replays: C | SQL | peer |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$p" \
                "$(tps_or_dash "$p:c:new_ext_300")" "$(tps_or_dash "$p:sql:new_ext_300")" \
                "$(tps_or_dash "$p:peer:new_peer_300")" "$(tps_or_dash "$p:c:replay_ext_300")" \
                "$(tps_or_dash "$p:sql:replay_ext_300")" "$(tps_or_dash "$p:peer:replay_peer_300")"
        done
        echo
        echo "Medians over the rounds of the ratio measured within each round:"
        echo
        echo "| protocol | new keys: SQL / C (≥ 0.75) | SQL / peer (≥ 1.0) | peer / C | replays: SQL / C (≥ 0.5) | SQL / peer (≥ 1.0) | peer / C |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        for p in $PROTOCOLS; do
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$p" \
                "$(rr "$p:sql:new_ext_300" "$p:c:new_ext_300")" "$(rr "$p:sql:new_ext_300" "$p:peer:new_peer_300")" \
                "$(rr "$p:peer:new_peer_300" "$p:c:new_ext_300")" \
                "$(rr "$p:sql:replay_ext_300" "$p:c:replay_ext_300")" "$(rr "$p:sql:replay_ext_300" "$p:peer:replay_peer_300")" \
                "$(rr "$p:peer:replay_peer_300" "$p:c:replay_ext_300")"
        done
        echo
        echo "Where the SQL edition's time goes (prepared protocol, track_functions = all, a run of its own):"
        echo
        cat "$profile"
    } | out
}

if has_part tps || has_part cleanup || has_part memory || has_part counters || has_part instructions \
    || has_part profile || has_part editions; then needs_bench_db; fi
# BENCH_SQL: statements run in the bench database once it is loaded, e.g.
# "ALTER TABLE idem_records ADD CONSTRAINT no_write_once CHECK (true)"
# (a CHECK constraint the extension does not know turns writing a new key
# once off: docs/performance.md)
if [ -n "${BENCH_SQL:-}" ]; then psql_bench -c "$BENCH_SQL"; fi
if has_part instructions; then part_instructions; fi
if has_part instructions && [ -n "${INSTR_EDITIONS:-}" ]; then part_editions_instructions; fi
if has_part tps; then part_tps; fi
if has_part profile; then part_profile; fi
if has_part cleanup; then part_cleanup; fi
if has_part size; then part_size; fi
if has_part memory; then part_memory; fi
if has_part responses; then part_responses; fi
if has_part counters; then part_counters; fi
if has_part editions; then part_editions; fi
if [ -n "$FP_REPORT" ]; then
    { echo "### Fingerprint (bench/fingerprint.sh)"; echo; echo "$FP_REPORT"; echo; } | out
fi
{
    echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/ { print $2 }') GB of memory," \
        "PostgreSQL $("$bindir/postgres" --version | awk '{ print $3 }'), synchronous_commit = off, fsync = off." \
        "Command: bench/run.sh $MODE; took $(( ($(date +%s) - START_TIME) / 60 )) min."
} | out
echo
cat "$REPORT_MD"
if [ -n "${REPORT:-}" ]; then cp "$REPORT_MD" "$REPORT"; fi
