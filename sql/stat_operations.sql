--
-- idem_stat_operations: a scripted run of claims against a fresh operation
-- shows exactly its outcomes; writes count when they commit, answers when
-- they are given; roles see their own rows; idem_stat_reset() is for
-- superusers and the roles granted it.
--
-- In a database of its own, so that the maintenance passes run here touch
-- no other test's records (the counters are per database anyway).  The
-- test cluster preloads the library, so the counters are kept.
--
CREATE DATABASE idem_stat;
\c idem_stat
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
\set VERBOSITY default

CREATE ROLE regress_stat_app;
CREATE ROLE regress_stat_other;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_heartbeat
   TO regress_stat_app, regress_stat_other;
GRANT SELECT ON idem_stat_operations TO regress_stat_app, regress_stat_other;
GRANT EXECUTE ON FUNCTION idem_stat_operations() TO regress_stat_app, regress_stat_other;

-- The counters of this database, without the times.
CREATE FUNCTION pg_temp.counts()
RETURNS TABLE (role name, operation text, proceed bigint, replay bigint,
               in_progress bigint, mismatch bigint, unknown bigint,
               expired bigint, rate_limited bigint, completions bigint,
               failures bigint, retryable_failures bigint, stale_tokens bigint,
               leases_expired_unknown bigint, leases_expired_retryable bigint,
               records_purged bigint, records_deleted bigint)
LANGUAGE sql AS $$
  SELECT role, operation, proceed, replay, in_progress, mismatch, unknown,
         expired, rate_limited, completions, failures, retryable_failures,
         stale_tokens, leases_expired_unknown, leases_expired_retryable,
         records_purged, records_deleted
    FROM idem_stat_operations
   WHERE database = current_database()
   ORDER BY role, operation
$$;

SELECT idem_stat_reset();
SELECT * FROM pg_temp.counts();
SELECT evictions FROM idem_stat_operations_info;

--
-- 1. One of each outcome, as the application's role.
--
SET ROLE regress_stat_app;
SELECT token AS t1 FROM idem_claim('stat.scripted', 'k1', '{"n": 1}') \gset
SELECT idem_complete(:'t1', 201, '{"ok": true}');
SELECT outcome FROM idem_claim('stat.scripted', 'k1', '{"n": 1}');
SELECT outcome FROM idem_claim('stat.scripted', 'k1', '{"n": 2}');
SELECT outcome FROM idem_claim('stat.scripted', 'k2', lease => '1h');
SELECT outcome FROM idem_claim('stat.scripted', 'k2');
-- A lease of a microsecond has ended by the next statement: the next claim
-- marks the record unknown, a lease expired to unknown.
SELECT outcome FROM idem_claim('stat.scripted', 'k3', lease => '1 microsecond');
SELECT outcome FROM idem_claim('stat.scripted', 'k3');
SELECT token AS t4 FROM idem_claim('stat.scripted', 'k4') \gset
SELECT idem_fail(:'t4', 503, retryable => true);
SELECT token AS t5 FROM idem_claim('stat.scripted', 'k5') \gset
SELECT idem_fail(:'t5', 422, '{"error": "declined"}');
-- A token used twice: the second use is a stale token.
\set VERBOSITY terse
SELECT idem_complete(:'t1', 201);
\set VERBOSITY default
RESET ROLE;
SELECT * FROM pg_temp.counts();
SELECT total_claim_time > 0 AS timed FROM idem_stat_operations
 WHERE operation = 'stat.scripted';

--
-- 2. What an aborted transaction counts: the claim's answer was given, so
-- proceed counts; its completion was rolled back, so it does not.  A
-- completion rolled back to a savepoint does not count either, the one
-- made again after it does.
--
SET ROLE regress_stat_app;
BEGIN;
SELECT token AS t6 FROM idem_claim('stat.aborted', 'k6') \gset
SELECT idem_complete(:'t6', 201);
ROLLBACK;
BEGIN;
SELECT token AS t7 FROM idem_claim('stat.aborted', 'k7') \gset
SAVEPOINT s;
SELECT idem_complete(:'t7', 201);
ROLLBACK TO SAVEPOINT s;
SELECT idem_fail(:'t7', 422);
COMMIT;
RESET ROLE;
SELECT operation, proceed, completions, failures FROM pg_temp.counts()
 WHERE operation = 'stat.aborted';

--
-- 3. The maintenance passes count per role and operation: leases expired
-- to retryable and to unknown, responses purged, records deleted.  Nothing
-- waits for time to pass: the owner moves expires_at into the past.
--
SET ROLE regress_stat_app;
SELECT outcome FROM idem_claim('stat.maintained', 'retry-me', lease => '1 microsecond',
                               on_lease_expiry => 'retry');
