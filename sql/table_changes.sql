--
-- Claims and completions keep the table's compiled CHECK constraints and
-- partial index predicates between calls.  They follow every change to
-- idem_records made while the session runs: constraints and indexes added
-- and dropped, and row triggers, BEFORE and AFTER.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY terse
SET idempotency.default_lease = '1h';

-- Compile once.
SELECT outcome FROM idem_claim('tc.op', 'tc-1', '{}');

-- A constraint added later is checked on the next claim ...
ALTER TABLE idem_records ADD CONSTRAINT tc_no_forbidden CHECK (key <> 'tc-forbidden');
SELECT outcome FROM idem_claim('tc.op', 'tc-forbidden', '{}');
SELECT count(*) AS written FROM idem_records WHERE key = 'tc-forbidden';
-- ... and no longer once dropped.
ALTER TABLE idem_records DROP CONSTRAINT tc_no_forbidden;
SELECT outcome FROM idem_claim('tc.op', 'tc-forbidden', '{}');

-- The same for a completion: refused, nothing changed, then accepted.
ALTER TABLE idem_records ADD CONSTRAINT tc_no_teapot CHECK (response_status <> 418);
SELECT token FROM idem_claim('tc.op', 'tc-2', '{}') \gset
SELECT idem_complete(:'token', 418, '{"brewed": false}');
SELECT state, response_status FROM idem_records WHERE key = 'tc-2';
ALTER TABLE idem_records DROP CONSTRAINT tc_no_teapot;
SELECT idem_complete(:'token', 418, '{"brewed": false}');
SELECT state, response_status FROM idem_records WHERE key = 'tc-2';

-- A constraint that looks at the whole row keeps state in the memory of
-- one write, so it is compiled for each: it holds on every write.
CREATE FUNCTION tc_row_ok(r idem_records) RETURNS boolean LANGUAGE sql IMMUTABLE
  AS $$ SELECT r.key <> 'tc-whole-bad' $$;
ALTER TABLE idem_records ADD CONSTRAINT tc_whole_row CHECK (tc_row_ok(idem_records));
SELECT outcome FROM idem_claim('tc.op', 'tc-whole-1', '{}');
SELECT outcome FROM idem_claim('tc.op', 'tc-whole-2', '{}');
SELECT outcome FROM idem_claim('tc.op', 'tc-whole-bad', '{}');
SELECT outcome FROM idem_claim('tc.op', 'tc-whole-3', '{}');
ALTER TABLE idem_records DROP CONSTRAINT tc_whole_row;
DROP FUNCTION tc_row_ok(idem_records);

-- A column dropped and added again moves to the end of the row; the writes
-- and reads follow it (in a transaction rolled back, to keep the table).
BEGIN;
ALTER TABLE idem_records DROP COLUMN resource_id;
ALTER TABLE idem_records ADD COLUMN resource_id text;
SELECT token FROM idem_claim('tc.op', 'tc-moved', '{}') \gset
SELECT idem_complete(:'token', 201, '{"id": "moved"}', resource_id => 'R-moved');
SELECT key, resource_id, response_status FROM idem_records WHERE key = 'tc-moved';
SELECT outcome, resource_id, body FROM idem_claim('tc.op', 'tc-moved', '{}');
ROLLBACK;

-- Row triggers fire for every write, AFTER triggers before the call returns;
-- an UPDATE OF trigger fires only for the writes that change its column.
-- (The functions write records as the table's owner, so the triggers run
-- as that role: the logs are given to it.)
SELECT pg_get_userbyid(relowner) AS records_owner
  FROM pg_class WHERE oid = 'idem_records'::regclass \gset
CREATE TABLE tc_log (n serial, op text, key text, state idem_state, status int);
ALTER TABLE tc_log OWNER TO :"records_owner";
CREATE FUNCTION tc_log_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO tc_log (op, key, state, status)
  VALUES (TG_NAME || ' ' || TG_OP, NEW.key, NEW.state, NEW.response_status);
  RETURN NEW;
