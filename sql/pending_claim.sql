--
-- A new key claimed inside a transaction block is written once: finished
-- by its completion in the same transaction, or as processing when the
-- transaction commits or prepares first.  Until then it holds its key
-- lock; every function of the extension sees the claim as before, and a
-- savepoint rolled back takes back exactly what it covered.
--
-- The SQL edition writes the record at the claim, processing, and updates
-- it at the completion, holding its key lock to the end of the
-- transaction: its answers are the same, its writes and what the owner
-- sees in the claiming transaction are not (docs/editions.md;
-- sql_edition/test/expected/pending_claim.out).
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY terse
SET idempotency.default_lease = '1h';

-- What this transaction wrote to idem_records since :ins and :upd were
-- taken (pg_stat_xact_user_tables counts rows inserted and updated, also
-- by subtransactions rolled back; counts of earlier transactions that were
-- not reported yet are in it too, hence the difference), and the key locks
-- it holds (advisory locks: the C edition's with objsubid 478, the SQL
-- edition's on a bigint, objsubid 1).
CREATE FUNCTION pg_temp.counts(OUT ins bigint, OUT upd bigint) LANGUAGE sql AS $$
  SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_upd), 0)::bigint
    FROM pg_stat_xact_user_tables WHERE relname = 'idem_records'
$$;
CREATE FUNCTION pg_temp.writes(ins bigint, upd bigint)
RETURNS TABLE (inserted bigint, updated bigint, key_locks bigint)
LANGUAGE sql AS $$
  SELECT c.ins - writes.ins, c.upd - writes.upd,
         (SELECT count(*) FROM pg_locks
           WHERE locktype = 'advisory' AND objsubid IN (1, 478) AND pid = pg_backend_pid())
    FROM pg_temp.counts() c
$$;
CREATE FUNCTION pg_temp.record(k text)
RETURNS TABLE (state idem_state, attempt int, leased boolean, has_token boolean,
               response_status int, response_body jsonb)
LANGUAGE sql AS $$
  SELECT state, attempt, locked_until IS NOT NULL, attempt_token IS NOT NULL,
         response_status, response_body
    FROM idem_records WHERE operation = 'pc.op' AND key = k
$$;

-- Claimed and completed in one transaction: one insert, no update; the
-- key lock is held from the claim to the completion.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-1', '{"n": 1}') \gset
SELECT * FROM pg_temp.writes(:ins, :upd);
SELECT * FROM pg_temp.record('pc-1');
SELECT idem_complete(:'token', 201, '{"id": 1}');
SELECT * FROM pg_temp.writes(:ins, :upd);
SELECT * FROM pg_temp.record('pc-1');
COMMIT;
SELECT outcome, http_status, body FROM idem_claim('pc.op', 'pc-1', '{"n": 1}');

-- The same with idem_fail: a stable failure is replayed, a retryable one
-- frees the key for attempt 2.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-2', '{"n": 2}') \gset
SELECT idem_fail(:'token', 409, '{"error": "conflict"}');
SELECT token FROM idem_claim('pc.op', 'pc-3', '{"n": 3}') \gset
SELECT idem_fail(:'token', 503, retryable => true);
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT * FROM pg_temp.record('pc-2');
SELECT * FROM pg_temp.record('pc-3');
SELECT outcome, http_status FROM idem_claim('pc.op', 'pc-2', '{"n": 2}');
SELECT outcome, attempt FROM idem_claim('pc.op', 'pc-3', '{"n": 3}');

-- Committed without a completion: the record is processing, leased, and
-- its token completes it in a later transaction.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-4', '{"n": 4}') \gset
COMMIT;
SELECT * FROM pg_temp.record('pc-4');
SELECT idem_complete(:'token', 201, '{"id": 4}');
SELECT outcome, body FROM idem_claim('pc.op', 'pc-4', '{"n": 4}');

