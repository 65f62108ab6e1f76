--
-- idem_claim and the attempt functions, one outcome at a time.
--
-- Tokens and timestamps differ on every run: the scenario keeps them in
-- psql variables and prints only what is stable.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default
SET idempotency.default_lease = '1h';


-- The columns of a decision worth printing (no token, no record id).
CREATE FUNCTION show(d idem_decision)
RETURNS TABLE (outcome text, has_token boolean, state idem_state, attempt int,
               recovery_point text, http_status int, headers jsonb, body jsonb,
               error_code text, retry_after int, resource_id text)
LANGUAGE sql AS $$
  SELECT d.outcome, d.token IS NOT NULL, d.state, d.attempt, d.recovery_point,
         d.http_status, d.headers, d.body, d.error_code, d.retry_after, d.resource_id
$$;

-- 1. A new key proceeds; the business write and the completion commit with it.
-- Claimed and completed in one transaction block, the record is written
-- once, finished, by the completion: a plain SELECT of the table in between
-- does not see it yet (pending_claim.sql has the rest).
BEGIN;
SELECT (c).token AS token, (c).record_id AS record_id
  FROM idem_claim('payments.create', 'key-1', '{"amount": 100, "currency": "EUR"}') c \gset
SELECT count(*) AS written_at_claim FROM idem_records WHERE id = :record_id;
SELECT idem_complete(:'token', 201, '{"id": "PAY-1", "amount": 100}',
                     '{"Location": "/payments/PAY-1"}', 'PAY-1');
SELECT state, attempt, recovery_point IS NULL AS no_recovery_point,
       locked_until IS NULL AS no_lease, attempt_token IS NULL AS no_token,
       completed_at >= claimed_at AS completed_after_claim
  FROM idem_records WHERE id = :record_id;
COMMIT;

-- 2. A retry gets the stored response: same status, headers, body, resource.
SELECT s.* FROM idem_claim('payments.create', 'key-1', '{"currency": "EUR", "amount": 100.00}') c,
       show(c) s;

-- Replays write nothing: the record's row version is unchanged.
SELECT xmin AS xmin_before FROM idem_records WHERE id = :record_id \gset
SELECT (idem_claim('payments.create', 'key-1', '{"amount": 100, "currency": "EUR"}')).outcome;
SELECT xmin = :'xmin_before' AS untouched FROM idem_records WHERE id = :record_id;

-- 3. The same key with a different request is refused.
SELECT s.* FROM idem_claim('payments.create', 'key-1', '{"amount": 101, "currency": "EUR"}') c,
       show(c) s;
-- ... and so is the same key without a request.
SELECT s.* FROM idem_claim('payments.create', 'key-1') c, show(c) s;

-- The scope separates keys: another operation, tenant or caller is another key.
SELECT (idem_claim('refunds.create', 'key-1', '{"amount": 100}')).outcome AS other_operation;
SELECT (idem_claim('payments.create', 'key-1', '{"amount": 100}', tenant => 'acme')).outcome AS other_tenant;
SELECT (idem_claim('payments.create', 'key-1', '{"amount": 100}', caller => 'billing')).outcome AS other_caller;
SELECT tenant, caller, operation, key, state FROM idem_records ORDER BY id;

-- 4. A transaction that aborts leaves no trace: the retry proceeds.
BEGIN;
SELECT (idem_claim('payments.create', 'key-2', '{"amount": 5}')).outcome;
ROLLBACK;
SELECT count(*) AS records_for_key_2 FROM idem_records WHERE key = 'key-2';
SELECT (c).token AS token2 FROM idem_claim('payments.create', 'key-2', '{"amount": 5}') c \gset

-- 5. External side effect: the claim commits on its own; a retry meanwhile
-- is told to come back later, with the lease's remaining time.
SELECT outcome, state, http_status, error_code, retry_after BETWEEN 3500 AND 3600 AS retry_after_is_lease
  FROM idem_claim('payments.create', 'key-2', '{"amount": 5}');
-- A different request under the running key is still a mismatch.
SELECT (idem_claim('payments.create', 'key-2', '{"amount": 6}')).outcome;
SELECT idem_heartbeat(:'token2', '2h') > now() + '1h59min' AS lease_extended;
SELECT idem_checkpoint(:'token2', 'provider-call-sent');
SELECT recovery_point FROM idem_records WHERE key = 'key-2';
SELECT idem_complete(:'token2', 201, '{"id": "PAY-2"}');
SELECT outcome, state, http_status, body FROM idem_claim('payments.create', 'key-2', '{"amount": 5}');

-- A finished attempt's token is stale: its outcome cannot be overwritten.
SELECT idem_complete(:'token2', 500, '{"error": "late"}');
SELECT idem_fail(:'token2', 500);
SELECT idem_heartbeat(:'token2');
SELECT idem_checkpoint(:'token2', 'again');
SELECT response_status, response_body FROM idem_records WHERE key = 'key-2';

-- 6. A stable failure is replayed like a success.
SELECT (c).token AS token3 FROM idem_claim('payments.create', 'key-3', '{"amount": -1}') c \gset
SELECT idem_fail(:'token3', 422, '{"error": "amount must be positive"}');
SELECT s.* FROM idem_claim('payments.create', 'key-3', '{"amount": -1}') c, show(c) s;

-- 7. A retryable failure frees the key for a new attempt with the same request.
SELECT (c).token AS token4 FROM idem_claim('payments.create', 'key-4', '{"amount": 7}') c \gset
SELECT idem_fail(:'token4', 503, '{"error": "provider unavailable"}', retryable => true);
SELECT state, response_status FROM idem_records WHERE key = 'key-4';
SELECT (idem_claim('payments.create', 'key-4', '{"amount": 8}')).outcome AS other_request;
SELECT s.* FROM idem_claim('payments.create', 'key-4', '{"amount": 7}') c, show(c) s;
SELECT state, attempt, response_status FROM idem_records WHERE key = 'key-4';

