#!/usr/bin/env bash
# test/editions/canonical_differential.sh: the SQL edition's canonical form
# against the C edition's, byte for byte, in one database.
#
# Starts a throwaway cluster (scripts/lib.sh), creates the C extension in
# schema c and loads the SQL edition's canonical functions
# (sql_edition/src/20_canonical.sql, which needs nothing else of the
# edition) into schema sqled, with their search_path pinned as the
# edition's installer pins it.  Then:
#
#   1. canonical_differential.sql: idem_canonical and idem_fingerprint of
#      both editions on edge documents, numbers of 1 to 40 significant
#      digits from 1e-310 to 1e310, deep nesting, request-like documents
#      and COUNT random documents (seed SEED); fails on any difference.
#   2. sql/canonical.sql and sql/canonical_numbers.sql, the C edition's
#      regression files, unchanged, with the SQL edition's functions first
#      on the search_path; their output must be expected/*.out.
#
# Usage: test/editions/canonical_differential.sh [COUNT [SEED]]
#        (default 3000 0.5; SEED between -1 and 1, for setseed)
# Environment: PG_CONFIG (as scripts/test.sh), KEEP_TMP=1.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../../scripts/lib.sh"

COUNT=${1:-3000}
SEED=${2:-0.5}

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster

BINDIR=$("$PG_CONFIG" --bindir)
psql_q() { as_postgres "$BINDIR/psql" -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }

log "the C edition in schema c, the SQL edition's canonical functions in schema sqled"
psql_q -c "CREATE SCHEMA c; CREATE EXTENSION idempotency SCHEMA c; CREATE SCHEMA sqled;"
as_postgres env PGOPTIONS="-c search_path=sqled" "$BINDIR/psql" -U postgres -X -q \
    -v ON_ERROR_STOP=1 -f "$IDEM_TMP/src/sql_edition/src/20_canonical.sql"
# The LANGUAGE sql helpers stay unpinned so that they are inlined.
psql_q <<'SQL'
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
              WHERE p.pronamespace = 'sqled'::regnamespace AND l.lanname <> 'sql' LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = sqled, pg_catalog, pg_temp', f);
    END LOOP;
END;
$$;
SQL

log "comparing the editions on $COUNT random documents and the fixed ones (seed $SEED)"
OUT=$IDEM_TMP/canonical_differential.out
psql_q -v count="$COUNT" -v seed="$SEED" -f "$IDEM_TMP/src/test/editions/canonical_differential.sql" \
    | tee "$OUT"
if ! grep -q '^documents [0-9]* canonical_bytes [0-9]* mismatches 0$' "$OUT"; then
    log "FAILED: the editions differ (above)"
    exit 1
fi

log "the C edition's regression files against the SQL edition"
failed=0
for test in canonical canonical_numbers; do
    (cd "$IDEM_TMP/src" &&
        as_postgres env PGOPTIONS="-c search_path=sqled,public" \
            "$BINDIR/psql" -U postgres -X -a -q <"sql/$test.sql" >"$IDEM_TMP/$test.out" 2>&1) || true
    if diff -u "$IDEM_TMP/src/expected/$test.out" "$IDEM_TMP/$test.out" >"$IDEM_TMP/$test.diff"; then
        log "$test: same output as the C edition's expected file"
    else
        cat "$IDEM_TMP/$test.diff"
        log "FAILED: $test"
        failed=1
    fi
done
exit $failed