END $$;
CREATE TRIGGER tc_before BEFORE INSERT OR UPDATE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION tc_log_row();
CREATE TRIGGER tc_after AFTER INSERT OR UPDATE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION tc_log_row();
CREATE TRIGGER tc_status AFTER UPDATE OF response_status ON idem_records
  FOR EACH ROW EXECUTE FUNCTION tc_log_row();
SELECT token FROM idem_claim('tc.op', 'tc-3', '{}') \gset
SELECT count(*) AS logged_after_claim FROM tc_log;
SELECT idem_heartbeat(:'token') IS NOT NULL AS extended;
SELECT idem_checkpoint(:'token', 'step 1');
SELECT idem_complete(:'token', 201, '{"id": 3}');
SELECT op, key, state, status FROM tc_log ORDER BY n;
DROP TRIGGER tc_before ON idem_records;
DROP TRIGGER tc_after ON idem_records;
DROP TRIGGER tc_status ON idem_records;
DROP FUNCTION tc_log_row();
DROP TABLE tc_log;

-- A partial index created later receives the records it covers.
CREATE INDEX tc_created ON idem_records (key) WHERE response_status = 201;
SELECT token FROM idem_claim('tc.op', 'tc-4', '{}') \gset
SELECT idem_complete(:'token', 201, '{"id": 4}');
SELECT token FROM idem_claim('tc.op', 'tc-5', '{}') \gset
SELECT idem_complete(:'token', 200, '{"id": 5}');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF)
SELECT key FROM idem_records WHERE response_status = 201 AND key >= 'tc-' ORDER BY key;
SELECT key FROM idem_records WHERE response_status = 201 AND key >= 'tc-' ORDER BY key;
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX tc_created;

-- The state machine's trigger follows a column dropped and added again:
-- it reads the new created_at of a record claimed since, not the dropped
-- column, and still refuses to change it.
BEGIN;
ALTER TABLE idem_records DROP COLUMN created_at;
ALTER TABLE idem_records ADD COLUMN created_at timestamptz;
SELECT outcome FROM idem_claim('tc.op', 'tc-guard', '{}');
UPDATE idem_records SET created_at = '2000-01-01 00:00:00+00' WHERE key = 'tc-guard';
ROLLBACK;

-- A claim fills in the defaults of the columns it does not write, as an
-- INSERT that does not name them would: a constant, and a sequence.
BEGIN;
ALTER TABLE idem_records ADD COLUMN tc_source text NOT NULL DEFAULT 'api';
ALTER TABLE idem_records ADD COLUMN tc_n serial;
SELECT outcome FROM idem_claim('tc.op', 'tc-default-1', '{}');
SELECT outcome FROM idem_claim('tc.op', 'tc-default-2', '{}');
SELECT key, tc_source FROM idem_records WHERE key LIKE 'tc-default-%' ORDER BY key;
SELECT max(tc_n) - min(tc_n) AS numbered_in_turn
  FROM idem_records WHERE key LIKE 'tc-default-%';
ROLLBACK;

