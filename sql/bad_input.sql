--
-- Invalid calls raise a clear error with a proper SQLSTATE and change
-- nothing.  Expected outcomes (in_progress, mismatch, ...) are never errors.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default

-- The SQLSTATE and message of a statement, or 'ok'.
CREATE FUNCTION pg_temp.error_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || SQLERRM;
END $$;

SELECT count(*) AS records_before FROM idem_records \gset

-- Messages as users see them.
SELECT * FROM idem_claim('payments.create', NULL);
SELECT * FROM idem_claim('payments.create', '');
SELECT * FROM idem_claim('payments.create', repeat('k', 256));
SELECT * FROM idem_claim('payments.create', E'key\twith tab');
SELECT * FROM idem_claim('payments.create', 'clé');
SELECT * FROM idem_claim('', 'k');
SELECT * FROM idem_claim('payments.create', 'k', ttl => '0');
SELECT * FROM idem_claim('payments.create', 'k', lease => '-5 seconds');
SELECT * FROM idem_claim('payments.create', 'k', ttl => '100000000 years');
SELECT * FROM idem_claim('payments.create', 'k', on_lease_expiry => 'forget');

-- Every bad argument, with its SQLSTATE.
SELECT stmt, pg_temp.error_of(stmt) AS error FROM (VALUES
  ($$SELECT idem_claim(NULL, 'k')$$),
  ($$SELECT idem_claim('op', NULL)$$),
  ($$SELECT idem_claim('op', 'k', tenant => NULL)$$),
  ($$SELECT idem_claim('op', 'k', caller => current_user)$$),
  ($$SELECT idem_claim('op', 'k', caller => '')$$),
  ($$SELECT idem_claim('op', 'k', on_lease_expiry => NULL)$$),
  ($$SELECT idem_claim(repeat('o', 256), 'k')$$),
  ($$SELECT idem_claim('op', 'k', tenant => repeat('t', 256))$$),
  ($$SELECT idem_claim(E'op\n', 'k')$$),
  ($$SELECT idem_claim('op', E'k\x7f')$$),
  ($$SELECT idem_claim('op', 'k', wait => '-1 second')$$),
  ($$SELECT idem_claim('op', 'k', lease => '0')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '-1 day')$$),
  ($$SELECT idem_claim('op', 'k', lease => '2147483647 months')$$),
  ($$SELECT idem_complete(NULL, 200)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', NULL)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 99)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 600)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 200, headers => '[1]')$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 200, headers => '"x"')$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 200, headers => '{"a": 1}')$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 200, headers => '{"a": {"b": "c"}}')$$),
  ($$SELECT idem_complete('0.1.00000000000000000000000000000000', 200)$$),
  ($$SELECT idem_complete('1.0.00000000000000000000000000000000', 200)$$),
  ($$SELECT idem_complete('1.1.0000000000000000000000000000000G', 200)$$),
  ($$SELECT idem_fail('1.1.00000000000000000000000000000000', 500, retryable => NULL)$$),
  ($$SELECT idem_heartbeat('1.1.00000000000000000000000000000000', '0')$$),
  ($$SELECT idem_checkpoint('1.1.00000000000000000000000000000000', NULL)$$),
  ($$SELECT idem_resolve(NULL, 'failed', 500)$$),
  ($$SELECT idem_resolve(1, NULL, 500)$$),
  ($$SELECT idem_resolve(1, 'unknown', 500)$$),
  ($$SELECT idem_replay('op', '')$$),
  ($$SELECT idem_replay(NULL, 'k')$$),
  ($$SELECT idem_derive_key('', 'step')$$)
) AS t(stmt);

-- Nothing was written by any of them.
SELECT count(*) = :records_before AS nothing_written FROM idem_records;

-- The key length limit is a setting.
SET idempotency.max_key_length = 300;
SELECT (idem_claim('payments.create', repeat('k', 256))).outcome AS long_key_accepted;
RESET idempotency.max_key_length;