-- Every function of the extension sees a pending claim: a second claim of
-- the key is in_progress, idem_replay shows it, a heartbeat extends it.
-- Once written, the completion updates it as before.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-5', '{"n": 5}') \gset
SELECT outcome FROM idem_claim('pc.op', 'pc-5', '{"n": 5}');
SELECT outcome, state FROM idem_replay('pc.op', 'pc-5');
SELECT idem_heartbeat(:'token', '2h') > now() + interval '1h' AS extended;
SELECT idem_complete(:'token', 201, '{"id": 5}');
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT * FROM pg_temp.record('pc-5');

-- idem_list in the claiming transaction lists the pending claim at its
-- first call (it reads after writing it).
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-5l', '{"n": 5}');
SELECT key, state FROM idem_list('processing', 'pc.op');
ROLLBACK;

-- Two new keys in one transaction: the second claim writes the first one's
-- record (processing) before it reads; each completes.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token AS t6 FROM idem_claim('pc.op', 'pc-6', '{"n": 6}') \gset
SELECT token AS t7 FROM idem_claim('pc.op', 'pc-7', '{"n": 7}') \gset
SELECT idem_complete(:'t7', 201, '{"id": 7}');
SELECT idem_complete(:'t6', 201, '{"id": 6}');
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT key, state, response_body FROM idem_records
 WHERE operation = 'pc.op' AND key IN ('pc-6', 'pc-7') ORDER BY key;

-- Savepoints.  A claim in a savepoint rolled back is gone, with its key
-- lock; the key is new again.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SAVEPOINT s;
SELECT token FROM idem_claim('pc.op', 'pc-8', '{"n": 8}') \gset
ROLLBACK TO SAVEPOINT s;
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT count(*) AS records FROM idem_records WHERE key = 'pc-8';
SELECT outcome FROM idem_claim('pc.op', 'pc-8', '{"n": 8}');

-- A completion in a savepoint rolled back is undone, the claim stands: it
-- commits processing, and its token still completes it.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-9', '{"n": 9}') \gset
SAVEPOINT s;
SELECT idem_complete(:'token', 201, '{"id": 9}');
ROLLBACK TO SAVEPOINT s;
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT * FROM pg_temp.record('pc-9');
SELECT idem_complete(:'token', 201, '{"id": 9}');
SELECT * FROM pg_temp.record('pc-9');

-- Completed again after the rolled back completion, in the transaction.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-10', '{"n": 10}') \gset
SAVEPOINT s;
SELECT idem_complete(:'token', 500, '{"id": "wrong"}');
ROLLBACK TO SAVEPOINT s;
SELECT idem_complete(:'token', 201, '{"id": 10}');
COMMIT;
SELECT * FROM pg_temp.record('pc-10');

-- A completion in a savepoint released: the record and the claim share
-- their fate from then on; the key lock is held until the end.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-11', '{"n": 11}') \gset
SAVEPOINT s;
SELECT idem_complete(:'token', 201, '{"id": 11}');
RELEASE SAVEPOINT s;
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT * FROM pg_temp.record('pc-11');

-- A claim in a savepoint released, completed outside it.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SAVEPOINT s;
SELECT token FROM idem_claim('pc.op', 'pc-12', '{"n": 12}') \gset
RELEASE SAVEPOINT s;
SELECT idem_complete(:'token', 201, '{"id": 12}');
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT * FROM pg_temp.record('pc-12');

-- A claim in a PL/pgSQL block whose exception handler runs is taken back.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
DO $$
BEGIN
  BEGIN
    PERFORM idem_claim('pc.op', 'pc-13', '{"n": 13}');
    RAISE EXCEPTION 'business rule';
  EXCEPTION WHEN raise_exception THEN
    NULL;
  END;
END $$;
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT count(*) AS records FROM idem_records WHERE key = 'pc-13';

-- An error after the claim: the transaction aborts, nothing is written.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-14', '{"n": 14}') \gset
SELECT 1 / 0;
COMMIT;
SELECT count(*) AS records FROM idem_records WHERE key = 'pc-14';

