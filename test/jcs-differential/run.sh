#!/usr/bin/env bash
# test/jcs-differential/run.sh: differential check of idem_canonical and
# idem_fingerprint, of the C extension and of the SQL edition, against the
# npm package canonicalize (an independent RFC 8785 implementation).
#
# Generates random documents (unicode names with astral-plane characters,
# nested structures, numbers of at most 15 significant digits and of every
# magnitude from 1e-300 to 1e300, written in random JSON styles), has
# canonicalize produce the expected canonical bytes and SHA-256, runs
# each edition's idem_canonical and idem_fingerprint on a throwaway cluster
# (test/editions/canonical_schemas.sh: the C extension in schema c, the SQL
# edition's canonical functions in schema sqled), and compares byte for
# byte.  Needs node (18 or later) and npm; installs canonicalize
# from package-lock.json.
#
# Usage: test/jcs-differential/run.sh [COUNT [SEED]]   (default 20000 1)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../../scripts/lib.sh"
. "$HERE/../editions/canonical_schemas.sh"

COUNT=${1:-20000}
SEED=${2:-1}

trap cleanup EXIT
install_packages
if [ ! -d "$HERE/node_modules/canonicalize" ]; then
    log "installing canonicalize from package-lock.json"
    (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error)
fi
build_and_install
make_workdir
start_cluster

WORK=$IDEM_TMP/differential
as_postgres mkdir "$WORK"
chmod 777 "$WORK"
log "generating $COUNT documents (seed $SEED)"
node "$HERE/check.mjs" generate "$COUNT" "$SEED" "$WORK"

log "canonicalizing them in PostgreSQL, with each edition"
install_canonical_schemas
as_postgres "$("$PG_CONFIG" --bindir)/psql" -U postgres -X -q -v ON_ERROR_STOP=1 <<SQL
CREATE TABLE docs (id bigint GENERATED ALWAYS AS IDENTITY, hex text);
\copy docs (hex) FROM '$WORK/docs.hex'
\copy (SELECT id || '|' || encode(convert_to(c.idem_canonical(d), 'UTF8'), 'hex') || '|' || encode(c.idem_fingerprint(d), 'hex') FROM (SELECT id, convert_from(decode(hex, 'hex'), 'UTF8')::jsonb AS d FROM docs) s ORDER BY id) TO '$WORK/actual.txt'
\copy (SELECT id || '|' || encode(convert_to(sqled.idem_canonical(d), 'UTF8'), 'hex') || '|' || encode(sqled.idem_fingerprint(d), 'hex') FROM (SELECT id, convert_from(decode(hex, 'hex'), 'UTF8')::jsonb AS d FROM docs) s ORDER BY id) TO '$WORK/actual-sql.txt'
SQL

status=0
echo "the C extension's idem_canonical and idem_fingerprint:"
node "$HERE/check.mjs" compare "$WORK" actual.txt || status=1
echo "the SQL edition's idem_canonical and idem_fingerprint:"
node "$HERE/check.mjs" compare "$WORK" actual-sql.txt || status=1
exit "$status"
