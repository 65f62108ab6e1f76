-- The HOT floor for a new key: the same INSERT and UPDATE on a table with
-- only the unique index and an expiry index on expires_at, set at the
-- INSERT; the UPDATE changes no indexed column, so it is a HOT update.
\set n random(1, 2000000000)
\set m random(1, 2000000000)
BEGIN;
INSERT INTO floor_hot_records (tenant, caller, operation, key, fingerprint, state, attempt, attempt_token, locked_until, on_lease_expiry, ttl, created_at, claimed_at, updated_at, expires_at) VALUES ('', '', 'payments.create', 'n-' || :client_id || '-' || :n || '-' || :m, sha256(convert_to('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :n || '"}', 'UTF8')), 'processing', 1, '\x0000000000000000000000000000000f', now() + interval '30 seconds', 'unknown', interval '1 day', now(), now(), now(), now() + interval '1 day');
INSERT INTO payments (amount, currency) VALUES (100.00, 'EUR');
UPDATE floor_hot_records SET state = 'succeeded', response_status = 201, response_body = '{"id": "PAY-1", "amount": 100, "currency": "EUR", "status": "captured"}', response_headers = '{"Location": "/payments/PAY-1"}', attempt_token = NULL, locked_until = NULL, completed_at = now(), updated_at = now() WHERE role = to_regrole(current_user::text) AND tenant = '' AND caller = '' AND operation = 'payments.create' AND key = 'n-' || :client_id || '-' || :n || '-' || :m;
COMMIT;