SELECT outcome FROM idem_claim('stat.maintained', 'unknown-me', lease => '1 microsecond');
SELECT token AS t8 FROM idem_claim('stat.maintained', 'purge-me') \gset
SELECT idem_complete(:'t8', 200, '{"r": 1}');
SELECT token AS t9 FROM idem_claim('stat.maintained', 'delete-me') \gset
SELECT idem_complete(:'t9', 200, '{"r": 2}');
SELECT token AS t10 FROM idem_claim('stat.maintained', 'expire-me') \gset
SELECT idem_complete(:'t10', 200, '{"r": 3}');
RESET ROLE;
SELECT idem_expire_leases() AS expired;
UPDATE idem_records SET expires_at = clock_timestamp() - interval '1 day'
 WHERE key IN ('purge-me', 'expire-me');
UPDATE idem_records SET expires_at = clock_timestamp() - interval '30 days'
 WHERE key = 'delete-me';
-- idem_stats shows the one past its deletion time overdue until cleanup
-- runs; the records only past their expiry (to be purged) are not.
SELECT state, records, expired_awaiting_cleanup, cleanup_overdue
  FROM idem_stats WHERE operation = 'stat.maintained' ORDER BY state;
SELECT idem_cleanup() AS cleaned;
SELECT state, records, expired_awaiting_cleanup, cleanup_overdue
  FROM idem_stats WHERE operation = 'stat.maintained' ORDER BY state;
-- A claim of the purged record: expired.
SET ROLE regress_stat_app;
SELECT outcome FROM idem_claim('stat.maintained', 'expire-me');
RESET ROLE;
SELECT * FROM pg_temp.counts() WHERE operation = 'stat.maintained';

--
-- 4. A pass rolled back counts nothing.
--
SET ROLE regress_stat_app;
SELECT outcome FROM idem_claim('stat.rolled_back', 'x', lease => '1 microsecond');
RESET ROLE;
BEGIN;
SELECT idem_expire_leases() AS expired;
ROLLBACK;
SELECT leases_expired_unknown FROM pg_temp.counts() WHERE operation = 'stat.rolled_back';
SELECT idem_expire_leases() AS expired;
SELECT leases_expired_unknown FROM pg_temp.counts() WHERE operation = 'stat.rolled_back';

--
-- 5. Who sees what: a role sees its own rows; another role none of them;
-- with the privileges of pg_read_all_stats, every row.
--
SET ROLE regress_stat_other;
SELECT outcome FROM idem_claim('stat.other', 'o1');
SELECT role, operation, proceed FROM pg_temp.counts();
RESET ROLE;
SET ROLE regress_stat_app;
SELECT role, operation, proceed FROM pg_temp.counts();
RESET ROLE;
GRANT pg_read_all_stats TO regress_stat_other;
SET ROLE regress_stat_other;
SELECT role, operation, proceed FROM pg_temp.counts();
RESET ROLE;
REVOKE pg_read_all_stats FROM regress_stat_other;

-- Without EXECUTE on the function behind it, the view is refused.
CREATE ROLE regress_stat_nobody;
GRANT SELECT ON idem_stat_operations TO regress_stat_nobody;
SET ROLE regress_stat_nobody;
SELECT count(*) FROM idem_stat_operations;
RESET ROLE;

--
-- 6. Counting switched off: nothing is counted.
--
SET idempotency.track_operations = off;
SET ROLE regress_stat_app;
SELECT outcome FROM idem_claim('stat.untracked', 'u1');
RESET ROLE;
RESET idempotency.track_operations;
SELECT count(*) FROM pg_temp.counts() WHERE operation = 'stat.untracked';
-- Only a superuser may switch it.
SET ROLE regress_stat_app;
SET idempotency.track_operations = off;
RESET ROLE;

--
-- 7. idem_stat_reset(): refused to others until granted.
--
SET ROLE regress_stat_app;
SELECT idem_stat_reset();
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_stat_reset() TO regress_stat_app;
SET ROLE regress_stat_app;
SELECT idem_stat_reset();
RESET ROLE;
SELECT count(*) FROM pg_temp.counts();
SELECT evictions, stats_reset > now() - interval '1 hour' AS recent
  FROM idem_stat_operations_info;

--
-- 8. Operations longer than the 255 bytes kept of a name: two that share
-- their first 255 bytes are counted apart, each under the cut name.
--
SELECT idem_stat_reset();
SET idempotency.max_key_length = 400;
SELECT outcome FROM idem_claim(repeat('l', 255) || '-one', 'k1');
SELECT outcome FROM idem_claim(repeat('l', 255) || '-two', 'k1');
SELECT outcome FROM idem_claim(repeat('l', 255) || '-two', 'k2');
RESET idempotency.max_key_length;
SELECT length(operation), proceed FROM pg_temp.counts()
 WHERE operation LIKE 'lll%' ORDER BY proceed;

\c contrib_regression
DROP DATABASE idem_stat;
DROP ROLE regress_stat_app, regress_stat_other, regress_stat_nobody;
