--
-- idem_records attached as a partition: its partition constraint refuses
-- the row of a new key claimed in a transaction block at the claim, not at
-- the commit after the claim answered proceed (pending_claim.sql).
--
-- PostgreSQL 17 and later refuse to attach a table with an identity column
-- as a partition, so there the attach fails and nothing else is tested:
-- expected/pending_partition_1.out.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY terse
SET idempotency.default_lease = '1h';

BEGIN;
CREATE TABLE pc_parent (LIKE idem_records) PARTITION BY LIST (operation);
CREATE TABLE pc_other PARTITION OF pc_parent FOR VALUES IN ('pc.other');
ALTER TABLE pc_parent ATTACH PARTITION idem_records DEFAULT;
SELECT outcome FROM idem_claim('pc.other', 'pc-17q', '{"n": 17}');
ROLLBACK;
SELECT count(*) AS no_record FROM idem_records WHERE key = 'pc-17q';
