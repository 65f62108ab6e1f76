--
-- idempotency.max_new_keys_per_second under hostile use: a batch far
-- larger than the burst, the smallest and largest rates, and more
-- (database, role) pairs creating records at once than the bucket table
-- holds.  As in rate_limit.sql nothing assumes how fast claims run: counts
-- are compared with what the buckets allow in the time measured.
--
\set VERBOSITY default

CREATE ROLE regress_rla_app;
GRANT EXECUTE ON FUNCTION idem_claim, idem_claim_many TO regress_rla_app;

--
-- 1. idem_claim_many of 1,000 new keys under a limit of 50: the burst
-- proceeds, and at most 50 + 50 x the seconds the call took; every other
-- item is rate_limited (429, retry_after 1) and wrote nothing.
--
ALTER SYSTEM SET idempotency.max_new_keys_per_second = 50;
SELECT pg_reload_conf();
\set ECHO none
\o /dev/null
SELECT format('SELECT pg_sleep(0.05) WHERE current_setting(%L) <> %L',
              'idempotency.max_new_keys_per_second', '50')
  FROM generate_series(1, 600) \gexec
\o
\set ECHO all
SHOW idempotency.max_new_keys_per_second;

SET ROLE regress_rla_app;
SELECT clock_timestamp() AS t0 \gset
CREATE TEMP TABLE many AS
  SELECT * FROM idem_claim_many('orders.create',
                                ARRAY(SELECT 'many-' || i FROM generate_series(1, 1000) i));
SELECT extract(epoch FROM clock_timestamp() - :'t0') AS many_seconds \gset
RESET ROLE;
SELECT outcome, http_status, error_code, retry_after, token IS NULL AS no_token,
       record_id IS NULL AS no_record, count(*) > 0 AS answered
  FROM many GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1;
SELECT count(*) FILTER (WHERE outcome = 'proceed') >= 50 AS the_burst_proceeds,
       count(*) FILTER (WHERE outcome = 'proceed') <= 50 + 50 * :many_seconds
         AS within_the_rate,
       count(*) FILTER (WHERE outcome = 'rate_limited') > 0 AS limited
  FROM many;
-- The first 50 items are the burst: nothing spent this role's bucket before.
SELECT count(*) AS burst_items_proceeded
  FROM (SELECT outcome FROM many LIMIT 50) f WHERE outcome = 'proceed';
SELECT (SELECT count(*) FROM idem_records WHERE key LIKE 'many-%') =
       (SELECT count(*) FROM many WHERE outcome = 'proceed') AS only_those_that_proceeded_wrote;

--
-- 2. The smallest rate, 1: one record a second, then rate_limited.
--
ALTER SYSTEM SET idempotency.max_new_keys_per_second = 1;
SELECT pg_reload_conf();
\set ECHO none
\o /dev/null
SELECT format('SELECT pg_sleep(0.05) WHERE current_setting(%L) <> %L',
              'idempotency.max_new_keys_per_second', '1')
  FROM generate_series(1, 600) \gexec
\o
\set ECHO all
CREATE ROLE regress_rla_one;
GRANT EXECUTE ON FUNCTION idem_claim_many TO regress_rla_one;
SET ROLE regress_rla_one;
SELECT clock_timestamp() AS t0 \gset
CREATE TEMP TABLE one AS
  SELECT * FROM idem_claim_many('orders.create',
                                ARRAY(SELECT 'one-' || i FROM generate_series(1, 20) i));
SELECT extract(epoch FROM clock_timestamp() - :'t0') AS one_seconds \gset
RESET ROLE;
SELECT (SELECT outcome FROM one LIMIT 1) AS first_item,
       count(*) FILTER (WHERE outcome = 'proceed') <= 1 + :one_seconds AS within_the_rate,
       count(*) FILTER (WHERE outcome NOT IN ('proceed', 'rate_limited')) AS other
  FROM one;