-- Outside a transaction block a claim commits at once: written at once.
SELECT outcome FROM idem_claim('pc.op', 'pc-15', '{"n": 15}');
SELECT * FROM pg_temp.record('pc-15');

-- The owner's INSERT or COPY of a row with the key of a pending claim
-- does not meet the claim (in a savepoint rolled back here, and the claim
-- completes; kept, it would fail the completion or the COMMIT with 23505);
-- a DELETE or TRUNCATE of the table does not remove the claim.
BEGIN;
SELECT token FROM idem_claim('pc.op', 'pc-15i', '{"n": 15}') \gset
SAVEPOINT s;
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
                          attempt, on_lease_expiry, ttl, created_at, claimed_at,
                          updated_at, expires_at, locked_until)
VALUES ('', '', 'pc.op', 'pc-15i', decode(repeat('00', 32), 'hex'),
        'processing', 1, 'unknown', '1 day', now(), now(), now(), now() + '1 day',
        now() + '1 hour');
ROLLBACK TO SAVEPOINT s;
SELECT idem_complete(:'token', 201, '{"id": "15i"}');
COMMIT;
SELECT * FROM pg_temp.record('pc-15i');
BEGIN;
SELECT token FROM idem_claim('pc.op', 'pc-15c', '{"n": 15}') \gset
SAVEPOINT s;
COPY idem_records (tenant, caller, operation, key, fingerprint, state, attempt,
                   on_lease_expiry, ttl, created_at, claimed_at, updated_at, completed_at,
                   expires_at, response_status)
FROM stdin;
		pc.op	pc-15c	\\x0000000000000000000000000000000000000000000000000000000000000000	succeeded	1	unknown	1 day	2026-01-01 00:00:00+00	2026-01-01 00:00:00+00	2026-01-01 00:00:00+00	2026-01-01 00:00:00+00	2099-01-01 00:00:00+00	201
\.
ROLLBACK TO SAVEPOINT s;
SELECT idem_complete(:'token', 201, '{"id": "15c"}');
COMMIT;
SELECT * FROM pg_temp.record('pc-15c');
BEGIN;
SELECT token FROM idem_claim('pc.op', 'pc-15d', '{"n": 15}') \gset
DELETE FROM idem_records WHERE key = 'pc-15d';
SELECT idem_complete(:'token', 201, '{"id": "15d"}');
COMMIT;
SELECT * FROM pg_temp.record('pc-15d');
BEGIN;
SELECT token FROM idem_claim('pc.op', 'pc-15t', '{"n": 15}') \gset
SAVEPOINT s;
TRUNCATE idem_records;
SELECT outcome, attempt FROM idem_claim('pc.op', 'pc-15t', '{"n": 15}');
ROLLBACK TO SAVEPOINT s;
SELECT idem_complete(:'token', 201, '{"id": "15t"}');
COMMIT;
SELECT * FROM pg_temp.record('pc-15t');

-- A table the owner changed (here a CHECK constraint): every claim writes
-- its record at once, so the owner's constraint sees it at the claim.
ALTER TABLE idem_records ADD CONSTRAINT pc_no_16 CHECK (key <> 'pc-16');
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT outcome FROM idem_claim('pc.op', 'pc-16', '{"n": 16}');
ROLLBACK;
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-17', '{"n": 17}') \gset
SELECT * FROM pg_temp.writes(:ins, :upd);
SELECT idem_complete(:'token', 201, '{"id": 17}');
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
ALTER TABLE idem_records DROP CONSTRAINT pc_no_16;