-- 8. A lease that ended, policy unknown (the default): the claim marks the
-- record unknown and answers unknown; the late worker's token is stale.
SELECT (c).token AS token5, (c).record_id AS record5
  FROM idem_claim('payments.create', 'key-5', '{"amount": 9}') c \gset
UPDATE idem_records SET locked_until = clock_timestamp() - interval '1 second' WHERE key = 'key-5';
SELECT s.* FROM idem_claim('payments.create', 'key-5', '{"amount": 9}') c, show(c) s;
SELECT state FROM idem_records WHERE key = 'key-5';
SELECT idem_complete(:'token5', 201, '{"id": "PAY-5"}');
SELECT (idem_claim('payments.create', 'key-5', '{"amount": 9}')).outcome AS still_unknown;

-- An operator finds out what happened and settles it.
SELECT idem_resolve(:record5, 'succeeded', 201, '{"id": "PAY-5"}');
SELECT s.* FROM idem_claim('payments.create', 'key-5', '{"amount": 9}') c, show(c) s;
SELECT idem_resolve(:record5, 'failed', 500);
SELECT idem_resolve(-1, 'failed', 500);
SELECT idem_resolve(:record5, 'processing', 500);

-- 9. A lease that ended, policy retry: the next claim takes over as attempt 2
-- and resumes from the last recovery point; attempt 1 is fenced off.
SELECT (c).token AS token6
  FROM idem_claim('payments.create', 'key-6', '{"amount": 10}', on_lease_expiry => 'retry') c \gset
SELECT idem_checkpoint(:'token6', 'step-2-of-3');
UPDATE idem_records SET locked_until = clock_timestamp() - interval '1 second' WHERE key = 'key-6';
SELECT (c).token AS token6b, (c).outcome, (c).attempt, (c).recovery_point
  FROM idem_claim('payments.create', 'key-6', '{"amount": 10}', on_lease_expiry => 'retry') c \gset
\echo :outcome :attempt :recovery_point
SELECT idem_complete(:'token6', 201, '{"by": "attempt 1"}');
SELECT idem_heartbeat(:'token6');
SELECT idem_complete(:'token6b', 201, '{"by": "attempt 2"}');
SELECT outcome, attempt, body FROM idem_claim('payments.create', 'key-6', '{"amount": 10}');

-- 10. A finished record past its expiry answers expired, writing nothing
-- (expiry.sql tells more); asked to, a claim makes it a new command:
-- attempt 1, any request.
UPDATE idem_records SET expires_at = clock_timestamp() - interval '1 second' WHERE operation = 'payments.create' AND key = 'key-1' AND tenant = '' AND caller = '';
SELECT s.* FROM idem_claim('payments.create', 'key-1', '{"amount": 999}') c, show(c) s;
SELECT s.* FROM idem_claim('payments.create', 'key-1', '{"amount": 999}', on_expired => 'proceed') c, show(c) s;
SELECT state, attempt, response_body, resource_id FROM idem_records
 WHERE operation = 'payments.create' AND key = 'key-1' AND tenant = '' AND caller = '';

-- 11. idem_replay looks without claiming or writing.
SELECT s.* FROM idem_replay('payments.create', 'key-2') c, show(c) s;
SELECT s.* FROM idem_replay('payments.create', 'key-1') c, show(c) s;
SELECT count(*) AS no_row FROM idem_replay('payments.create', 'no-such-key');
SELECT count(*) AS other_caller_sees_nothing FROM idem_replay('payments.create', 'key-2', caller => 'someone-else');

-- 12. Derived keys are stable, distinct per step and shaped like a UUID.
SELECT idem_derive_key('key-1', 'charge') AS charge,
       idem_derive_key('key-1', 'charge') = idem_derive_key('key-1', 'charge') AS stable,
       idem_derive_key('key-1', 'charge') <> idem_derive_key('key-1', 'refund') AS per_step,
       idem_derive_key('ab', 'c') <> idem_derive_key('a', 'bc') AS unambiguous;
SELECT idem_derive_key('key-1', 'charge')::uuid IS NOT NULL AS is_uuid;

-- 13. Tokens that are not tokens.
SELECT idem_complete('not-a-token', 200);
SELECT idem_complete('1.1.zz', 200);
SELECT idem_complete('999999.1.00000000000000000000000000000000', 200);

SELECT operation, state, records FROM idem_stats ORDER BY operation, state;

-- 14. A record at the largest attempt number cannot start another attempt:
-- a clear error, never an overflow into a negative attempt.
SELECT record_id AS last_id, token AS last_token
  FROM idem_claim('payments.create', 'key-last-attempt', '{"n": 1}') \gset
SELECT idem_fail(:'last_token', 503, retryable => true);
ALTER TABLE idem_records DISABLE TRIGGER idem_records_guard;
UPDATE idem_records SET attempt = 2147483647 WHERE id = :last_id;
ALTER TABLE idem_records ENABLE TRIGGER idem_records_guard;
SELECT outcome FROM idem_claim('payments.create', 'key-last-attempt', '{"n": 1}');
SELECT state, attempt FROM idem_records WHERE id = :last_id;
-- The guard refuses the wrapped attempt number a direct update would write.
UPDATE idem_records SET state = 'processing', attempt = -2147483648 WHERE id = :last_id;
DELETE FROM idem_records WHERE id = :last_id;
