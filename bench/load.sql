-- bench/load.sql: :keys finished keys (r-N, and q-N with a longer request)
-- and :keys running keys (p-N) with the same content in idem_records,
-- floor_records, floor_hot_records and peer_records.  Key r-N / p-N / q-N
-- was claimed with the request whose description is "order N", as the
-- workloads send it.
\set resp '{"id": "PAY-1", "amount": 100, "currency": "EUR", "status": "captured"}'

CREATE TEMP TABLE seed AS
SELECT k, k NOT LIKE 'p-%' AS finished, req
  FROM (SELECT 'r-' || g AS k, g FROM generate_series(1, :keys) g
        UNION ALL
        SELECT 'p-' || g, g FROM generate_series(1, :keys) g) s,
       LATERAL (SELECT '{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order '
                       || g || '"}' AS req) r
UNION ALL
-- :keys finished keys (q-N) claimed with a request of about 300 bytes, the
-- one of the workloads *_300.sql
SELECT 'q-' || g, true,
       '{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order '
       || g || '", "payment_method": "pm_card_visa", "metadata": {"cart": "c-8841", "channel": "web"}, '
       || '"shipping": {"name": "Jane Doe", "line1": "1 Main Street", "city": "Springfield", '
       || '"postal_code": "12345", "country": "US"}}'
  FROM generate_series(1, :keys) g;

-- Records are born processing (the trigger insists), then finished.
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
       attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
       updated_at, expires_at)
SELECT '', '', 'payments.create', k, idem_fingerprint(req::jsonb),
       'processing', 1, now() + interval '1 day', 'unknown', interval '1 day',
       now(), now(), now(), now() + interval '1 day'
  FROM seed;
-- The SQL edition's claim keeps request_text_hash, which its replays
-- compare (the C edition does not read it).
SELECT to_regprocedure('idem__request_text_hash(bytea, jsonb)') IS NOT NULL AS sql_edition \gset
\if :sql_edition
UPDATE idem_records AS r SET request_text_hash = idem__request_text_hash(r.fingerprint, s.req::jsonb)
  FROM seed AS s WHERE s.k = r.key;
\endif
UPDATE idem_records SET state = 'succeeded', response_status = 201,
       response_body = :'resp', response_headers = '{"Location": "/payments/PAY-1"}',
       locked_until = NULL, completed_at = now()
 WHERE key IN (SELECT k FROM seed WHERE finished);

INSERT INTO floor_records (tenant, caller, operation, key, fingerprint, state,
       attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
       updated_at, expires_at, response_status, response_body, response_headers,
       completed_at)
SELECT '', '', 'payments.create', k, idem_fingerprint(req::jsonb),
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
SELECT f.tenant, f.caller, f.operation, f.key, sha256(s.req::jsonb::text::bytea), f.state,
       f.attempt, f.locked_until, f.on_lease_expiry, f.ttl, f.created_at, f.claimed_at,
       f.updated_at, f.expires_at, f.response_status, f.response_body, f.response_headers,
       f.completed_at
  FROM floor_records f JOIN seed s ON s.k = f.key;

INSERT INTO floor_hot_records (tenant, caller, operation, key, fingerprint, state,
       attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
       updated_at, expires_at, response_status, response_body, response_headers,
       completed_at)
SELECT f.tenant, f.caller, f.operation, f.key, sha256(convert_to(s.req, 'UTF8')), f.state,
       f.attempt, f.locked_until, f.on_lease_expiry, f.ttl, f.created_at, f.claimed_at,
       f.updated_at, f.expires_at, f.response_status, f.response_body, f.response_headers,
       f.completed_at
  FROM floor_records f JOIN seed s ON s.k = f.key;

VACUUM ANALYZE;
