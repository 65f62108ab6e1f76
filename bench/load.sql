-- bench/load.sql: :keys finished keys (r-N) and :keys running keys (p-N)
-- with the same content in idem_records, floor_records and peer_records.
\set req '{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order 42"}'
\set resp '{"id": "PAY-1", "amount": 100, "currency": "EUR", "status": "captured"}'

CREATE TEMP TABLE seed AS
SELECT k, k LIKE 'r-%' AS finished
  FROM (SELECT 'r-' || g AS k FROM generate_series(1, :keys) g
        UNION ALL
        SELECT 'p-' || g FROM generate_series(1, :keys) g) s;

-- Records are born processing (the trigger insists), then finished.
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
       attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
       updated_at, expires_at)
SELECT '', current_user, 'payments.create', k, idem_fingerprint(:'req'),
       'processing', 1, now() + interval '1 day', 'unknown', interval '1 day',
       now(), now(), now(), now() + interval '1 day'
  FROM seed;
UPDATE idem_records SET state = 'succeeded', response_status = 201,
       response_body = :'resp', response_headers = '{"Location": "/payments/PAY-1"}',
       locked_until = NULL, completed_at = now()
 WHERE key LIKE 'r-%';

INSERT INTO floor_records (tenant, caller, operation, key, fingerprint, state,
       attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
       updated_at, expires_at, response_status, response_body, response_headers,
       completed_at)
SELECT '', current_user, 'payments.create', k, idem_fingerprint(:'req'),
       CASE WHEN finished THEN 'succeeded' ELSE 'processing' END::idem_state, 1,
       now() + interval '1 day', 'unknown', interval '1 day', now(), now(), now(),
       now() + interval '1 day',
       CASE WHEN finished THEN 201 END,
       CASE WHEN finished THEN :'resp'::jsonb END,
       CASE WHEN finished THEN '{"Location": "/payments/PAY-1"}'::jsonb END,
       CASE WHEN finished THEN now() END
  FROM seed;

INSERT INTO peer_records (tenant, caller, operation, key, fingerprint, state,
       attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
       updated_at, expires_at, response_status, response_body, response_headers,
       completed_at)
SELECT tenant, caller, operation, key, sha256(:'req'::jsonb::text::bytea), state,
       attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
       updated_at, expires_at, response_status, response_body, response_headers,
       completed_at
  FROM floor_records;

VACUUM ANALYZE;
