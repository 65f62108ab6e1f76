-- examples/schema.sql: the database the example services use.
--
-- The same file for both editions.  The services connect as the role
-- idem_app, never as a superuser.  Running it again creates what is missing
-- and changes nothing else.  It is one transaction: when a step fails,
-- nothing is kept.
--
-- The extension (README.md): run it as a superuser in the application's
-- database; it creates the extension when no idem_claim is on search_path,
-- and the role idem_app when it does not exist.
--     psql -v ON_ERROR_STOP=1 -d appdb -f examples/schema.sql
--
-- The SQL edition (sql_edition/README.md), installed first: run it as the
-- role that installed the edition (it owns the functions, so it may grant
-- them), with the edition's schema on search_path after the schema the
-- payments table goes into, which that role may create in:
--     PGOPTIONS='-c search_path=public,idempotency' psql -v ON_ERROR_STOP=1 -d appdb -f examples/schema.sql
-- Two steps need an administrator (a superuser, or a role with CREATEROLE)
-- before it: creating the role idem_app (CREATE ROLE idem_app LOGIN
-- PASSWORD '...'), and its search_path (ALTER ROLE idem_app SET search_path
-- = "$user", public, idempotency), which the services' calls need.
-- docs/clients.md, "The example services", gives the commands.

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

-- The API: the functions of either edition, found on search_path.  When
-- none is there, the extension is created where its files are installed
-- (that needs a superuser); the SQL edition cannot be created from here.
-- Then the role idem_app, made here only by a role that may make roles.
DO $$
DECLARE
    api name;
    elsewhere text;
    may_create_roles boolean;
    app_path text;
BEGIN
    SELECT n.nspname INTO api
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE p.proname = 'idem_claim' AND pg_function_is_visible(p.oid)
     ORDER BY array_position(current_schemas(true), n.nspname)
     LIMIT 1;
    IF api IS NULL THEN
        SELECT string_agg(DISTINCT format('%I', n.nspname), ', ') INTO elsewhere
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proname = 'idem_claim';
        IF elsewhere IS NOT NULL AND NOT EXISTS (
                SELECT FROM pg_proc p
                 WHERE p.proname = 'idem_claim' AND has_schema_privilege(p.pronamespace, 'USAGE')) THEN
            RAISE EXCEPTION 'permission denied for schema %', elsewhere
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = format('Role %I may not use the schema of function idem_claim. Nothing was changed.',
                                      current_user),
                      HINT = 'Run this file as the role that installed the SQL edition, or as a superuser.';
        ELSIF elsewhere IS NOT NULL THEN
            RAISE EXCEPTION 'function idem_claim is in schema %, which is not on search_path', elsewhere
                USING ERRCODE = 'undefined_function',
                      DETAIL = format('search_path is %s. Nothing was changed.', current_setting('search_path')),
                      HINT = format('Run this file with that schema on search_path, after the one to create the payments table in: PGOPTIONS=''-c search_path=%s,%s'' psql ...',
                                    current_schema(), elsewhere);
        ELSIF EXISTS (SELECT FROM pg_available_extensions WHERE name = 'idempotency') THEN
            CREATE EXTENSION IF NOT EXISTS idempotency;
            api := current_schema();
        ELSE
            RAISE EXCEPTION 'neither the idempotency extension nor its SQL edition is installed in database "%"',
                            current_database()
                USING ERRCODE = 'undefined_function',
                      DETAIL = 'The extension''s files are not installed on this server. Nothing was changed.',
                      HINT = 'Install the SQL edition first (sql_edition/README.md), as a role that is not idem_app, and run this file as that role.';
        END IF;
    END IF;

    -- The services' calls and queries name no schema: idem_app's
    -- search_path must reach both schemas, which the default ("$user",
    -- public) does only when both are public.
    IF current_schema() <> 'public' OR api <> 'public' THEN
        app_path := concat_ws(', ', '"$user"', format('%I', current_schema()),
                              CASE WHEN api <> current_schema() THEN format('%I', api) END);
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_app') THEN
        SELECT rolsuper OR rolcreaterole INTO may_create_roles FROM pg_roles WHERE rolname = current_user;
        IF NOT may_create_roles THEN
            RAISE EXCEPTION 'role "idem_app" does not exist'
                USING ERRCODE = 'undefined_object',
                      DETAIL = format('Role %I may not create roles. Nothing was changed.', current_user),
                      HINT = 'An administrator creates it first: CREATE ROLE idem_app LOGIN PASSWORD ''...'';'
                             || CASE WHEN app_path IS NOT NULL
                                     THEN format(' ALTER ROLE idem_app SET search_path = %s;', app_path)
                                     ELSE '' END;
        END IF;
        CREATE ROLE idem_app LOGIN;
        IF app_path IS NOT NULL THEN
            EXECUTE format('ALTER ROLE idem_app SET search_path = %s', app_path);
        END IF;
    END IF;

    -- (public is usable by everyone unless revoked; the SQL edition's own
    -- schema is not)
    IF NOT has_schema_privilege('idem_app', api, 'USAGE') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO idem_app', api);
    END IF;
    IF NOT has_schema_privilege('idem_app', current_schema(), 'USAGE') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO idem_app', current_schema());
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

-- A role that may not grant what is granted above (neither the owner of
-- the functions nor a superuser) gets only a WARNING from GRANT: the
-- services would then fail at their first request.  Refuse instead.
DO $$
DECLARE
    missing text;
BEGIN
    SELECT string_agg(what, ', ') INTO missing
      FROM (SELECT format('EXECUTE on %s', p.oid::regprocedure) AS what
              FROM pg_proc p
             WHERE p.proname IN ('idem_claim', 'idem_claim_text', 'idem_complete', 'idem_fail',
                                 'idem_heartbeat', 'idem_checkpoint', 'idem_replay')
               AND pg_function_is_visible(p.oid)
               AND NOT has_function_privilege('idem_app', p.oid, 'EXECUTE')
            UNION ALL
            SELECT format('USAGE on schema %I', n.nspname)
              FROM pg_namespace n
             WHERE n.oid IN (SELECT pronamespace FROM pg_proc WHERE proname = 'idem_claim'
                                AND pg_function_is_visible(oid))
               AND NOT has_schema_privilege('idem_app', n.oid, 'USAGE')
            UNION ALL
            SELECT 'SELECT and INSERT on payments'
             WHERE NOT (has_table_privilege('idem_app', 'payments', 'SELECT')
                        AND has_table_privilege('idem_app', 'payments', 'INSERT'))) AS m;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'role "idem_app" could not be granted %', missing
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Role %I may not grant them. Nothing was changed.', current_user),
                  HINT = 'Run this file as the role that owns the idempotency functions (the one that installed the SQL edition), or as a superuser.';
    END IF;
END
$$;

COMMIT;
