#!/usr/bin/env bash
# scripts/sanitize.sh: build the extension with UndefinedBehaviorSanitizer,
# run the server under valgrind's memcheck, run the pg_regress and isolation
# suites and a short fuzz (scripts/fuzz.sh) against it, and fail on any
# report that involves the extension.
#
#   scripts/sanitize.sh                    # regress + isolation + 60 s of fuzzing
#   SANITIZE_FUZZ_SECONDS=0 scripts/sanitize.sh
#
# UBSan (-fsanitize=undefined) reports signed overflow, bad shifts, out of
# range enum values, null pointers passed where they must not be, and so on,
# in the extension's code.  Valgrind reports reads and writes outside
# malloc'ed blocks and decisions taken on uninitialised memory, in every
# backend (the postmaster forks them under valgrind).  Debian's PostgreSQL
# is not built with USE_VALGRIND, so chunks inside a memory context are not
# checked one by one, and PostgreSQL itself produces reports of its own:
# only reports whose stack goes through idempotency.so fail the run (all of
# them are kept in the folder printed at the end with KEEP_TMP=1).
#
# AddressSanitizer is not used: Debian's postgres binary deadlocks in
# bindtextdomain() at start when libasan is preloaded into it (gcc 12,
# glibc 2.36), and a non-instrumented executable cannot load an
# ASan-instrumented library without that preload.
#
# The sanitized library stays installed afterwards; the next scripts/test.sh
# installs the normal one again.  The TAP suite is not run here.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SANITIZE_FUZZ_SECONDS=${SANITIZE_FUZZ_SECONDS:-60}
SAN_FLAGS="-fsanitize=undefined -fno-sanitize=alignment -fno-sanitize-recover=all -fno-omit-frame-pointer -O1"

trap cleanup EXIT
install_packages
if ! command -v valgrind >/dev/null; then
    log "installing valgrind"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind >/dev/null
fi
make_workdir

# Build in the temporary copy so that the source tree keeps its normal objects.
log "building with $SAN_FLAGS"
as_postgres make -s -C "$IDEM_TMP/src" clean >/dev/null
as_postgres make -s -C "$IDEM_TMP/src" PG_CONFIG="$PG_CONFIG" with_llvm=no \
    COPT="$SAN_FLAGS" >/dev/null
as_root make -s -C "$IDEM_TMP/src" PG_CONFIG="$PG_CONFIG" with_llvm=no install >/dev/null

# The "postgres" pg_ctl starts: the real one under valgrind.
SAN_LOG=$IDEM_TMP/sanitizer
mkdir -p "$SAN_LOG"
IDEM_POSTGRES=$IDEM_TMP/postgres-valgrind
cat >"$IDEM_POSTGRES" <<EOF
#!/bin/sh
exec valgrind --quiet --error-limit=no --num-callers=40 --leak-check=no \\
    --trace-children=no --log-file=$SAN_LOG/valgrind.%p \\
    "$("$PG_CONFIG" --bindir)/postgres" "\$@"
EOF
chmod 755 "$IDEM_POSTGRES"
as_root chown -R postgres: "$SAN_LOG" "$IDEM_POSTGRES"
export IDEM_POSTGRES

# UBSan reports go to the server's stderr, that is server.log.
start_cluster "idempotency.database = 'postgres'"

cd "$IDEM_TMP/src"
status=0
log "suite: regress (under valgrind: a few minutes)"
as_postgres make -s installcheck PG_CONFIG="$PG_CONFIG" ISOLATION= TAP_TESTS= || status=1
log "suite: isolation"
as_postgres make -s installcheck PG_CONFIG="$PG_CONFIG" REGRESS= TAP_TESTS= || status=1
for f in regression.diffs output_iso/regression.diffs; do
    if [ -s "$f" ]; then
        echo "===== $f"
        cat "$f"
    fi
done
as_postgres "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$IDEM_TMP/data" -m fast -w stop >/dev/null
IDEM_CLUSTER_STARTED=
cp "$IDEM_TMP/server.log" "$SAN_LOG/server.suites.log"

if [ "$SANITIZE_FUZZ_SECONDS" -gt 0 ]; then
    log "fuzzing the sanitized build under valgrind for $SANITIZE_FUZZ_SECONDS s"
    # fuzz.sh makes a cluster and folder of its own (with IDEM_POSTGRES) and
    # checks its server log for UBSan's "runtime error"; valgrind writes here
    FUZZ_SKIP_BUILD=1 FUZZ_SECONDS=$SANITIZE_FUZZ_SECONDS FUZZ_CLIENTS=2 \
        bash "$IDEM_ROOT/scripts/fuzz.sh" || status=1
fi

if grep -h "runtime error:" "$SAN_LOG/server.suites.log"; then
    echo "===== UBSan reports in the server log"
    status=1
fi
# A valgrind report is a block of "==pid==" lines; keep those that name us.
reports=0
for f in "$SAN_LOG"/valgrind.*; do
    [ -s "$f" ] || continue
    if awk '/^==[0-9]+== [A-Z]/ { if (blk ~ /idempotency/) print blk; blk = "" }
            { blk = blk $0 "\n" }
            END { if (blk ~ /idempotency/) print blk }' "$f" >"$f.ours" && [ -s "$f.ours" ]; then
        echo "===== valgrind: $f"
        cat "$f.ours"
        reports=$((reports + 1))
    fi
done
total=$(cat "$SAN_LOG"/valgrind.* 2>/dev/null | grep -c "^==[0-9]*== [A-Z]" || true)
log "valgrind: $total report lines in all, $reports process(es) with reports naming idempotency.so"
[ "$reports" -eq 0 ] || status=1

if [ "$status" -eq 0 ]; then
    echo "sanitize: passed"
else
    echo "sanitize: FAILED"
fi
exit "$status"
