--
-- Least privilege, role isolation and search_path safety.
--
-- A role needs EXECUTE on the functions and nothing on the table; each role
-- sees only its own records; objects a user creates in other schemas, or a
-- search_path that puts them first, change nothing the functions do.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default
SET idempotency.default_lease = '1h';

CREATE ROLE regress_idem_app;
CREATE ROLE regress_idem_other;
CREATE ROLE regress_idem_nobody;

-- The SQLSTATE, message and detail of a statement, or 'ok'; numbers of two
-- digits or more (record ids) are shown as N.
CREATE FUNCTION regress_error_of(stmt text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
DECLARE
  msg text;
  detail text;
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
  RETURN SQLSTATE || ' ' || regexp_replace(msg || coalesce(' / ' || nullif(detail, ''), ''),
                                           '[0-9]{2,}', 'N', 'g');
END $$;

-- The GRANT lines of the README.
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_heartbeat,
                          idem_checkpoint, idem_replay, idem_resolve
   TO regress_idem_app, regress_idem_other;

-- 1. A role that was granted nothing can do nothing.
SET ROLE regress_idem_nobody;
SELECT * FROM idem_claim('payments.create', 'sec-1');
SELECT * FROM idem_replay('payments.create', 'sec-1');
SELECT idem_complete('1.1.00000000000000000000000000000000', 200);
SELECT count(*) FROM idem_records;
SELECT count(*) FROM idem_stats;
-- Deriving a key reads nothing and stays open to everyone.
SELECT idem_derive_key('sec-1', 'charge') IS NOT NULL AS can_derive;
RESET ROLE;

-- 2. A role granted only EXECUTE uses the whole API...
SET ROLE regress_idem_app;
SELECT (c).token AS app_token, (c).record_id AS app_id
  FROM idem_claim('payments.create', 'sec-1', '{"amount": 1}', caller => 'svc') c \gset
SELECT idem_heartbeat(:'app_token', '2h') > now() AS heartbeat;
SELECT idem_checkpoint(:'app_token', 'charged');
SELECT idem_complete(:'app_token', 201, '{"id": "PAY-A"}', '{"Location": "/p/A"}', 'PAY-A');
SELECT outcome, http_status, body, resource_id
  FROM idem_claim('payments.create', 'sec-1', '{"amount": 1}', caller => 'svc');
SELECT outcome, body FROM idem_replay('payments.create', 'sec-1', caller => 'svc');
-- ... but cannot touch the table or the statistics directly.
SELECT * FROM idem_records;
UPDATE idem_records SET response_body = '{}';
DELETE FROM idem_records;
INSERT INTO idem_records (role, tenant, caller, operation, key) VALUES (DEFAULT, '', 'x', 'x', 'x');
TRUNCATE idem_records;
SELECT * FROM idem_stats;
RESET ROLE;

-- 3. Another role with the same tenant, caller, operation and key has a
-- record of its own: it proceeds instead of replaying the first one's answer.
SET ROLE regress_idem_other;
SELECT outcome, state, attempt, body
  FROM idem_claim('payments.create', 'sec-1', '{"amount": 1}', caller => 'svc');
SELECT count(*) AS sees_nothing_of_app
  FROM idem_replay('payments.create', 'sec-1', caller => 'svc')
 WHERE body IS NOT NULL;
-- A different request is not a mismatch either: it never sees app's fingerprint.
SELECT outcome FROM idem_claim('payments.create', 'sec-2', '{"amount": 2}', caller => 'svc');
RESET ROLE;
SET ROLE regress_idem_app;
SELECT count(*) AS app_sees_nothing_of_other FROM idem_replay('payments.create', 'sec-2', caller => 'svc');
-- Naming the other role as caller does not help: caller is only a sub-identity.
SELECT outcome FROM idem_claim('payments.create', 'sec-2', '{"amount": 2}', caller => 'regress_idem_other');
RESET ROLE;

-- 4. Fenced writes hold against a token of another role: the very error of a
-- token that never existed, saying nothing about the record.
SET ROLE regress_idem_app;
SELECT (c).token AS live_token, (c).record_id AS live_id
  FROM idem_claim('payments.create', 'sec-3', '{"amount": 3}', caller => 'svc') c \gset
RESET ROLE;
SET ROLE regress_idem_other;
SELECT call, regress_error_of(stmt) AS error FROM (VALUES
  ('complete, live token', format('SELECT idem_complete(%L, 200, ''{"stolen": true}'')', :'live_token')),
  ('fail, live token', format('SELECT idem_fail(%L, 500)', :'live_token')),
  ('heartbeat, live token', format('SELECT idem_heartbeat(%L)', :'live_token')),
  ('checkpoint, live token', format('SELECT idem_checkpoint(%L, ''hijacked'')', :'live_token')),
  ('complete, finished token', format('SELECT idem_complete(%L, 200)', :'app_token')),
  ('complete, made-up token', $$SELECT idem_complete('999999.1.00000000000000000000000000000000', 200)$$)
) AS t(call, stmt);
RESET ROLE;
SELECT state, attempt, recovery_point, response_body FROM idem_records WHERE id = :live_id;

-- 5. idem_resolve by record id reaches only the caller's own records; the
-- other role is told the record does not exist.
SET ROLE regress_idem_app;
SELECT (c).record_id AS unknown_id
  FROM idem_claim('payments.create', 'sec-4', '{"amount": 4}', lease => '1 microsecond') c \gset
SELECT pg_sleep(0.01);
SELECT outcome FROM idem_claim('payments.create', 'sec-4', '{"amount": 4}');
RESET ROLE;
SET ROLE regress_idem_other;
SELECT regress_error_of(format('SELECT idem_resolve(%s, ''succeeded'', 201)', :unknown_id)) AS other_role,
       regress_error_of('SELECT idem_resolve(999999, ''succeeded'', 201)') AS no_such_record;
RESET ROLE;
SET ROLE regress_idem_app;
SELECT idem_resolve(:unknown_id, 'succeeded', 201, '{"id": "PAY-4"}');
SELECT outcome, body FROM idem_replay('payments.create', 'sec-4');
RESET ROLE;
-- An operator (the table's owner, a superuser) settles any role's record.
SET ROLE regress_idem_app;
SELECT (c).record_id AS unknown_id2
  FROM idem_claim('payments.create', 'sec-5', lease => '1 microsecond') c \gset
SELECT pg_sleep(0.01);
SELECT outcome FROM idem_claim('payments.create', 'sec-5');
RESET ROLE;
SELECT idem_resolve(:unknown_id2, 'failed', 502, '{"error": "provider said no"}');

-- What the table holds: the role is filled in by the functions.
SELECT role, caller, operation, key, state FROM idem_records
 WHERE key LIKE 'sec-%' ORDER BY key, role;
-- ... and even the owner cannot move a record to another role.
UPDATE idem_records SET role = 'regress_idem_other' WHERE id = :app_id;

-- 6. Values reach SQL as parameters: a key that looks like SQL is just a key.
SET ROLE regress_idem_app;
SELECT outcome FROM idem_claim('payments.create', $$'); DROP TABLE idem_records; --$$);
SELECT outcome FROM idem_claim($$x' OR '1'='1$$, $$' OR 1=1 --$$, tenant => $$'$$);
RESET ROLE;
SELECT key FROM idem_records WHERE role::text = 'regress_idem_app' AND key LIKE '%''%' ORDER BY key;

-- 7. search_path attacks.  A user creates, in a schema of its own, a table
-- named like ours and operators and functions named like the ones the
-- functions' statements use, each one leaving a trace when it runs.  The
-- functions run their statements as the table's owner: if any of these
-- objects were picked up, it would run with the owner's privileges.
CREATE SCHEMA regress_evil AUTHORIZATION regress_idem_app;
SET ROLE regress_idem_app;
CREATE TABLE regress_evil.trace (what text);
CREATE TABLE regress_evil.idem_records (LIKE regress_evil.trace);
CREATE FUNCTION regress_evil.trap(what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO regress_evil.trace VALUES (what || ' as ' || current_user);
  RETURN true;
END $$;
CREATE FUNCTION regress_evil.text_eq(a text, b text) RETURNS boolean
  LANGUAGE sql AS $$ SELECT regress_evil.trap('text =') $$;
CREATE OPERATOR regress_evil.= (LEFTARG = text, RIGHTARG = text,
                                FUNCTION = regress_evil.text_eq);
CREATE FUNCTION regress_evil.int8_eq(a bigint, b bigint) RETURNS boolean
  LANGUAGE sql AS $$ SELECT regress_evil.trap('bigint =') $$;
CREATE OPERATOR regress_evil.= (LEFTARG = bigint, RIGHTARG = bigint,
                                FUNCTION = regress_evil.int8_eq);
CREATE FUNCTION regress_evil.int4_eq(a integer, b integer) RETURNS boolean
  LANGUAGE sql AS $$ SELECT regress_evil.trap('integer =') $$;
CREATE OPERATOR regress_evil.= (LEFTARG = integer, RIGHTARG = integer,
                                FUNCTION = regress_evil.int4_eq);
CREATE FUNCTION regress_evil.bytea_eq(a bytea, b bytea) RETURNS boolean
  LANGUAGE sql AS $$ SELECT regress_evil.trap('bytea =') $$;
CREATE OPERATOR regress_evil.= (LEFTARG = bytea, RIGHTARG = bytea,
                                FUNCTION = regress_evil.bytea_eq);
CREATE FUNCTION regress_evil.state_eq(a idem_state, b idem_state) RETURNS boolean
  LANGUAGE sql AS $$ SELECT regress_evil.trap('idem_state =') $$;
CREATE OPERATOR regress_evil.= (LEFTARG = idem_state, RIGHTARG = idem_state,
                                FUNCTION = regress_evil.state_eq);
CREATE FUNCTION regress_evil.ts_le(a timestamptz, b timestamptz) RETURNS boolean
  LANGUAGE sql AS $$ SELECT regress_evil.trap('timestamptz <=') $$;
CREATE OPERATOR regress_evil.<= (LEFTARG = timestamptz, RIGHTARG = timestamptz,
                                 FUNCTION = regress_evil.ts_le);
CREATE FUNCTION regress_evil.ts_plus(a timestamptz, b interval) RETURNS timestamptz
  LANGUAGE sql AS $$ SELECT CASE WHEN regress_evil.trap('timestamptz +') THEN 'epoch'::timestamptz END $$;
CREATE OPERATOR regress_evil.+ (LEFTARG = timestamptz, RIGHTARG = interval,
                                FUNCTION = regress_evil.ts_plus);
CREATE FUNCTION regress_evil.now() RETURNS timestamptz
  LANGUAGE sql AS $$ SELECT CASE WHEN regress_evil.trap('now()') THEN 'epoch'::timestamptz END $$;
CREATE FUNCTION regress_evil."coalesce"(a text, b text) RETURNS text
  LANGUAGE sql AS $$ SELECT CASE WHEN regress_evil.trap('coalesce()') THEN a END $$;
CREATE FUNCTION regress_evil.idem_records() RETURNS SETOF regress_evil.trace
  LANGUAGE sql AS $$ SELECT 'idem_records()' WHERE regress_evil.trap('idem_records()') $$;
-- The traps work: an unqualified comparison picks them up.
SET search_path = regress_evil, pg_catalog, public;
SELECT 'a' = 'b' AS evil_equals;
DELETE FROM regress_evil.trace;
RESET ROLE;

-- A new session, so that the statements are prepared under the evil path,
-- and then every function, as the role that set the traps.
\c
SET idempotency.default_lease = '1h';
SET ROLE regress_idem_app;
SET search_path = regress_evil, pg_catalog, public;
SELECT (c).token AS evil_token, (c).outcome
  FROM public.idem_claim('payments.create', 'sec-evil', '{"amount": 5}') c \gset
\echo :outcome
SELECT public.idem_heartbeat(:'evil_token') > now() AS heartbeat;
SELECT public.idem_checkpoint(:'evil_token', 'step-1');
SELECT public.idem_complete(:'evil_token', 201, '{"id": "PAY-E"}', resource_id => 'PAY-E');
SELECT outcome, body FROM public.idem_claim('payments.create', 'sec-evil', '{"amount": 5}');
SELECT outcome FROM public.idem_claim('payments.create', 'sec-evil', '{"amount": 6}');
SELECT outcome FROM public.idem_claim('payments.create', 'sec-1', '{"amount": 1}', caller => 'svc');
SELECT count(*) AS no_such_key FROM public.idem_replay('payments.create', 'sec-none');
SELECT (c).token AS evil_token2
  FROM public.idem_claim('payments.create', 'sec-evil-2', on_lease_expiry => 'retry') c \gset
SELECT public.idem_fail(:'evil_token2', 503, retryable => true);
SELECT outcome, attempt FROM public.idem_claim('payments.create', 'sec-evil-2', on_lease_expiry => 'retry');
SELECT (c).record_id AS evil_unknown
  FROM public.idem_claim('payments.create', 'sec-evil-3', lease => '1 microsecond') c \gset
SELECT pg_sleep(0.01);
SELECT outcome FROM public.idem_claim('payments.create', 'sec-evil-3');
SELECT public.idem_resolve(:evil_unknown, 'succeeded', 200);
SELECT public.regress_error_of(format('SELECT public.idem_resolve(%s, ''succeeded'', 200)', :evil_unknown));
SELECT public.regress_error_of('SELECT public.idem_resolve(-1, ''succeeded'', 200)');
SELECT public.regress_error_of(format('SELECT public.idem_complete(%L, 200)', :'evil_token'));
-- The same calls once more with the plans already prepared, after a change
-- of search_path (the plan cache parses them again).
SET search_path = public, regress_evil;
SET search_path = regress_evil, pg_catalog, public;
SELECT outcome, body FROM public.idem_claim('payments.create', 'sec-evil', '{"amount": 5}');
SELECT count(*) FROM public.idem_replay('payments.create', 'sec-evil');
-- A temporary table named like ours (pg_temp comes first for tables).
CREATE TEMP TABLE idem_records (LIKE regress_evil.trace);
SELECT outcome FROM public.idem_claim('payments.create', 'sec-evil-4');
RESET ROLE;
RESET search_path;
-- Not one trap fired, the decoys are empty, and the records are right.
SELECT count(*) AS traps_fired FROM regress_evil.trace;
SELECT count(*) AS decoy_rows FROM regress_evil.idem_records;
SELECT count(*) AS temp_rows FROM pg_temp.idem_records;
SELECT key, state, attempt, recovery_point, response_status, response_body, resource_id,
       expires_at > now() AS expires_later
  FROM public.idem_records
 WHERE key LIKE 'sec-evil%' ORDER BY key;
DROP TABLE pg_temp.idem_records;
DROP SCHEMA regress_evil CASCADE;

-- 8. The extension in a schema of its own, with a table named idem_records
-- in public, first on the search_path: the functions use the extension's.
-- (In a database of its own, to leave this one as the other tests expect.)
\set regress_db :DBNAME
CREATE DATABASE regress_idem_schema;
\c regress_idem_schema
CREATE SCHEMA idem;
-- (the C edition as an extension, the SQL edition by its installer)
SELECT count(*) = 1 AS c_edition FROM pg_available_extensions WHERE name = 'idempotency' \gset
\set ECHO none
\if :c_edition
CREATE EXTENSION idempotency SCHEMA idem;
\else
\set schema idem
\i idempotency_sql.sql
\set ON_ERROR_STOP off
\endif
\set ECHO all
CREATE TABLE public.idem_records (what text);
SET search_path = public, idem;
SELECT (c).token AS tok FROM idem_claim('payments.create', 'sec-schema') c \gset
SELECT idem_complete(:'tok', 200, '{"ok": true}');
SELECT outcome, body FROM idem_claim('payments.create', 'sec-schema');
SELECT count(*) AS public_rows FROM public.idem_records;
SELECT key, state FROM idem.idem_records;
\c :regress_db
DROP DATABASE regress_idem_schema;

-- 9. The functions' own statements run as the table's owner the way
-- foreign key checks do: a deferred constraint added by the owner is
-- checked at commit, and row level security, even forced on the owner,
-- applies to none of them (role isolation is the functions' own).
CREATE TABLE regress_tenants (tenant text COLLATE "C" PRIMARY KEY);
INSERT INTO regress_tenants VALUES (''), ('t1');
ALTER TABLE idem_records ADD CONSTRAINT regress_tenant_fk FOREIGN KEY (tenant)
  REFERENCES regress_tenants DEFERRABLE INITIALLY DEFERRED NOT VALID;
SET ROLE regress_idem_app;
BEGIN;
SELECT (c).token AS fk_token
  FROM idem_claim('payments.create', 'sec-fk-1', tenant => 't1') c \gset
SELECT idem_complete(:'fk_token', 201);
COMMIT;
BEGIN;
SELECT outcome FROM idem_claim('payments.create', 'sec-fk-2', tenant => 'no-such-tenant');
\set VERBOSITY terse
COMMIT;
\set VERBOSITY default
SELECT count(*) AS fk_2_kept FROM idem_replay('payments.create', 'sec-fk-2', tenant => 'no-such-tenant');
RESET ROLE;
ALTER TABLE idem_records DROP CONSTRAINT regress_tenant_fk;
DROP TABLE regress_tenants;

-- (The owner is a role without BYPASSRLS for this part: superusers bypass
-- row level security whatever the table says.)
CREATE ROLE regress_idem_owner;
SELECT pg_get_userbyid(relowner) AS idem_owner FROM pg_class WHERE oid = 'idem_records'::regclass \gset
ALTER TABLE idem_records OWNER TO regress_idem_owner;
ALTER TABLE idem_records ENABLE ROW LEVEL SECURITY;
ALTER TABLE idem_records FORCE ROW LEVEL SECURITY;
CREATE POLICY regress_none ON idem_records USING (false) WITH CHECK (false);
SELECT count(*) = 1 AS c_edition FROM pg_extension WHERE extname = 'idempotency' \gset
\if :c_edition
SET ROLE regress_idem_app;
SELECT (c).token AS rls_token
  FROM idem_claim('payments.create', 'sec-rls', on_lease_expiry => 'retry') c \gset
SELECT idem_fail(:'rls_token', 503, retryable => true);
SELECT outcome, attempt FROM idem_claim('payments.create', 'sec-rls');
SELECT (c).record_id AS rls_unknown
  FROM idem_claim('payments.create', 'sec-rls-2', lease => '1 microsecond') c \gset
SELECT pg_sleep(0.01);
SELECT outcome FROM idem_claim('payments.create', 'sec-rls-2');
SELECT idem_resolve(:rls_unknown, 'succeeded', 200);
SELECT outcome, http_status FROM idem_replay('payments.create', 'sec-rls-2');
SET ROLE regress_idem_owner;
SELECT count(*) AS owner_sees_under_policy FROM idem_records;
RESET ROLE;
\else
-- The SQL edition's functions run as their own owner, not as the table's
-- (docs/editions.md): the table given to another role, each call is
-- refused before it reads or writes; given back with row level security
-- forced on its owner, too, rather than have a policy hide records or
-- refuse writes.
SET ROLE regress_idem_app;
SELECT call, regress_error_of(stmt) AS error FROM (VALUES
  ('claim', $$SELECT idem_claim('payments.create', 'sec-rls')$$),
  ('replay', $$SELECT idem_replay('payments.create', 'sec-rls')$$)
) AS t(call, stmt);
RESET ROLE;
ALTER TABLE idem_records OWNER TO :"idem_owner";
SET ROLE regress_idem_app;
SELECT regress_error_of($$SELECT idem_claim('payments.create', 'sec-rls')$$) AS claim;
RESET ROLE;
\endif
DROP POLICY regress_none ON idem_records;
ALTER TABLE idem_records NO FORCE ROW LEVEL SECURITY;
ALTER TABLE idem_records DISABLE ROW LEVEL SECURITY;
ALTER TABLE idem_records OWNER TO :"idem_owner";
DROP ROLE regress_idem_owner;
SELECT key, state, attempt FROM idem_records WHERE key LIKE 'sec-rls%' ORDER BY key;

-- 10. A constraint error raised by a record write (not-null, check,
-- unique, foreign key) shows no values of the row: PostgreSQL's DETAIL
-- would print the key, the scope and the attempt token's secret.
ALTER TABLE idem_records ADD COLUMN regress_required text NOT NULL DEFAULT 'x';
ALTER TABLE idem_records ALTER COLUMN regress_required DROP DEFAULT;
SET ROLE regress_idem_app;
SELECT regress_error_of($$SELECT idem_claim('payments.create', 'sec-secret-1')$$) AS not_null;
RESET ROLE;
ALTER TABLE idem_records DROP COLUMN regress_required;
ALTER TABLE idem_records ADD CONSTRAINT regress_no_secret CHECK (key <> 'sec-secret-2');
ALTER TABLE idem_records ADD CONSTRAINT regress_two_attempts CHECK (attempt <= 2);
CREATE UNIQUE INDEX regress_key_once ON idem_records (key) WHERE key = 'sec-secret-3';
CREATE TABLE regress_tenants (tenant text COLLATE "C" PRIMARY KEY);
ALTER TABLE idem_records ADD CONSTRAINT regress_tenant_fk FOREIGN KEY (tenant)
  REFERENCES regress_tenants NOT VALID;
INSERT INTO regress_tenants VALUES ('');
SET ROLE regress_idem_other;
SELECT outcome FROM idem_claim('payments.create', 'sec-secret-3');
RESET ROLE;
SET ROLE regress_idem_app;
SELECT (c).token AS secret_token
  FROM idem_claim('payments.create', 'sec-secret-4', on_lease_expiry => 'retry') c \gset
SELECT idem_fail(:'secret_token', 503, retryable => true);
SELECT (c).token AS secret_token
  FROM idem_claim('payments.create', 'sec-secret-4', on_lease_expiry => 'retry') c \gset
SELECT idem_fail(:'secret_token', 503, retryable => true);
SELECT call, regress_error_of(stmt) AS error FROM (VALUES
  ('check', $$SELECT idem_claim('payments.create', 'sec-secret-2')$$),
  ('unique', $$SELECT idem_claim('payments.create', 'sec-secret-3')$$),
  ('foreign key', $$SELECT idem_claim('payments.create', 'sec-secret-5', tenant => 'nope')$$),
  ('check, new attempt', $$SELECT idem_claim('payments.create', 'sec-secret-4')$$)
) AS t(call, stmt);
RESET ROLE;
ALTER TABLE idem_records DROP CONSTRAINT regress_tenant_fk;
DROP TABLE regress_tenants;
DROP INDEX regress_key_once;
ALTER TABLE idem_records DROP CONSTRAINT regress_two_attempts;
ALTER TABLE idem_records DROP CONSTRAINT regress_no_secret;

-- Clean up: the roles, their grants and their records.
REVOKE EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_heartbeat,
                           idem_checkpoint, idem_replay, idem_resolve
    FROM regress_idem_app, regress_idem_other;
DELETE FROM idem_records WHERE role::text LIKE 'regress_idem_%';
DROP FUNCTION regress_error_of(text);
DROP ROLE regress_idem_app;
DROP ROLE regress_idem_other;
DROP ROLE regress_idem_nobody;
