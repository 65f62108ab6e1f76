#!/bin/sh
# The SQL edition's types, tables, constraints, indexes and comments are
# those of a fresh install of the C extension: both installed in one
# database, in two schemas, and their catalog entries compared.
#
# Needs a server where the C extension is installed (make install) and a
# superuser to connect as (CREATE EXTENSION idempotency needs one); the
# usual PG* variables or psql options in PSQL choose the server:
#   PSQL="psql -h /tmp -p 5432 -U postgres" sql_edition/test/schema_compare.sh
# Creates and drops the database idem_schema_compare.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
psql=${PSQL:-psql}
PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
export PGOPTIONS
db=idem_schema_compare
work=$(mktemp -d)
trap '$psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

$psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
$psql -X -q -v ON_ERROR_STOP=1 -d $db \
    -c 'CREATE SCHEMA c_edition' \
    -c 'CREATE EXTENSION idempotency SCHEMA c_edition VERSION '"'1.3'"
$psql -X -q -v ON_ERROR_STOP=1 -v schema=sql_edition -d $db -f "$here/idempotency_sql.sql"

# Everything printed with search_path set to the schema, so that names of
# the schema's own objects print unqualified in both.
describe() {
    $psql -X -q -A -v ON_ERROR_STOP=1 -d $db <<SQL
SET search_path = $1, pg_catalog;
\\echo == types
SELECT t.typname, t.typtype,
       (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
          FROM pg_enum AS e WHERE e.enumtypid = t.oid) AS labels
  FROM pg_type AS t
 WHERE t.typnamespace = '$1'::regnamespace AND t.typname LIKE 'idem\_%'
   AND t.typtype IN ('e', 'c') AND (t.typtype = 'e' OR t.typrelid IN
       (SELECT oid FROM pg_class WHERE relkind = 'c'))
 ORDER BY 1;
\\echo == columns
SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
       co.collname, a.attnotnull, a.attidentity, a.attgenerated,
       pg_get_expr(d.adbin, d.adrelid) AS default_value,
       col_description(c.oid, a.attnum) AS comment
  FROM pg_class AS c
  JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0
  LEFT JOIN pg_collation AS co ON co.oid = a.attcollation AND a.attcollation <> 100
  LEFT JOIN pg_attrdef AS d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE c.relnamespace = '$1'::regnamespace
   AND c.relname IN ('idem_records', 'idem_records_archive', 'idem_decision', 'idem_stats')
 ORDER BY 1, 2;
\\echo == constraints
SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.convalidated,
       k.condeferrable, k.condeferred
  FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid
 WHERE c.relnamespace = '$1'::regnamespace
   AND c.relname IN ('idem_records', 'idem_records_archive')
 ORDER BY 1, 2;
\\echo == indexes
SELECT c.relname, i.relname, replace(pg_get_indexdef(i.oid), ' $1.', ' '),
       x.indisunique, x.indisprimary
  FROM pg_index AS x
  JOIN pg_class AS c ON c.oid = x.indrelid
  JOIN pg_class AS i ON i.oid = x.indexrelid
 WHERE c.relnamespace = '$1'::regnamespace
   AND c.relname IN ('idem_records', 'idem_records_archive')
 ORDER BY 1, 2;
\\echo == sequences
SELECT s.seqrelid::regclass, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
       s.seqmin, s.seqmax, s.seqcache, s.seqcycle
  FROM pg_sequence AS s JOIN pg_class AS c ON c.oid = s.seqrelid
 WHERE c.relnamespace = '$1'::regnamespace
 ORDER BY 1;
\\echo == table comments
SELECT c.relname, obj_description(c.oid, 'pg_class')
  FROM pg_class AS c
 WHERE c.relnamespace = '$1'::regnamespace
   AND c.relname IN ('idem_records', 'idem_records_archive')
 ORDER BY 1;
\\echo == views
SELECT c.relname, pg_get_viewdef(c.oid)
  FROM pg_class AS c
 WHERE c.relnamespace = '$1'::regnamespace AND c.relkind = 'v'
   AND c.relname = 'idem_stats';
SQL
}

describe c_edition > "$work/c_edition.txt"
describe sql_edition > "$work/sql_edition.txt"
if ! diff -u "$work/c_edition.txt" "$work/sql_edition.txt"; then
    echo "schema_compare: the SQL edition's objects differ from the C extension's (- C, + SQL)" >&2
    exit 1
fi
# a comparison of nothing proves nothing
for part in types columns constraints indexes views; do
    n=$(sed -n "/^== $part\$/,/^==/p" "$work/c_edition.txt" | grep -c '|' || true)
    if [ "$n" -lt 2 ]; then
        echo "schema_compare: no $part compared" >&2
        exit 1
    fi
done
echo "schema_compare: types, columns, constraints, indexes, sequences, comments and idem_stats are the C extension's"
