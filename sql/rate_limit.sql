--
-- idempotency.max_new_keys_per_second: a role that creates records faster
-- than the rate is answered rate_limited (429 with retry_after), and the
-- claim writes nothing.  Replays, and every other answer that writes
-- nothing, are never limited, nor is another attempt of a command already
-- recorded.
--
-- The limit is a reload setting: ALTER SYSTEM, pg_reload_conf(), then this
-- session polls (bounded) until it has read the new value.  Nothing here
-- assumes how fast claims run: counts are compared with what the bucket
-- allows in the time measured, and a rate_limited answer is looked for by
-- claiming until one comes.
--
\set VERBOSITY default

-- Off by default.
SHOW idempotency.max_new_keys_per_second;

-- Bad settings are refused by the setting itself, and nothing changes.
ALTER SYSTEM SET idempotency.max_new_keys_per_second = -1;
ALTER SYSTEM SET idempotency.max_new_keys_per_second = 1000001;
ALTER SYSTEM SET idempotency.max_new_keys_per_second = 'fast';
-- It is set for the server and applied by a reload: not per session, role
-- or database.
SET idempotency.max_new_keys_per_second = 50;
ALTER ROLE CURRENT_USER SET idempotency.max_new_keys_per_second = 50;
SHOW idempotency.max_new_keys_per_second;
SELECT count(*) AS written_to_postgresql_auto_conf
  FROM pg_file_settings WHERE name = 'idempotency.max_new_keys_per_second';

-- An application role of its own: each role has its own bucket in each
-- database, so the other tests' claims do not spend it.
CREATE ROLE regress_rl_app;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_replay
   TO regress_rl_app;

-- Claim n new keys in one statement, completing those that proceed, and
-- time it.
CREATE FUNCTION pg_temp.new_keys(prefix text, n int,
                                 OUT proceeded int, OUT rate_limited int,
                                 OUT other int, OUT seconds float8)
LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  d idem_decision;
BEGIN
  proceeded := 0; rate_limited := 0; other := 0;
  FOR i IN 1..n LOOP
    d := idem_claim('orders.create', prefix || i, jsonb_build_object('n', i));
    IF d.outcome = 'proceed' THEN
      proceeded := proceeded + 1;
      PERFORM idem_complete(d.token, 201, jsonb_build_object('order', i));
    ELSIF d.outcome = 'rate_limited' THEN
      rate_limited := rate_limited + 1;
    ELSE
      other := other + 1;
    END IF;
  END LOOP;
  seconds := extract(epoch FROM clock_timestamp() - t0);
END $$;

-- Claim keys prefix-1, prefix-2, ... until one is answered rate_limited,
-- completing those that proceed, and return that answer.  With reuse,
-- the claims pass on_expired => 'proceed'.
CREATE FUNCTION pg_temp.until_limited(prefix text, reuse boolean DEFAULT false)
RETURNS SETOF idem_decision
LANGUAGE plpgsql AS $$
DECLARE
  d idem_decision;
BEGIN
  FOR i IN 1..1000000 LOOP
    IF reuse THEN
      d := idem_claim('orders.create', prefix || i, jsonb_build_object('n', i),
                      on_expired => 'proceed');
    ELSE
      d := idem_claim('orders.create', prefix || i, jsonb_build_object('n', i));
    END IF;
    IF d.outcome = 'rate_limited' THEN
      RETURN NEXT d;
      RETURN;
    END IF;
    IF d.outcome <> 'proceed' THEN
      RAISE EXCEPTION 'claim % answered %', prefix || i, d.outcome;
    END IF;
    PERFORM idem_complete(d.token, 201, jsonb_build_object('order', i));
  END LOOP;
  RAISE EXCEPTION 'never rate_limited';
END $$;

-- Before the limit: 600 finished commands whose records have expired
-- (tombstones), and one failure that may be retried.
SET ROLE regress_rl_app;
SELECT proceeded, rate_limited, other FROM pg_temp.new_keys('old-', 200);
SELECT proceeded, rate_limited, other FROM pg_temp.new_keys('reuse-', 400);
SELECT token AS retry_token FROM idem_claim('orders.create', 'retry-me', '{}') \gset
SELECT idem_fail(:'retry_token', 503, '{"error": "try again"}', retryable => true);
RESET ROLE;
UPDATE idem_records SET expires_at = now() - interval '1 minute'
 WHERE key LIKE 'old-%' OR key LIKE 'reuse-%';

