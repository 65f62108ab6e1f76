-- scripts/demo.sql: run by scripts/demo.sh on a throwaway cluster.
\set QUIET on
\pset footer off
CREATE EXTENSION idempotency;
CREATE TABLE payments (id text PRIMARY KEY, amount numeric NOT NULL);
\set QUIET off

\echo
\echo '== 1. POST /payments, Idempotency-Key: 8e03a1, {"amount": 100.00, "currency": "EUR"}'
\echo '==    Claim, business write and completion in one transaction.'
\set QUIET on
BEGIN;
SELECT outcome, attempt, token
  FROM idem_claim('payments.create', '8e03a1', '{"amount": 100.00, "currency": "EUR"}') \gset
\echo '   idem_claim ->' :outcome ', attempt' :attempt ', token' :token
INSERT INTO payments VALUES ('PAY-1', 100.00);
\echo '   INSERT INTO payments ... (the business write)'
SELECT idem_complete(:'token', 201, '{"id": "PAY-1", "amount": 100, "currency": "EUR"}',
                     '{"Location": "/payments/PAY-1"}', 'PAY-1') \gset
\echo '   idem_complete(token, 201, body, headers, resource_id)'
COMMIT;
\set QUIET off

\echo
\echo '== 2. The client retries: same key, same request (members reordered, 100 for 100.00).'
\echo '==    The stored response is replayed; nothing runs twice.'
SELECT outcome, http_status, headers, body, resource_id
  FROM idem_claim('payments.create', '8e03a1', '{"currency": "EUR", "amount": 100}');
SELECT count(*) AS payments_created FROM payments;

\echo
\echo '== 3. The same key with a different request: refused (HTTP 422).'
SELECT outcome, http_status, error_code
  FROM idem_claim('payments.create', '8e03a1', '{"amount": 250, "currency": "EUR"}');

\echo
\echo '== 4. An external call: the claim commits on its own with a lease.'
\echo '==    A retry while the provider is being called is told to come back (HTTP 409).'
SELECT token AS token2
  FROM idem_claim('payments.create', 'b71f09', '{"amount": 42}', lease => '30s') \gset
SELECT outcome, http_status, error_code, retry_after
  FROM idem_claim('payments.create', 'b71f09', '{"amount": 42}');
\echo '   ... the provider answers; the attempt completes:'
SELECT idem_complete(:'token2', 201, '{"id": "PAY-2"}') \gset
SELECT outcome, http_status, body
  FROM idem_claim('payments.create', 'b71f09', '{"amount": 42}');

\echo
\echo '== 5. The records, per operation and state.'
SELECT operation, state, records FROM idem_stats ORDER BY state;

\echo
\echo '== 6. A process claims a key and dies without completing (lease 1s).'
\echo '==    The background worker notices the ended lease and marks the outcome unknown.'
\set QUIET on
SELECT token AS token3
  FROM idem_claim('payments.create', 'dead01', '{"amount": 7}', lease => '1 second') \gset
DO $$
BEGIN
  FOR i IN 1..300 LOOP
    EXIT WHEN (SELECT state FROM idem_records WHERE key = 'dead01') = 'unknown';
    PERFORM pg_sleep(0.1);
  END LOOP;
END $$;
\set QUIET off
SELECT key, state, attempt FROM idem_records WHERE key = 'dead01';
SELECT outcome, http_status, error_code
  FROM idem_claim('payments.create', 'dead01', '{"amount": 7}');

\echo
\echo '== 7. The worker of this database.'
SELECT database, pid IS NOT NULL AS running, cycles > 0 AS has_cycled,
       rows_expired, rows_deleted, last_error
  FROM idem_worker_status();
