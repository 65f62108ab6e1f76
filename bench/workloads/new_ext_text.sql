-- A new key through idem_claim_text: claim, business write and completion
-- in one transaction, the request as JSON text.
\set n random(1, 2000000000)
\set m random(1, 2000000000)
BEGIN;
SELECT token FROM idem_claim_text('payments.create', 'n-' || :client_id || '-' || :n || '-' || :m, '{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :n || '"}', '') \gset
INSERT INTO payments (amount, currency) VALUES (100.00, 'EUR');
SELECT idem_complete(:token, 201, '{"id": "PAY-1", "amount": 100, "currency": "EUR", "status": "captured"}', '{"Location": "/payments/PAY-1"}');
COMMIT;
