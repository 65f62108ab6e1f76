#!/bin/sh
# The two installers are what build.sh writes from src/, and the pg_tle
# installer hands pgtle.install_extension exactly the SQL the psql
# installer runs, in trusted languages only.  Needs no server.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "installers: $*" >&2; exit 1; }

"$here/build.sh" --check || fail "run sql_edition/build.sh and commit what it writes"

body() {
    sed -n '/^-- >>> the SQL of sql_edition\/src\//,/^-- <<< the SQL of sql_edition\/src\//p' "$1"
}
body "$here/idempotency_sql.sql" > "$work/psql.sql"
body "$here/idempotency_sql_pgtle.sql" > "$work/pgtle.sql"
[ -s "$work/psql.sql" ] || fail "no SQL between the markers of idempotency_sql.sql"
cmp -s "$work/psql.sql" "$work/pgtle.sql" || fail "the pg_tle installer's SQL differs from the psql installer's"

# the body of the pg_tle call is one dollar-quoted string: its tag occurs
# exactly twice in the file, around the SQL
tag=$(sed -n 's/^\(\$[A-Za-z_]*\$\)$/\1/p' "$here/idempotency_sql_pgtle.sql" | head -1)
[ -n "$tag" ] || fail "no dollar-quote line in idempotency_sql_pgtle.sql"
[ "$(grep -cF -- "$tag" "$here/idempotency_sql_pgtle.sql")" -eq 2 ] \
    || fail "the dollar-quote $tag occurs other than twice in idempotency_sql_pgtle.sql"

# no psql meta-command, and no language but sql and plpgsql
if grep -n '^[[:space:]]*\\' "$work/psql.sql"; then
    fail "psql meta-commands in the SQL pg_tle receives"
fi
if grep -noiE 'LANGUAGE[[:space:]]+[A-Za-z_"]+' "$work/psql.sql" \
        | grep -viE 'LANGUAGE[[:space:]]+"?(sql|plpgsql)"?$'; then
    fail "a language other than sql and plpgsql"
fi
n=$(grep -ciE 'LANGUAGE[[:space:]]+"?(sql|plpgsql)' "$work/psql.sql")
[ "$n" -gt 0 ] || fail "no function found in the SQL"
echo "installers: both as build.sh writes them; the same SQL in each ($n functions, sql and plpgsql only)"