--
-- Hostile input: every argument NULL, absurd sizes and values.  Each one is
-- a clear error with its SQLSTATE; nothing is written.
--
SELECT count(*) AS records_before FROM idem_records \gset
SELECT stmt, pg_temp.error_of(stmt) AS error FROM (VALUES
  ($$SELECT idem_claim('op', 'k', wait => '100000000 years')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '-1 microsecond')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '-1 year 360 days 1 hour')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '25000000 mons -740000000 days', lease => '1 microsecond')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '1 mon -30 days')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '1 day -1 hour')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '1016 years')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '365251 days')$$),
  ($$SELECT idem_claim('op', 'k', ttl => '2147483647 days 2147483647 hours')$$),
  ($$SELECT idem_claim('op', 'k', lease => '1 day -1 microsecond')$$),
  ($$SELECT idem_claim('op', 'k', lease => '-2147483648 mons')$$),
  ($$SELECT idem_claim('op', 'k', wait => '-1 mon 31 days')$$),
  ($$SELECT idem_claim('op', 'k', wait => '1 day -24 hours')$$),
  ($$SELECT idem_heartbeat('1.1.00000000000000000000000000000000', '1 mon -29 days')$$),
  ($$SELECT idem_claim('op', E'k\x01')$$),
  ($$SELECT idem_claim('op', 'k', tenant => E'a\x1b[31m')$$),
  ($$SELECT idem_claim('op', E'\u2603')$$),
  ($$SELECT idem_claim(repeat('o', 10000), 'k')$$),
  ($$SELECT idem_claim('op', repeat('k', 10000))$$),
  ($$SELECT idem_claim('op', 'k', on_lease_expiry => repeat('x', 10000))$$),
  ($$SELECT idem_complete(NULL, NULL)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', -1)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 2147483647)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 200, headers => '{"a": ["b"]}')$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 200, headers => 'null')$$),
  ($$SELECT idem_complete(repeat('9', 10000), 200)$$),
  ($$SELECT idem_complete('9223372036854775808.1.00000000000000000000000000000000', 200)$$),
  ($$SELECT idem_complete('1.2147483648.00000000000000000000000000000000', 200)$$),
  ($$SELECT idem_complete('1.1.0000000000000000000000000000000000', 200)$$),
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000 ', 200)$$),
  ($$SELECT idem_complete('', 200)$$),
  ($$SELECT idem_fail(NULL, 500)$$),
  ($$SELECT idem_fail('1.1.00000000000000000000000000000000', NULL)$$),
  ($$SELECT idem_heartbeat(NULL)$$),
  ($$SELECT idem_heartbeat('1.1.00000000000000000000000000000000', '-1 day')$$),
  ($$SELECT idem_heartbeat('1.1.00000000000000000000000000000000', '100000000 years')$$),
  ($$SELECT idem_checkpoint(NULL, 'x')$$),
  ($$SELECT idem_replay('op', 'k', tenant => NULL)$$),
  ($$SELECT idem_replay('op', 'k', caller => current_user)$$),
  ($$SELECT idem_replay('op', repeat('k', 10000))$$),
  ($$SELECT idem_resolve(1, 'failed', NULL)$$),
  ($$SELECT idem_resolve(1, repeat('x', 10000), 500)$$),
  ($$SELECT idem_resolve(1, 'failed', 500, headers => '[1, 2]')$$),
  ($$SELECT idem_derive_key(NULL, 'step')$$),
  ($$SELECT idem_derive_key('k', NULL)$$),
  ($$SELECT idem_derive_key('k', '')$$),
  ($$SELECT idem_derive_key(E'k\n', 'step')$$),
  ($$SELECT idem_derive_key('k', repeat('s', 10000))$$)
) AS t(stmt);

-- Stored responses have a size limit (idempotency.max_response_size, 1MB
-- by default): a body of tens of MB is refused before anything is written,
-- and the attempt can still complete with a small answer.
SELECT (c).token AS big_token FROM idem_claim('payments.create', 'big-1') c \gset
SELECT idem_complete(:'big_token', 200, to_jsonb(repeat('x', 20 * 1024 * 1024)));
SELECT idem_fail(:'big_token', 500, headers => jsonb_build_object('X-Big', repeat('x', 2 * 1024 * 1024)));
SELECT idem_complete(:'big_token', 201, resource_id => repeat('r', 1024 * 1024 + 1));
SELECT idem_checkpoint(:'big_token', repeat('p', 1024 * 1024 + 1));
SELECT state, response_body IS NULL AS nothing_stored FROM idem_records WHERE key = 'big-1';
-- A lower limit, set by a superuser; body, headers and resource id count together.
SET idempotency.max_response_size = '1kB';
SELECT idem_complete(:'big_token', 200, to_jsonb(repeat('x', 600)), jsonb_build_object('h', repeat('y', 600)));
SELECT idem_complete(:'big_token', 200, to_jsonb(repeat('x', 600)));
RESET idempotency.max_response_size;
SELECT state, octet_length(response_body::text) AS body_bytes FROM idem_records WHERE key = 'big-1';

-- jsonb nested deep: requests and bodies work as far as jsonb itself goes...
SELECT (c).outcome, (c).token AS deep_token
  FROM idem_claim('payments.create', 'deep-1', (repeat('[', 5000) || repeat(']', 5000))::jsonb) c \gset
\echo :outcome
SELECT idem_complete(:'deep_token', 200, (repeat('{"a":', 5000) || '1' || repeat('}', 5000))::jsonb);
SELECT outcome, jsonb_path_query_first(body, 'strict $.**{4999}') AS deepest
  FROM idem_claim('payments.create', 'deep-1', (repeat('[', 5000) || repeat(']', 5000))::jsonb);
-- ... and headers nested at all are refused.
SELECT idem_complete(:'deep_token', 200, headers => (repeat('{"a":', 100) || '"x"' || repeat('}', 100))::jsonb);

-- Names other than the key may be any UTF-8 without control characters.
SELECT outcome FROM idem_claim('op', 'k', tenant => 'société', caller => 'café');

-- Only the three claims that were accepted wrote a record.
SELECT count(*) - :records_before AS records_written FROM idem_records;

\set VERBOSITY terse
--
-- A mangled token (leading blanks, plus signs, leading zeros) is not the
-- token idem_claim returned: 22023 "invalid attempt token", however the
-- number would parse.
--
SELECT token FROM idem_claim('af.op', 'af-token', '{}') \gset
SELECT idem_heartbeat(' ' || :'token') IS NOT NULL AS accepted;
SELECT idem_heartbeat('+' || :'token') IS NOT NULL AS accepted;
SELECT idem_heartbeat('000' || :'token') IS NOT NULL AS accepted;
SELECT idem_heartbeat(replace(:'token', '.1.', '. +1.')) IS NOT NULL AS accepted;
SELECT idem_heartbeat(:'token') IS NOT NULL AS accepted;
DELETE FROM idem_records WHERE operation = 'af.op';
\set VERBOSITY default

