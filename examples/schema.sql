-- examples/schema.sql: the database the example services use.
--
-- Run by a superuser (or the database owner) in the application's database:
--     psql -v ON_ERROR_STOP=1 -d appdb -f examples/schema.sql
-- The services connect as the role idem_app, not as a superuser.  Running
-- it again creates what is missing and changes nothing else.  It is one
-- transaction: when a step fails, nothing is kept.

BEGIN;

-- A payments table that is already there must be this file's: CREATE TABLE
-- IF NOT EXISTS below would silently keep a table of another shape (another
-- application's, or one created by hand), and the services would fail on it
-- at their first request.  Columns are compared by name and type, in any
-- order; the table checked is the one CREATE TABLE would create, in the
-- first schema of search_path.
DO $$
DECLARE
    expected CONSTANT text :=
        'amount bigint, created_at timestamp with time zone, currency text, id text, idempotency_key text';
    rel regclass;
    kind "char";
    found text;
BEGIN
    SELECT c.oid, c.relkind INTO rel, kind
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = current_schema() AND c.relname = 'payments';
    IF rel IS NULL THEN
        RETURN;
    END IF;
    SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '
                      ORDER BY a.attname)
      INTO found
      FROM pg_attribute a
     WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped;
    IF kind NOT IN ('r', 'p') OR found IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'relation "%" exists and is not the payments table of examples/schema.sql', rel
            USING ERRCODE = 'duplicate_table',
                  DETAIL = format('Expected a table with the columns (%s); found a %s with (%s).',
                                  expected,
                                  CASE kind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table'
                                            WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                            WHEN 'f' THEN 'foreign table'
                                            ELSE format('relation of kind %L', kind) END,
                                  coalesce(found, '')) || ' Nothing was changed.',
                  HINT = 'Rename or drop it, or run this file with another schema first in search_path.';
    END IF;
END
$$;

CREATE EXTENSION IF NOT EXISTS idempotency;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_app') THEN
        CREATE ROLE idem_app LOGIN;
    END IF;
END
$$;

-- The application role gets the API and nothing on idem_records itself:
-- the functions reach the table as its owner, and each role sees only its
-- own records.
GRANT EXECUTE ON FUNCTION idem_claim, idem_claim_text, idem_complete, idem_fail, idem_heartbeat,
                          idem_checkpoint, idem_replay TO idem_app;

-- The business table.  The payment is written in the same transaction as the
-- claim and idem_complete: either both exist or neither does.
CREATE TABLE IF NOT EXISTS payments (
    id              text PRIMARY KEY
                    DEFAULT 'pay_' || replace(gen_random_uuid()::text, '-', ''),
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at      timestamptz NOT NULL DEFAULT now()
);

GRANT SELECT, INSERT ON payments TO idem_app;

COMMIT;