-- The same for a default the owner gives a column of the extension's, and
-- for a constraint or index of the extension's that the owner replaced
-- under its name: the claim writes its record at once, so the row and the
-- errors are those of a claim followed by its completion.  (Written once,
-- the finished row got the default where the completion stores NULL, and
-- a claim refused by the replaced constraint answered proceed and failed
-- at the commit.)
ALTER TABLE idem_records ALTER COLUMN response_headers SET DEFAULT '{"x-default": "1"}';
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-17d', '{"n": 17}') \gset
SELECT idem_complete(:'token', 201);
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT response_headers FROM idem_records WHERE key = 'pc-17d';
ALTER TABLE idem_records ALTER COLUMN response_headers DROP DEFAULT;
ALTER TABLE idem_records DROP CONSTRAINT idem_records_status_range;
ALTER TABLE idem_records ADD CONSTRAINT idem_records_status_range
  CHECK (key <> 'pc-17c' AND response_status BETWEEN 100 AND 599);
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-17c', '{"n": 17}');
ROLLBACK;
ALTER TABLE idem_records DROP CONSTRAINT idem_records_status_range;
ALTER TABLE idem_records ADD CONSTRAINT idem_records_status_range
  CHECK (response_status BETWEEN 100 AND 599);
DROP INDEX idem_records_expiry;
CREATE UNIQUE INDEX idem_records_expiry ON idem_records (operation)
  WHERE key IN ('pc-17', 'pc-17u');
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-17u', '{"n": 17}');
ROLLBACK;
DROP INDEX idem_records_expiry;
CREATE INDEX idem_records_expiry ON idem_records (expires_at)
  WHERE state IN ('succeeded', 'failed', 'retryable');
-- The same for an index of the extension's replaced by one whose predicate
-- or column can fail on a row: the claim fails, not the commit after it
-- answered proceed.
DROP INDEX idem_records_lease;
CREATE INDEX idem_records_lease ON idem_records (locked_until)
  WHERE 1 / (CASE key WHEN 'pc-17p' THEN 0 ELSE 1 END) > 0;
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-17p', '{"n": 17}');
COMMIT;
DROP INDEX idem_records_lease;
CREATE INDEX idem_records_lease ON idem_records (locked_until)
  WHERE state = 'processing';

-- A key too long for the unique index (idempotency.max_key_length raised,
-- a key that does not compress): the claim fails, not the commit.
SET idempotency.max_key_length = 8192;
BEGIN;
SELECT outcome FROM idem_claim('pc.op',
  (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 100) i), '{"n": 17}');
COMMIT;
RESET idempotency.max_key_length;

-- (idem_records attached as a partition: sql/pending_partition.sql)

-- A function of another schema that shadows a built-in called by a CHECK
-- of the extension's: the constraint counts as replaced whatever the
-- session's search_path, so the claim fails, not the commit.
CREATE SCHEMA pc_shadow;
CREATE FUNCTION pc_shadow.octet_length(bytea) RETURNS int
  LANGUAGE sql IMMUTABLE AS 'SELECT 31';
SET search_path = pc_shadow, pg_catalog, public;
ALTER TABLE idem_records DROP CONSTRAINT idem_records_fingerprint_length;
ALTER TABLE idem_records ADD CONSTRAINT idem_records_fingerprint_length
  CHECK (octet_length(fingerprint) = 32) NOT VALID;
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-17s', '{"n": 17}');
COMMIT;
RESET search_path;
ALTER TABLE idem_records DROP CONSTRAINT idem_records_fingerprint_length;
ALTER TABLE idem_records ADD CONSTRAINT idem_records_fingerprint_length
  CHECK (octet_length(fingerprint) = 32);
DROP SCHEMA pc_shadow CASCADE;

-- A constraint added to idem_records after a claim in the same transaction
-- checks the claim's row, as when every claim wrote at once: the ALTER
-- TABLE fails, not the COMMIT.
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-17x', '{"n": 17}');
ALTER TABLE idem_records ADD CONSTRAINT pc_no_17x CHECK (key <> 'pc-17x');
COMMIT;
SELECT count(*) AS records FROM idem_records WHERE key = 'pc-17x';

-- A trigger added to idem_records after a claim in the same transaction:
-- the claim's record is written before the trigger is created (as before
-- any DDL statement of its transaction), so the commit keeps both.
CREATE FUNCTION pc_trigger() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RETURN NEW; END $$;
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT outcome FROM idem_claim('pc.op', 'pc-18', '{"n": 18}');
CREATE TRIGGER pc_trigger BEFORE INSERT ON idem_records
  FOR EACH ROW EXECUTE FUNCTION pc_trigger();