--
-- 3. The largest rate, 1,000,000: a bucket starts with a second of it, so
-- 1,000 new keys all proceed.
--
ALTER SYSTEM SET idempotency.max_new_keys_per_second = 1000000;
SELECT pg_reload_conf();
\set ECHO none
\o /dev/null
SELECT format('SELECT pg_sleep(0.05) WHERE current_setting(%L) <> %L',
              'idempotency.max_new_keys_per_second', '1000000')
  FROM generate_series(1, 600) \gexec
\o
\set ECHO all
SET ROLE regress_rla_app;
SELECT outcome, count(*)
  FROM idem_claim_many('orders.create',
                       ARRAY(SELECT 'max-' || i FROM generate_series(1, 1000) i))
 GROUP BY 1;
RESET ROLE;

--
-- 4. More (database, role) pairs creating records at once than the 1,024
-- buckets: 1,100 roles (members of regress_rla_app, for its grants) each
-- claim one new key.  Each is answered proceed or
-- rate_limited (retry_after 1, nothing written), never an error; and when
-- they all came within a second, no bucket could be freed, so some were
-- limited.
--
ALTER SYSTEM SET idempotency.max_new_keys_per_second = 1;
SELECT pg_reload_conf();
\set ECHO none
\o /dev/null
SELECT format('SELECT pg_sleep(0.05) WHERE current_setting(%L) <> %L',
              'idempotency.max_new_keys_per_second', '1')
  FROM generate_series(1, 600) \gexec
\o
\set ECHO all
\set ECHO none
\o /dev/null
SELECT format('CREATE ROLE regress_rla_%s IN ROLE regress_rla_app', i)
  FROM generate_series(1, 1100) i \gexec
\o
\set ECHO all
CREATE TEMP TABLE pairs (role_no int, outcome text, http_status int,
                         retry_after int, no_token boolean, at timestamptz);
GRANT ALL ON pairs TO PUBLIC;
CREATE FUNCTION pg_temp.all_roles() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  d idem_decision;
BEGIN
  FOR i IN 1..1100 LOOP
    EXECUTE format('SET LOCAL ROLE regress_rla_%s', i);
    d := idem_claim('orders.create', 'pair-' || i, '{}');
    INSERT INTO pairs VALUES (i, d.outcome, d.http_status, d.retry_after,
                              d.token IS NULL, clock_timestamp());
    RESET ROLE;
  END LOOP;
END $$;
BEGIN;
SELECT pg_temp.all_roles();
COMMIT;
SELECT count(*) AS other_answers FROM pairs
 WHERE NOT ((outcome = 'proceed' AND NOT no_token) OR
            (outcome = 'rate_limited' AND http_status = 429 AND retry_after = 1
             AND no_token));
SELECT count(*) AS answers,
       count(*) FILTER (WHERE outcome = 'rate_limited') > 0 OR
         max(at) - min(at) >= interval '1 second' AS limited_or_room_was_made
  FROM pairs;
SELECT (SELECT count(*) FROM idem_records WHERE key LIKE 'pair-%') =
       (SELECT count(*) FROM pairs WHERE outcome = 'proceed') AS only_those_that_proceeded_wrote;

-- Back to no limit.
ALTER SYSTEM RESET idempotency.max_new_keys_per_second;
SELECT pg_reload_conf();
\set ECHO none
\o /dev/null
SELECT format('SELECT pg_sleep(0.05) WHERE current_setting(%L) <> %L',
              'idempotency.max_new_keys_per_second', '0')
  FROM generate_series(1, 600) \gexec
\o
\set ECHO all
SHOW idempotency.max_new_keys_per_second;
DELETE FROM idem_records
 WHERE key LIKE 'many-%' OR key LIKE 'one-%' OR key LIKE 'max-%' OR key LIKE 'pair-%';
\set ECHO none
\o /dev/null
SELECT format('DROP ROLE regress_rla_%s', i) FROM generate_series(1, 1100) i \gexec
\o
\set ECHO all
DROP TABLE pg_temp.many, pg_temp.one;
REVOKE EXECUTE ON FUNCTION idem_claim, idem_claim_many FROM regress_rla_app, regress_rla_one;
DROP ROLE regress_rla_app;
DROP ROLE regress_rla_one;
