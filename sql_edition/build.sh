#!/bin/sh
# Writes the two installers of the SQL edition from sql_edition/src/*.sql,
# concatenated in name order:
#   idempotency_sql.sql        psql installer: one transaction, so that a
#                              failed install leaves nothing;
#   idempotency_sql_pgtle.sql  the same SQL given to pgtle.install_extension.
# Both are committed.  With --check, writes nothing and exits 1 when a
# committed installer differs from what it would write.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
version=1.3
# the dollar-quote of the pg_tle installer: must not occur in the SQL
tag='$_idempotency_sql_tle_$'

check=false
case "${1:-}" in
    --check) check=true ;;
    '') ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

set -- "$here"/src/[0-9][0-9]_*.sql
[ -e "$1" ] || { echo "$0: no sql_edition/src/NN_*.sql" >&2; exit 1; }
for f in "$@"; do
    printf -- '-- %s\n' "src/$(basename "$f")"
    cat "$f"
    printf '\n'
done > "$work/body.sql"

fail=0
# pg_tle runs the body as an extension script: no psql meta-command, no
# transaction control
if grep -n '^[[:space:]]*\\' "$work/body.sql" >&2; then
    echo "$0: psql meta-commands in src/ (above): they belong to the psql wrapper" >&2
    fail=1
fi
if grep -niE '^(BEGIN|COMMIT|ROLLBACK|START TRANSACTION)[[:space:]]*;' "$work/body.sql" >&2; then
    echo "$0: transaction control in src/ (above)" >&2
    fail=1
fi
if grep -nF -- "$tag" "$work/body.sql" >&2; then
    echo "$0: the dollar-quote $tag occurs in src/ (above): choose another" >&2
    fail=1
fi
# only trusted languages: what pg_tle accepts, what a managed service runs
if grep -noiE 'LANGUAGE[[:space:]]+[A-Za-z_"]+' "$work/body.sql" \
        | grep -viE 'LANGUAGE[[:space:]]+"?(sql|plpgsql)"?$' >&2; then
    echo "$0: a language other than sql or plpgsql in src/ (above)" >&2
    fail=1
fi
[ "$fail" -eq 0 ] || exit 1

{
    cat <<HEAD
--
-- idempotency, SQL edition $version: psql installer.
--
-- Run by a role that may create in the database (no superuser needed):
--   psql -v ON_ERROR_STOP=1 -f sql_edition/idempotency_sql.sql
--   psql -v ON_ERROR_STOP=1 -v schema=idempotency -f sql_edition/idempotency_sql.sql
-- Without -v schema it installs into current_schema().  One transaction:
-- a failed install leaves nothing.  Run again, or run a later version's
-- installer, to update in place: every record is kept.  See
-- sql_edition/README.md.
--
-- Written by sql_edition/build.sh from sql_edition/src/; do not edit.
--
\\set ON_ERROR_STOP on
\\set QUIET on
\\if :{?schema}
\\else
\\set schema ''
\\endif
BEGIN;
SET LOCAL client_min_messages = warning;
SELECT pg_catalog.set_config('idempotency_sql.schema', :'schema', true) IS NULL AS no_schema \\gset
\\unset no_schema
\\unset schema
-- >>> the SQL of sql_edition/src/, as pg_tle receives it
HEAD
    cat "$work/body.sql"
    cat <<TAIL
-- <<< the SQL of sql_edition/src/
COMMIT;
TAIL
} > "$work/idempotency_sql.sql"

{
    cat <<HEAD
--
-- idempotency, SQL edition $version: pg_tle installer (Amazon RDS, Aurora
-- and other servers with pg_tle).  Run by a role granted pgtle_admin:
--   psql -v ON_ERROR_STOP=1 -f sql_edition/idempotency_sql_pgtle.sql
-- then, as the role that owns the records, in each database:
--   CREATE EXTENSION idempotency_sql SCHEMA idempotency;
-- See sql_edition/README.md.
--
-- Written by sql_edition/build.sh from sql_edition/src/; do not edit.
--
SELECT pgtle.install_extension(
    'idempotency_sql',
    '$version',
    'Idempotency-Key pattern, SQL edition: atomic claims, canonical request fingerprints, stored-response replay, lease expiry',
$tag
-- >>> the SQL of sql_edition/src/, as pg_tle receives it
HEAD
    cat "$work/body.sql"
    cat <<TAIL
-- <<< the SQL of sql_edition/src/
$tag,
    ARRAY['plpgsql']
);
TAIL
} > "$work/idempotency_sql_pgtle.sql"

status=0
for f in idempotency_sql.sql idempotency_sql_pgtle.sql; do
    if $check; then
        if ! cmp -s "$work/$f" "$here/$f"; then
            echo "$0: sql_edition/$f differs from what sql_edition/build.sh writes" >&2
            status=1
        fi
    else
        cp "$work/$f" "$here/$f"
    fi
done
exit $status
