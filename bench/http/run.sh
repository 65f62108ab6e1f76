#!/usr/bin/env bash
# bench/http/run.sh: the payments service measured over HTTP, side by side,
# with no idempotency (BEGIN; INSERT; COMMIT), on the client library, and as
# the hand-written example that the library replaced.
#
#   bench/http/run.sh
#
# One throwaway cluster (scripts/lib.sh), autocannon (npm) as the load, the
# services started one at a time on 127.0.0.1 with a pool of 10 connections:
#
#   node-http     none.js, examples/node/server.js, and the hand-written
#                 example (node:http)
#   node-express  none.js and examples/node/server.js on Express
#   python-asgi   none_service.py and examples/python/payments_service.py on
#                 Starlette and uvicorn (psycopg 3); the hand-written example
#                 (http.server, psycopg2) beside them, on its own framework
#
# The hand-written examples are examples/node/server.js and
# examples/python/payments_service.py as they were before they moved onto
# the libraries: the newest version in the repository's history that does
# not use them (without the history, they are left out).
#
# Each service is measured with new keys (a key per request) and, but for
# "none", with replays (200 keys paid once, then requests cycling through
# them), RUN_SECONDS each after a WARMUP_SECONDS run, CONNECTIONS
# connections, in ROUNDS rounds (the order within a framework reversed every
# other round).  The report gives the median requests per second and p99,
# and the medians of the rounds' ratios to the same framework's "none".
#
# Environment: PG_CONFIG, KEEP_TMP=1 (scripts/lib.sh); ROUNDS 3,
# RUN_SECONDS 10, WARMUP_SECONDS 2, CONNECTIONS 16; REPORT=file (also write
# the report there); VARIANTS, an extended regular expression: only the
# services whose "framework|name" matches it run (VARIANTS='^node-' for
# Node.js's, 'node-http\|(none|library)$' for two).
set -euo pipefail
. "$(dirname "$0")/../../scripts/lib.sh"

ROUNDS=${ROUNDS:-3}
RUN_SECONDS=${RUN_SECONDS:-10}
WARMUP_SECONDS=${WARMUP_SECONDS:-2}
CONNECTIONS=${CONNECTIONS:-16}
HTTP=$IDEM_ROOT/bench/http

trap cleanup EXIT
install_packages
install_client_packages
build_and_install
make_workdir
start_cluster "shared_buffers = 512MB" "max_connections = 200"
bindir=$("$PG_CONFIG" --bindir)
as_postgres "$bindir/createdb" idem_bench
as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d idem_bench -f "$IDEM_TMP/src/examples/schema.sql"
for dir in clients/node examples/node bench/http; do
    if [ ! -d "$IDEM_ROOT/$dir/node_modules" ]; then
        log "npm ci ($dir)"
        (cd "$IDEM_ROOT/$dir" && npm ci --no-audit --no-fund --loglevel=error)
    fi
done
IDEM_GROUPS=$IDEM_TMP/groups
results=$IDEM_TMP/http-results.txt
: >"$results"

# handwritten PATH MARKER OUT: PATH's newest version in git's history that
# does not contain MARKER (the library's name), written to OUT.
handwritten() {
    local commit
    for commit in $(git -C "$IDEM_ROOT" log --format=%H -- "$1" 2>/dev/null); do
        if git -C "$IDEM_ROOT" show "$commit:$1" >"$3" 2>/dev/null && ! grep -q "$2" "$3"; then
            log "hand-written $1: as of $commit"
            return 0
        fi
    done
    log "no hand-written $1 in the history: left out"
    return 1
}

# framework name command...
variants=(
    "node-http|none|node $HTTP/none.js --framework http"
    "node-http|library|node $IDEM_ROOT/examples/node/server.js --framework http --quiet"
    "node-express|none|node $HTTP/none.js --framework express"
    "node-express|library|node $IDEM_ROOT/examples/node/server.js --framework express --quiet"
    "python-asgi|none|/usr/bin/python3 $HTTP/none_service.py --quiet"
    "python-asgi|library|/usr/bin/python3 $IDEM_ROOT/examples/python/payments_service.py --framework asgi --quiet"
)
if handwritten examples/node/server.js @idempotency/pg "$IDEM_TMP/handwritten.js"; then
    variants+=("node-http|handwritten|env NODE_PATH=$HTTP/node_modules node $IDEM_TMP/handwritten.js --quiet")
