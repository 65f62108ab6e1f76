#!/usr/bin/env bash
# test/editions/canonical_differential.sh: the SQL edition's canonical form
# against the C edition's, byte for byte, in one database.
#
# Starts a throwaway cluster (scripts/lib.sh), with the C extension in
# schema c and the SQL edition's canonical functions in schema sqled
# (canonical_schemas.sh).  Then:
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
#        (default 4000 0.5; SEED between -1 and 1, for setseed)
# Environment: PG_CONFIG (as scripts/test.sh), KEEP_TMP=1.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../../scripts/lib.sh"
. "$HERE/canonical_schemas.sh"

COUNT=${1:-4000}
SEED=${2:-0.5}

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster

BINDIR=$("$PG_CONFIG" --bindir)
psql_q() { as_postgres "$BINDIR/psql" -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }

install_canonical_schemas

log "comparing the editions on $COUNT random documents and the fixed ones (seed $SEED)"
OUT=$IDEM_TMP/canonical_differential.out
psql_q -v count="$COUNT" -v seed="$SEED" -f "$IDEM_TMP/src/test/editions/canonical_differential.sql" \
    | tee "$OUT"
if ! grep -q '^documents [0-9]* canonical_bytes [0-9]* mismatches 0$' "$OUT"; then
    log "FAILED: the editions differ (above)"
    exit 1
fi
# Both ways of the SQL edition must have been compared, each on hundreds
# of documents at least.
if ! grep -Eq '^containers written by the string path ([5-9][0-9]{2}|[0-9]{4,}), from the jsonb ([5-9][0-9]{2}|[0-9]{4,})$' "$OUT"; then
    log "FAILED: too few documents took one of the SQL edition's two paths (above)"
    exit 1
fi
if ! grep -Eq '^objects written in one call ([2-9][0-9]{2}|[0-9]{4,})$' "$OUT"; then
    log "FAILED: too few objects were written by the SQL edition's one-call path (above)"
    exit 1
fi
if ! grep -Eq '^plain objects with an array of objects of scalars ([4-9][0-9]|[0-9]{3,})$' "$OUT"; then
    log "FAILED: too few plain objects held an array of objects of scalars (above)"
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
