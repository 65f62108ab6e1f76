--
-- Invalid calls raise a clear error with a proper SQLSTATE and change
-- nothing.  Expected outcomes (in_progress, mismatch, ...) are never errors.
--
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
  ($$SELECT idem_claim('op', 'k', caller => NULL)$$),
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
  ($$SELECT idem_complete('1.1.00000000000000000000000000000000', 200, headers => '[]')$$),
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
