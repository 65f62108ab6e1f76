-- The floor for a new key on a table shaped like idem_records (same
-- indexes): a bare INSERT of the claim row, with sha256 of the raw request
-- text, and an UPDATE with the response.
\set n random(1, 2000000000)
\set m random(1, 2000000000)
BEGIN;
INSERT INTO floor_records (tenant, caller, operation, key, fingerprint, state, attempt, attempt_token, locked_until, on_lease_expiry, ttl, created_at, claimed_at, updated_at, expires_at) VALUES ('', '', 'payments.create', 'n-' || :client_id || '-' || :n || '-' || :m, sha256(convert_to('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :n || '"}', 'UTF8')), 'processing', 1, '\x0000000000000000000000000000000f', now() + interval '30 seconds', 'unknown', interval '1 day', now(), now(), now(), now() + interval '1 day') RETURNING id \gset
INSERT INTO payments (amount, currency) VALUES (100.00, 'EUR');
UPDATE floor_records SET state = 'succeeded', response_status = 201, response_body = '{"id": "PAY-1", "amount": 100, "currency": "EUR", "status": "captured"}', response_headers = '{"Location": "/payments/PAY-1"}', attempt_token = NULL, locked_until = NULL, completed_at = now(), updated_at = now(), expires_at = now() + ttl WHERE id = :id;
COMMIT;