-- The id of a new record is the identity column's next value, as an
-- INSERT takes it: it follows the sequence restarted, renamed, and the
-- identity dropped and added again (a new sequence), both for a claim
-- whose record waits for its completion (each DDL statement writes it
-- first) and, once a row trigger is added, for one written at once.
-- Rolled back, the claims take their ids from the old sequence again.
SELECT outcome FROM idem_claim('tc.op', 'tc-id-0', '{}');
SELECT id AS id0 FROM idem_records WHERE key = 'tc-id-0' \gset
BEGIN;
ALTER TABLE idem_records ALTER COLUMN id RESTART WITH 1000;
SELECT outcome FROM idem_claim('tc.op', 'tc-id-1', '{}');
ALTER SEQUENCE idem_records_id_seq RENAME TO tc_id_renamed;
SELECT outcome FROM idem_claim('tc.op', 'tc-id-2', '{}');
-- (the C edition's sequence is a member of its extension, released first)
SELECT count(*) = 1 AS c_edition FROM pg_extension WHERE extname = 'idempotency' \gset
\set ECHO none
\if :c_edition
ALTER EXTENSION idempotency DROP SEQUENCE tc_id_renamed;
\endif
\set ECHO all
ALTER TABLE idem_records ALTER COLUMN id DROP IDENTITY;
ALTER TABLE idem_records ALTER COLUMN id
  ADD GENERATED ALWAYS AS IDENTITY (START WITH 5000);
SELECT outcome FROM idem_claim('tc.op', 'tc-id-3', '{}');
CREATE FUNCTION tc_id_pass() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER tc_id_pass BEFORE INSERT ON idem_records
  FOR EACH ROW EXECUTE FUNCTION tc_id_pass();
SELECT outcome FROM idem_claim('tc.op', 'tc-id-4', '{}');
ALTER TABLE idem_records ALTER COLUMN id RESTART WITH 7000;
SELECT outcome FROM idem_claim('tc.op', 'tc-id-5', '{}');
SELECT key, id FROM idem_records WHERE key LIKE 'tc-id-%' AND key <> 'tc-id-0'
 ORDER BY key;
ROLLBACK;
SELECT outcome FROM idem_claim('tc.op', 'tc-id-6', '{}');
SELECT id - :id0 AS after_rollback FROM idem_records WHERE key = 'tc-id-6';
DELETE FROM idem_records WHERE key LIKE 'tc-id-%';

-- Statement triggers fire once around each write, as around an INSERT or
-- UPDATE of one row.
CREATE TABLE tc_stmt_log (n serial, what text);
ALTER TABLE tc_stmt_log OWNER TO :"records_owner";
CREATE FUNCTION tc_log_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO tc_stmt_log (what) VALUES (TG_NAME || ' ' || TG_OP);
  RETURN NULL;
END $$;
CREATE TRIGGER tc_bs BEFORE INSERT OR UPDATE ON idem_records
  FOR EACH STATEMENT EXECUTE FUNCTION tc_log_stmt();
CREATE TRIGGER tc_as AFTER INSERT OR UPDATE ON idem_records
  FOR EACH STATEMENT EXECUTE FUNCTION tc_log_stmt();
CREATE TRIGGER tc_as_status AFTER UPDATE OF response_status ON idem_records
  FOR EACH STATEMENT EXECUTE FUNCTION tc_log_stmt();
SELECT token FROM idem_claim('tc.op', 'tc-stmt', '{}') \gset
SELECT idem_heartbeat(:'token') IS NOT NULL AS extended;
SELECT idem_complete(:'token', 201);
SELECT what FROM tc_stmt_log ORDER BY n;
DROP TRIGGER tc_bs ON idem_records;
DROP TRIGGER tc_as ON idem_records;
DROP TRIGGER tc_as_status ON idem_records;

-- Triggers with transition tables are not supported on the writes that
-- would fill them: such a write is refused, and writes nothing.
CREATE TRIGGER tc_new_rows AFTER INSERT ON idem_records
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION tc_log_stmt();
SELECT outcome FROM idem_claim('tc.op', 'tc-transition', '{}');
SELECT count(*) AS written FROM idem_records WHERE key = 'tc-transition';
DROP TRIGGER tc_new_rows ON idem_records;
DROP FUNCTION tc_log_stmt();
DROP TABLE tc_stmt_log;

-- A rebuild of the compiled constraints that fails half-way (here a CHECK
-- whose IMMUTABLE function raises while the planner folds it) leaves nothing
-- half-built behind: the next claim builds them again, and every CHECK
-- holds, the ones after the failing one included.
CREATE FUNCTION tc_fold_ok(t text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF current_setting('tc.fold_fails', true) = 'on' THEN
    RAISE EXCEPTION 'tc_fold_ok raised';
  END IF;
  RETURN true;
END $$;
ALTER TABLE idem_records ADD CONSTRAINT tc_a_fold CHECK (tc_fold_ok('a'));
ALTER TABLE idem_records ADD CONSTRAINT tc_z_no_451 CHECK (response_status <> 451);
SET tc.fold_fails = on;
SELECT outcome FROM idem_claim('tc.op', 'tc-fold-1', '{}');
RESET tc.fold_fails;
SELECT token FROM idem_claim('tc.op', 'tc-fold-2', '{}') \gset
SELECT idem_complete(:'token', 451, '{}');
SELECT idem_complete(:'token', 201, '{}');
SELECT key, state, response_status FROM idem_records WHERE key LIKE 'tc-fold-%' ORDER BY key;
ALTER TABLE idem_records DROP CONSTRAINT tc_a_fold;
ALTER TABLE idem_records DROP CONSTRAINT tc_z_no_451;
DROP FUNCTION tc_fold_ok(text);

DELETE FROM idem_records WHERE operation = 'tc.op';

-- The extension's schema renamed while a session keeps statements naming
-- it: they are prepared again under the new name.  The table renamed: a
-- clear error until it gets its name back.  (In a database of its own.)
\set regress_db :DBNAME
CREATE DATABASE regress_idem_rename;
\c regress_idem_rename
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
-- A new key is written once there too (not in the table before its
-- completion or the commit), also when the schema is not on the search path.
BEGIN;
SELECT outcome FROM idem.idem_claim('rn.op', 'rn-once', '{}');
SELECT count(*) AS written_yet FROM idem.idem_records WHERE key = 'rn-once';
ROLLBACK;
SET search_path = idem;
SET idempotency.default_lease = '1h';
SELECT token FROM idem_claim('rn.op', 'rn-1', '{}', on_lease_expiry => 'retry') \gset
SELECT idem_fail(:'token', 503, retryable => true);
SELECT outcome, attempt, token AS token FROM idem_claim('rn.op', 'rn-1', '{}') \gset
SELECT idem_fail(:'token', 503, retryable => true);
ALTER SCHEMA idem RENAME TO idem_renamed;
-- (the SQL edition's functions name their schema: its installer, run
-- again, names the new one)
\set ECHO none
\if :c_edition
\else
\set schema idem_renamed
\i idempotency_sql.sql
\set ON_ERROR_STOP off
\endif
\set ECHO all
SET search_path = idem_renamed;
SELECT outcome, attempt FROM idem_claim('rn.op', 'rn-1', '{}');
BEGIN;
ALTER TABLE idem_records RENAME TO idem_records_old;
\set VERBOSITY default
SELECT outcome FROM idem_claim('rn.op', 'rn-2', '{}');
\set VERBOSITY terse
ROLLBACK;
SELECT outcome FROM idem_claim('rn.op', 'rn-2', '{}');
SELECT key, state, attempt FROM idem_renamed.idem_records ORDER BY key;

-- The unique index built again in version 1.0's column order while this
-- session keeps what it looked up: claims, completions and replays follow
-- the index's columns, whatever their order.  One that is not unique on
-- the scope and key is refused (55000) and nothing is written.
DROP INDEX idem_records_scope_key;
CREATE UNIQUE INDEX idem_records_scope_key
    ON idem_records (role, tenant, caller, operation, key);
SELECT outcome, attempt FROM idem_claim('rn.op', 'rn-2', '{}');
SELECT outcome, token AS token FROM idem_claim('rn.op', 'rn-3', '{"n": 3}') \gset
SELECT idem_complete(:'token', 201, '{"id": 3}');
SELECT outcome, http_status, body FROM idem_claim('rn.op', 'rn-3', '{"n": 3}');
SELECT outcome FROM idem_claim('rn.op', 'rn-3', '{"n": 4}');
BEGIN;
DROP INDEX idem_records_scope_key;
CREATE UNIQUE INDEX idem_records_scope_key
    ON idem_records (role, tenant, caller, key, operation, id);
\set VERBOSITY default
SELECT outcome FROM idem_claim('rn.op', 'rn-4', '{}');
\set VERBOSITY terse
ROLLBACK;
BEGIN;
DROP INDEX idem_records_scope_key;
CREATE INDEX idem_records_scope_key
    ON idem_records (key, operation, caller, tenant, role);
SELECT outcome FROM idem_claim('rn.op', 'rn-4', '{}');
ROLLBACK;
BEGIN;
DROP INDEX idem_records_scope_key;
CREATE UNIQUE INDEX idem_records_scope_key
    ON idem_records (key, operation, caller, tenant, role) WHERE key <> '';
SELECT outcome FROM idem_claim('rn.op', 'rn-4', '{}');
ROLLBACK;
SELECT outcome FROM idem_claim('rn.op', 'rn-4', '{}');
SELECT key, state, attempt FROM idem_renamed.idem_records ORDER BY key;
-- A unique index that is not valid (a CREATE INDEX CONCURRENTLY that
-- failed, here marked so by hand) may miss records of a key: refused
-- (55000) until it is rebuilt, and nothing is written.
BEGIN;
UPDATE pg_index SET indisvalid = false
 WHERE indexrelid = 'idem_renamed.idem_records_scope_key'::regclass;
\set VERBOSITY default
SELECT outcome FROM idem_claim('rn.op', 'rn-5', '{}');
\set VERBOSITY terse
ROLLBACK;
-- The unique index renamed away: refused with a clear error (42704) that
-- names it, until it is renamed back, as for the table;
-- its name given to a table instead is not the unique index (55000).
BEGIN;
ALTER INDEX idem_records_scope_key RENAME TO rn_scope_key;
\set VERBOSITY default
SELECT outcome FROM idem_claim('rn.op', 'rn-5', '{}');
\set VERBOSITY terse
ROLLBACK;
BEGIN;
ALTER INDEX idem_records_scope_key RENAME TO rn_scope_key;
CREATE TABLE idem_records_scope_key (key text);
SELECT outcome FROM idem_claim('rn.op', 'rn-5', '{}');
ROLLBACK;
-- The extension's enum types and their labels keep their names: renamed,
-- claims are refused with a clear error (42704) until they are renamed
-- back; a record holding a label renamed away, whose name was then given
-- to a new label, is refused (55000).
BEGIN;
ALTER TYPE idem_state RENAME VALUE 'processing' TO 'rn_processing';
SELECT outcome FROM idem_claim('rn.op', 'rn-5', '{}');
ROLLBACK;
BEGIN;
ALTER TYPE idem_lease_policy RENAME TO rn_policy;
SELECT outcome FROM idem_claim('rn.op', 'rn-5', '{}');
ROLLBACK;
BEGIN;
ALTER TYPE idem_state RENAME VALUE 'processing' TO 'rn_processing';
ALTER TYPE idem_state ADD VALUE 'processing';
SELECT outcome FROM idem_claim('rn.op', 'rn-1', '{}');
ROLLBACK;
SELECT outcome, attempt FROM idem_claim('rn.op', 'rn-1', '{}');
SELECT count(*) AS written FROM idem_renamed.idem_records WHERE key = 'rn-5';
\c :regress_db
DROP DATABASE regress_idem_rename;

-- (The domain column is added with a default that is then dropped, since
-- the table may hold rows.)
\set VERBOSITY terse
-- A column of a NOT NULL domain added to idem_records without a default:
-- a plain INSERT that does not name it fails (23502, the planner coerces the
-- missing column's NULL to the domain), so a claim must fail too and write
-- nothing.
CREATE DOMAIN af_required AS integer NOT NULL;
CREATE DOMAIN af_present AS integer CHECK (VALUE IS NOT NULL);
ALTER TABLE idem_records ADD COLUMN af_a af_required DEFAULT 0;
ALTER TABLE idem_records ALTER COLUMN af_a DROP DEFAULT;
SELECT outcome FROM idem_claim('af.op', 'af-domain-1', '{}');
SELECT count(*) AS written FROM idem_records WHERE key = 'af-domain-1';
ALTER TABLE idem_records DROP COLUMN af_a;
ALTER TABLE idem_records ADD COLUMN af_b af_present DEFAULT 0;
ALTER TABLE idem_records ALTER COLUMN af_b DROP DEFAULT;
SELECT outcome FROM idem_claim('af.op', 'af-domain-2', '{}');
SELECT count(*) AS written FROM idem_records WHERE key = 'af-domain-2';
ALTER TABLE idem_records DROP COLUMN af_b;
DROP DOMAIN af_required;
DROP DOMAIN af_present;
DELETE FROM idem_records WHERE operation = 'af.op';
\set VERBOSITY default


-- A column of the extension's whose type is changed (ALTER COLUMN ... TYPE
-- rewrites the rows) is refused before any record is read or written
-- (42804), whatever the call: the library would read and write it as the
-- type it created.  Its type given back, the records are served again.
\set VERBOSITY terse
SELECT token AS ct_token FROM idem_claim('ct.op', 'ct-1', '{}') \gset
SELECT idem_complete(:'ct_token', 201, '{"id": "ct-1"}');
ALTER TABLE idem_records ALTER COLUMN response_body TYPE text USING response_body::text;
SELECT outcome, body FROM idem_claim('ct.op', 'ct-1', '{}');
SELECT outcome FROM idem_claim('ct.op', 'ct-2', '{}');
\set VERBOSITY sqlstate
SELECT * FROM idem_replay('ct.op', 'ct-1');
\set VERBOSITY terse
SELECT count(*) AS written FROM idem_records WHERE key = 'ct-2';
ALTER TABLE idem_records ALTER COLUMN response_body TYPE jsonb USING response_body::jsonb;
SELECT outcome, body FROM idem_claim('ct.op', 'ct-1', '{}');
-- A domain over the type is refused too (the library's writes would not
-- check its constraints), and so is a type of the same representation.
CREATE DOMAIN ct_status AS integer CHECK (VALUE < 600);
ALTER TABLE idem_records ALTER COLUMN response_status TYPE ct_status;
SELECT outcome, http_status FROM idem_claim('ct.op', 'ct-1', '{}');
ALTER TABLE idem_records ALTER COLUMN response_status TYPE integer;
DROP DOMAIN ct_status;
SELECT token AS ct_token FROM idem_claim('ct.op', 'ct-3', '{}') \gset
ALTER TABLE idem_records ALTER COLUMN key TYPE varchar(300) COLLATE "C";
SELECT outcome FROM idem_claim('ct.op', 'ct-1', '{}');
SELECT idem_complete(:'ct_token', 201);
ALTER TABLE idem_records ALTER COLUMN key TYPE text COLLATE "C";
SELECT outcome FROM idem_claim('ct.op', 'ct-1', '{}');
SELECT idem_complete(:'ct_token', 201);
SELECT key, state, response_status FROM idem_records
 WHERE operation = 'ct.op' ORDER BY key;

-- The scope's columns keep collation "C": a claim finds its key by bytes,
-- and in a unique index ordered by another collation it missed records
-- that exist, answering proceed for a finished key inside a transaction
-- block.  Such a column is refused (42P21), and an index of the scope in
-- another collation too (55000).  The other collation is ICU's root locale
-- where PostgreSQL is built with ICU, else libc's C.utf8, which orders as
-- "C" does but is refused all the same.
DO $$
BEGIN
  CREATE COLLATION ct_other (provider = icu, locale = 'und');
EXCEPTION WHEN feature_not_supported THEN
  CREATE COLLATION ct_other (provider = libc, locale = 'C.utf8');
END $$;
CREATE FUNCTION pg_temp.ct_answer(k text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN (SELECT outcome FROM idem_claim('ct.op', k, '{}'));
EXCEPTION WHEN OTHERS THEN
  RETURN 'SQLSTATE ' || SQLSTATE;
END $$;
SELECT count(*) AS finished
  FROM (SELECT idem_complete((SELECT token FROM idem_claim('ct.op', k, '{}')), 200)
          FROM unnest('{a,B,c,D,e,F,g,H,_x,-y,Z1,z2,aa,AB}'::text[]) k) s;
ALTER TABLE idem_records ALTER COLUMN key TYPE text COLLATE ct_other;
BEGIN;
SELECT pg_temp.ct_answer('a');
ROLLBACK;
SELECT outcome FROM idem_claim('ct.op', 'a', '{}');
ALTER TABLE idem_records ALTER COLUMN key TYPE text COLLATE "C";
DROP INDEX idem_records_scope_key;
CREATE UNIQUE INDEX idem_records_scope_key ON idem_records
    (key COLLATE ct_other, operation, caller, tenant, role);
BEGIN;
SELECT pg_temp.ct_answer('a');
ROLLBACK;
SELECT outcome FROM idem_claim('ct.op', 'a', '{}');
DROP INDEX idem_records_scope_key;
CREATE UNIQUE INDEX idem_records_scope_key ON idem_records
    (key, operation, caller, tenant, role);
SELECT k, (SELECT outcome FROM idem_claim('ct.op', k, '{}'))
  FROM unnest('{a,B,c,D,e,F,g,H,_x,-y,Z1,z2,aa,AB}'::text[]) k;
DELETE FROM idem_records WHERE operation = 'ct.op';
DROP COLLATION ct_other;
\set VERBOSITY default

-- A statement that rewrites idem_records copies its rows to new storage and
-- discards the old: a claim or completion written while it runs (from a
-- USING expression here) would be lost with the old storage, and the key
-- would answer proceed again.  It is refused, and the statement fails.
CREATE TABLE tc_rewrite_log (key text, outcome text);
CREATE FUNCTION tc_claim_in_rewrite(k text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO tc_rewrite_log SELECT k, outcome FROM idem_claim('tc.op', k, '{}');
  RETURN 1;
END $$;
SELECT outcome FROM idem_claim('tc.op', 'tc-rewrite-1', '{}');
SELECT outcome FROM idem_claim('tc.op', 'tc-rewrite-2', '{}');
\set VERBOSITY sqlstate
ALTER TABLE idem_records ALTER COLUMN attempt TYPE int
  USING (attempt * tc_claim_in_rewrite('tc-rewritten-' || id));
\set VERBOSITY default
ALTER TABLE idem_records ALTER COLUMN attempt TYPE int
  USING (attempt * tc_claim_in_rewrite('tc-rewritten-' || id));
SELECT count(*) AS claims_answered FROM tc_rewrite_log;
SELECT key FROM idem_records WHERE key LIKE 'tc-rewrit%' ORDER BY key;

-- So is every other write of a record there: a new attempt of a key that
-- failed retryably, the takeover of an ended lease, a lease marked
-- unknown, and the lease and cleanup passes.  Each would be lost too.
CREATE FUNCTION tc_run_in_rewrite(q text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  INSERT INTO tc_rewrite_log VALUES (q, 'ran');
  RETURN 1;
END $$;
SELECT idem_fail((SELECT token FROM idem_claim('tc.op', 'tc-rewrite-retry', '{}')),
                 503, retryable => true);
SELECT outcome FROM idem_claim('tc.op', 'tc-rewrite-takeover', '{}',
                               on_lease_expiry => 'retry');
SELECT outcome FROM idem_claim('tc.op', 'tc-rewrite-unknown', '{}');
SELECT idem_complete((SELECT token FROM idem_claim('tc.op', 'tc-rewrite-expired', '{}')),
                     200, '{}');
UPDATE idem_records SET locked_until = now() - interval '1 minute'
 WHERE key IN ('tc-rewrite-takeover', 'tc-rewrite-unknown');
UPDATE idem_records SET completed_at = now() - interval '31 days',
                        expires_at = now() - interval '30 days'
 WHERE key = 'tc-rewrite-expired';
SET idempotency.tombstone_ttl = 0;
\set VERBOSITY sqlstate
ALTER TABLE idem_records ALTER COLUMN attempt TYPE int
  USING (attempt * CASE WHEN key = 'tc-rewrite-retry' THEN tc_run_in_rewrite(
    $q$SELECT idem_claim('tc.op', 'tc-rewrite-retry', '{}')$q$) ELSE 1 END);
ALTER TABLE idem_records ALTER COLUMN attempt TYPE int
  USING (attempt * CASE WHEN key = 'tc-rewrite-takeover' THEN tc_run_in_rewrite(
    $q$SELECT idem_claim('tc.op', 'tc-rewrite-takeover', '{}')$q$) ELSE 1 END);
ALTER TABLE idem_records ALTER COLUMN attempt TYPE int
  USING (attempt * CASE WHEN key = 'tc-rewrite-unknown' THEN tc_run_in_rewrite(
    $q$SELECT idem_claim('tc.op', 'tc-rewrite-unknown', '{}')$q$) ELSE 1 END);
ALTER TABLE idem_records ALTER COLUMN attempt TYPE int
  USING (attempt * CASE WHEN key = 'tc-rewrite-unknown' THEN tc_run_in_rewrite(
    $q$SELECT idem_expire_leases()$q$) ELSE 1 END);
ALTER TABLE idem_records ALTER COLUMN attempt TYPE int
  USING (attempt * CASE WHEN key = 'tc-rewrite-expired' THEN tc_run_in_rewrite(
    $q$SELECT idem_cleanup()$q$) ELSE 1 END);
\set VERBOSITY default
RESET idempotency.tombstone_ttl;
SELECT count(*) AS writes_answered FROM tc_rewrite_log;
SELECT key, state, attempt FROM idem_records
 WHERE key LIKE 'tc-rewrite-%' ORDER BY key;
-- Each key's next attempt is given once, after the statements.
SELECT k, (SELECT outcome || ' ' || attempt FROM idem_claim('tc.op', k, '{}')) AS first,
          (SELECT outcome FROM idem_claim('tc.op', k, '{}')) AS second
  FROM unnest('{tc-rewrite-retry,tc-rewrite-takeover,tc-rewrite-unknown}'::text[]) k;

-- A rewrite of the archive refuses them too: cleanup with cleanup_action
-- 'archive' would delete records whose copies went to the archive's old
-- storage (from a table_rewrite event trigger here).
CREATE FUNCTION tc_cleanup_on_rewrite() RETURNS event_trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idem_cleanup();
  INSERT INTO tc_rewrite_log VALUES ('idem_cleanup', 'ran');
END $$;
CREATE EVENT TRIGGER tc_cleanup_on_rewrite ON table_rewrite
  EXECUTE FUNCTION tc_cleanup_on_rewrite();
SET idempotency.cleanup_action = 'archive';
SET idempotency.tombstone_ttl = 0;
\set VERBOSITY sqlstate
ALTER TABLE idem_records_archive ALTER COLUMN attempt TYPE int USING (attempt + 0);
\set VERBOSITY default
RESET idempotency.tombstone_ttl;
RESET idempotency.cleanup_action;
DROP EVENT TRIGGER tc_cleanup_on_rewrite;
DROP FUNCTION tc_cleanup_on_rewrite();
SELECT count(*) AS writes_answered FROM tc_rewrite_log;
SELECT key, state FROM idem_records WHERE key = 'tc-rewrite-expired';

-- So is a write from an expression of the archive's rewrite itself: a
-- cleanup that archives, and a claim that reuses an expired record, which
-- archives it first.  (The archive holds a row, so that the expression
-- runs.)
SET idempotency.cleanup_action = 'archive';
SET idempotency.tombstone_ttl = 0;
SELECT idem_cleanup() IS NOT NULL AS cleaned;
SELECT count(*) AS archived FROM idem_records_archive WHERE key = 'tc-rewrite-expired';
SELECT idem_complete((SELECT token FROM idem_claim('tc.op', k, '{}')), 200, '{}')
  FROM unnest('{tc-rewrite-arch-1,tc-rewrite-arch-2}'::text[]) k;
UPDATE idem_records SET completed_at = now() - interval '31 days',
                        expires_at = now() - interval '30 days'
 WHERE key IN ('tc-rewrite-arch-1', 'tc-rewrite-arch-2');
\set VERBOSITY sqlstate
ALTER TABLE idem_records_archive ALTER COLUMN attempt TYPE int
  USING (attempt * tc_run_in_rewrite($q$SELECT idem_cleanup()$q$));
ALTER TABLE idem_records_archive ALTER COLUMN attempt TYPE int
  USING (attempt * tc_run_in_rewrite(
    $q$SELECT idem_claim('tc.op', 'tc-rewrite-arch-2', '{"n": 2}', on_expired => 'proceed')$q$));
\set VERBOSITY default
RESET idempotency.tombstone_ttl;
RESET idempotency.cleanup_action;
SELECT key, state, attempt FROM idem_records WHERE key LIKE 'tc-rewrite-arch-%' ORDER BY key;
SELECT count(*) AS archived FROM idem_records_archive WHERE key LIKE 'tc-rewrite-arch-%';
DELETE FROM idem_records_archive WHERE key LIKE 'tc-rewrit%';

DELETE FROM idem_records WHERE key LIKE 'tc-rewrit%';
DROP FUNCTION tc_run_in_rewrite(text);
DROP FUNCTION tc_claim_in_rewrite(text);
DROP TABLE tc_rewrite_log;
