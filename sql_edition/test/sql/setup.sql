--
-- The SQL edition installed by its psql installer, as on a managed
-- service: by a role that is no superuser and may create in schema public
-- (sql/setup.sql, CREATE EXTENSION, is the C edition's).  The shared tests
-- that follow run against what it installs.
--
\set SHOW_CONTEXT never
CREATE ROLE idem_installer NOSUPERUSER;
GRANT CREATE ON SCHEMA public TO idem_installer;
SET ROLE idem_installer;
\set ECHO none
\i idempotency_sql.sql
\set ON_ERROR_STOP off
\set ECHO all
RESET ROLE;

SELECT version FROM idem_sql_edition;

-- Every object the installer made, by kind, all owned by the installing
-- role: those of the C edition but what needs C (docs/editions.md), and
-- idem_sql_edition.  The private helpers (idem__*) are left out, and so
-- are the row types of tables and views and the array types, as in
-- sql/setup.sql.
SELECT pg_describe_object(classid, objid, 0) AS object,
       pg_get_userbyid(owner) = 'idem_installer' AS owned_by_installer
  FROM (SELECT 'pg_proc'::regclass AS classid, oid AS objid, proowner AS owner
          FROM pg_proc
         WHERE pronamespace = 'public'::regnamespace AND proname NOT LIKE 'idem\_\_%'
        UNION ALL
        SELECT 'pg_class'::regclass, oid, relowner
          FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind NOT IN ('i', 'c')
        UNION ALL
        SELECT 'pg_type'::regclass, t.oid, t.typowner
          FROM pg_type t
         WHERE t.typnamespace = 'public'::regnamespace
           AND (t.typtype IN ('e', 'd')
                OR t.typtype = 'c' AND EXISTS (SELECT FROM pg_class c
                                                WHERE c.oid = t.typrelid AND c.relkind = 'c'))) o
 ORDER BY 1;

-- Types, columns, collations, constraints and indexes are the C
-- edition's: sql_edition/test/schema_compare.sh compares them.

-- The table as installed passes the functions' check of its owner's
-- changes by the one statement a session plans once (16_table.sql), not
-- by the diagnosis of what changed.
SET ROLE idem_installer;
SELECT idem__table_fits() AS table_fits;
RESET ROLE;

-- Nobody but the owner reads the table.
SELECT has_table_privilege('public', 'idem_records', 'SELECT') AS public_can_read;
-- ... and nobody may call the functions that touch records until granted:
-- of the API, only the pure functions (no record read or written) are open
-- to PUBLIC.  The private helpers behind the API (idem__*) are too, since
-- the API's LANGUAGE sql wrappers run as their caller: each refuses a
-- caller that may not EXECUTE the API function it stands for (below), or,
-- for the maintenance passes, acts with the caller's own privileges.
SELECT p.oid::regprocedure::text AS open_to_public
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE')
   AND p.proname NOT IN ('idem_derive_key', 'idem_canonical', 'idem_fingerprint')
   AND p.proname NOT LIKE 'idem\_\_%'
 ORDER BY 1;
CREATE ROLE idem_nobody;
SET ROLE idem_nobody;
SELECT outcome FROM idem__claim(current_user::regrole, 'op', 'k', '{}',
                                NULL, NULL, NULL, NULL, NULL, NULL, NULL);
SELECT idem__finish(current_user::regrole, 'x', 'y', 'succeeded', 200, NULL, NULL, NULL, NULL);
SELECT outcome FROM idem__replay(current_user::regrole, 'op', 'k', NULL, NULL);
RESET ROLE;
DROP ROLE idem_nobody;

-- Only trusted languages, what pg_tle and every managed service run.
SELECT DISTINCT l.lanname, l.lanpltrusted AS trusted
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'public'::regnamespace
 ORDER BY 1;

-- A SECURITY DEFINER function runs with its search_path pinned, so that no
-- caller's schema can take the place of the edition's objects.
SELECT p.oid::regprocedure AS definer_without_pinned_search_path
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef
   AND NOT EXISTS (SELECT FROM unnest(p.proconfig) AS c WHERE c LIKE 'search\_path=%')
 ORDER BY 1;

-- An empty table gives empty statistics.
SELECT * FROM idem_stats;