SELECT * FROM pg_temp.writes(:ins, :upd);
COMMIT;
SELECT * FROM pg_temp.record('pc-18');
SELECT count(*) AS triggers FROM pg_trigger WHERE tgname = 'pc_trigger';
DROP TRIGGER pc_trigger ON idem_records;
-- Completed after the trigger came: written processing, then updated, as
-- on any table the owner changed.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT token FROM idem_claim('pc.op', 'pc-18b', '{"n": 18}') \gset
CREATE TRIGGER pc_trigger BEFORE INSERT ON idem_records
  FOR EACH ROW EXECUTE FUNCTION pc_trigger();
SELECT idem_complete(:'token', 201, '{"id": 18}');
SELECT * FROM pg_temp.writes(:ins, :upd);
ROLLBACK;
DROP FUNCTION pc_trigger();

-- A claim made inside a DDL statement (here by an event trigger at its
-- start) is written at once: the statement that follows it in the same
-- command, adding a constraint the row breaks, fails, not the COMMIT.
CREATE FUNCTION pc_claim_at_ddl() RETURNS event_trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM idem_claim('pc.op', 'pc-19', '{"n": 19}'); END $$;
CREATE EVENT TRIGGER pc_claim_at_ddl ON ddl_command_start
  WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION pc_claim_at_ddl();
BEGIN;
ALTER TABLE idem_records ADD CONSTRAINT pc_no_19 CHECK (key <> 'pc-19');
COMMIT;
DROP EVENT TRIGGER pc_claim_at_ddl;
DROP FUNCTION pc_claim_at_ddl();
SELECT count(*) AS records FROM idem_records WHERE key = 'pc-19';
SELECT count(*) AS constraints FROM pg_constraint WHERE conname = 'pc_no_19';
-- After that failed DDL statement, a claim is kept pending again.
BEGIN;
SELECT * FROM pg_temp.counts() \gset
SELECT outcome FROM idem_claim('pc.op', 'pc-19b', '{"n": 19}');
SELECT * FROM pg_temp.writes(:ins, :upd);
ROLLBACK;

-- The record written before a DDL statement is visible to that statement's
-- own query.
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-20', '{"n": 20}');
CREATE TEMP TABLE pc_copy AS SELECT key FROM idem_records WHERE key = 'pc-20';
SELECT key FROM pc_copy;
ROLLBACK;
-- So are the statement's other reads: a prepared query, an expression.
CREATE FUNCTION pc_records(text) RETURNS int LANGUAGE sql STABLE AS
  $$ SELECT count(*)::int FROM idem_records WHERE key = $1 $$;
PREPARE pc_read AS SELECT key FROM idem_records WHERE key = 'pc-20e';
CREATE TABLE pc_table (a int);
INSERT INTO pc_table VALUES (1);
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-20e', '{"n": 20}');
CREATE TEMP TABLE pc_copy AS EXECUTE pc_read;
SELECT key FROM pc_copy;
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_claim('pc.op', 'pc-20d', '{"n": 20}');
ALTER TABLE pc_table ADD COLUMN records int DEFAULT pc_records('pc-20d');
SELECT records FROM pc_table;
ROLLBACK;
DROP TABLE pc_table;
DEALLOCATE pc_read;
DROP FUNCTION pc_records(text);

-- A raw INSERT of a finished record is still refused by the guard.
INSERT INTO idem_records (role, tenant, caller, operation, key, fingerprint, state,
                          attempt, on_lease_expiry, ttl, created_at, claimed_at,
                          updated_at, expires_at, response_status)
VALUES (DEFAULT, '', '', 'pc.op', 'pc-raw', decode(repeat('00', 32), 'hex'),
        'succeeded', 1, 'unknown', '1 day', now(), now(), now(), now() + '1 day', 201);

DELETE FROM idem_records WHERE operation = 'pc.op';