-- The limit: 50 new records per second.
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

--
-- 1. 200 new keys at once from one role: the bucket holds one second of
-- the rate (50) and refills at 50 a second, so at most 50 + 50 x the
-- seconds taken proceed; the others are answered rate_limited.  Only the
-- keys that proceeded have a record.
--
SET ROLE regress_rl_app;
SELECT proceeded AS burst_proceeded, rate_limited AS burst_limited,
       other AS burst_other, seconds AS burst_seconds
  FROM pg_temp.new_keys('burst-', 200) \gset
RESET ROLE;
SELECT :burst_proceeded >= 50 AS the_burst_proceeds,
       :burst_proceeded <= 50 + 50 * :burst_seconds AS within_the_rate,
       :burst_proceeded + :burst_limited = 200 AS all_proceed_or_limited,
       :burst_other AS other_answers;
SELECT count(*) = :burst_proceeded AS only_those_that_proceeded_wrote
  FROM idem_records WHERE key LIKE 'burst-%';

--
-- 2. The rate_limited answer: HTTP 429, IDEMPOTENCY_RATE_LIMITED, the
-- seconds until a token is there (one second of the rate is the most a
-- bucket can lack, so 1), no token, no record.
--
SET ROLE regress_rl_app;
SELECT * FROM pg_temp.until_limited('spent-');
RESET ROLE;
-- Every claim before it proceeded and completed: a processing record
-- would be one the limited claim wrote.
SELECT count(*) FILTER (WHERE state <> 'succeeded') AS written_by_the_limited_claim
  FROM idem_records WHERE key LIKE 'spent-%';

--
-- 3. Reusing an expired record (on_expired => 'proceed') starts a new
-- command at attempt 1: it counts as a new record, as it would have been
-- an insert had cleanup already deleted the row.  The limited claim leaves
-- the tombstone as it was.  (The bucket may still be spent from part 2, so
-- the very first reuse may be the one limited.)
--
SET ROLE regress_rl_app;
SELECT outcome, http_status, error_code, retry_after, token IS NULL AS no_token
  FROM pg_temp.until_limited('reuse-', reuse => true);
RESET ROLE;
SELECT count(*) FILTER (WHERE state <> 'succeeded') AS written_by_the_limited_claim,
       count(*) FILTER (WHERE expires_at < now()) > 0 AS tombstones_left
  FROM idem_records WHERE key LIKE 'reuse-%';

--
-- 4. Right after the bucket is spent, answers that write nothing are not
-- limited: replays, mismatches and expired answers.  Nor is another
-- attempt of a command already recorded (a retryable failure).
--
SET ROLE regress_rl_app;
CREATE FUNCTION pg_temp.while_spent()
RETURNS TABLE (outcome text, answers bigint)
LANGUAGE plpgsql AS $$
DECLARE
  d idem_decision;
BEGIN
  PERFORM pg_temp.until_limited('spent-again-');
  CREATE TEMP TABLE answered (outcome text);
  FOR i IN 1..50 LOOP
    -- burst-1 .. burst-50 proceeded in part 1 (the burst), and completed
    INSERT INTO answered
      SELECT c.outcome FROM idem_claim('orders.create', 'burst-' || i,
                                       jsonb_build_object('n', i)) c;
    INSERT INTO answered
      SELECT c.outcome FROM idem_claim('orders.create', 'burst-' || i, '{"n": 0}') c;
    INSERT INTO answered
      SELECT c.outcome FROM idem_claim('orders.create', 'old-' || i,
                                       jsonb_build_object('n', i)) c;
  END LOOP;
  d := idem_claim('orders.create', 'retry-me', '{}');
  INSERT INTO answered VALUES (d.outcome || ' attempt ' || d.attempt);
  RETURN QUERY SELECT a.outcome, count(*) FROM answered a GROUP BY 1 ORDER BY 1;
END $$;
SELECT * FROM pg_temp.while_spent();
RESET ROLE;

--
-- 5. Back to no limit (0): every new key proceeds again.
--
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
SET ROLE regress_rl_app;
SELECT proceeded, rate_limited, other FROM pg_temp.new_keys('unlimited-', 200);
RESET ROLE;

DROP FUNCTION pg_temp.while_spent();
DROP TABLE pg_temp.answered;
DELETE FROM idem_records WHERE caller = 'regress_rl_app';
REVOKE EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_replay
  FROM regress_rl_app;
DROP ROLE regress_rl_app;