fi
if handwritten examples/python/payments_service.py idempotency_pg "$IDEM_TMP/handwritten_service.py"; then
    variants+=("python-asgi|handwritten|/usr/bin/python3 $IDEM_TMP/handwritten_service.py --quiet")
fi

if [ -n "${VARIANTS:-}" ]; then
    chosen=()
    for v in "${variants[@]}"; do
        IFS='|' read -r framework name _ <<<"$v"
        if printf '%s|%s\n' "$framework" "$name" | grep -Eq -- "$VARIANTS"; then chosen+=("$v"); fi
    done
    [ ${#chosen[@]} -gt 0 ] || { log "VARIANTS=$VARIANTS matches no service"; exit 1; }
    variants=("${chosen[@]}")
fi

# measure ROUND FRAMEWORK NAME COMMAND: start the service, load it, stop it.
measure() {
    local round=$1 framework=$2 name=$3 command=$4 out=$IDEM_TMP/service.out port mode modes="new"
    [ "$name" = none ] || modes="new replay"
    : >"$out"
    (cd "$IDEM_TMP" && PGHOST=127.0.0.1 PGDATABASE=idem_bench PGUSER=idem_app \
        in_own_group $command --port 0 >"$out" 2>&1 &)
    for _ in $(seq 300); do
        port=$(sed -nE '1s|^listening on http://127\.0\.0\.1:([0-9]+)$|\1|p' "$out")
        [ -n "$port" ] && break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        cat "$out"
        log "$framework $name did not start"
        return 1
    fi
    for mode in $modes; do
        node "$HTTP/load.js" "http://127.0.0.1:$port" "$mode" "$WARMUP_SECONDS" "$CONNECTIONS" >/dev/null
        printf '%s %s %s %s %s\n' "$round" "$framework" "$name" "$mode" \
            "$(node "$HTTP/load.js" "http://127.0.0.1:$port" "$mode" "$RUN_SECONDS" "$CONNECTIONS")" \
            | tee -a "$results"
    done
    stop_groups
}

for round in $(seq "$ROUNDS"); do
    log "round $round of $ROUNDS"
    ordered=("${variants[@]}")
    if [ $((round % 2)) -eq 0 ]; then # reversed every other round
        ordered=()
        for ((i = ${#variants[@]} - 1; i >= 0; i--)); do ordered+=("${variants[$i]}"); done
    fi
    for v in "${ordered[@]}"; do
        IFS='|' read -r framework name command <<<"$v"
        measure "$round" "$framework" "$name" "$command"
    done
    as_postgres "$bindir/psql" -X -q -d idem_bench -c 'VACUUM ANALYZE' >/dev/null
done

report=$(/usr/bin/python3 - "$results" "$ROUNDS" "$RUN_SECONDS" "$CONNECTIONS" <<'EOF'
import json, statistics, sys
from collections import defaultdict
path, rounds, seconds, connections = sys.argv[1:]
runs = defaultdict(dict)  # (framework, name, mode) -> round -> result
for line in open(path):
    rnd, framework, name, mode, data = line.split(" ", 4)
    runs[(framework, name, mode)][int(rnd)] = json.loads(data)
med = statistics.median
print("HTTP, %s rounds of %s s, %s connections; requests per second and p99 (ms) are medians;"
      " ratios are medians of the rounds' ratios to the framework's service with no idempotency"
      " (new keys)." % (rounds, seconds, connections))
print()
print("| framework | service | workload | req/s | p99 ms | × none req/s | × none p99 | non-2xx |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
for (framework, name, mode), by_round in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1] != "none", kv[0][1], kv[0][2])):
    none = runs.get((framework, "none", "new"), {})
    common = [r for r in by_round if r in none]
    ratio = med([by_round[r]["rps"] / none[r]["rps"] for r in common]) if common else float("nan")
    p99 = med([by_round[r]["p99"] / max(none[r]["p99"], 1) for r in common]) if common else float("nan")
    print("| %s | %s | %s | %.0f | %.0f | %.2f | %.2f | %d |" % (
        framework, name, mode, med(x["rps"] for x in by_round.values()), med(x["p99"] for x in by_round.values()),
        ratio, p99, sum(x["non2xx"] + x["errors"] for x in by_round.values())))
EOF
)
echo
echo "$report"
[ -z "${REPORT:-}" ] || echo "$report" >"$REPORT"
