-- The PL/pgSQL peer for a new key with a request of about 300 bytes.
\set n random(1, 2000000000)
\set m random(1, 2000000000)
BEGIN;
SELECT record_id, attempt FROM peer_claim('payments.create', 'n-' || :client_id || '-' || :n || '-' || :m, ('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :n || '", "payment_method": "pm_card_visa", "metadata": {"cart": "c-8841", "channel": "web"}, "shipping": {"name": "Jane Doe", "line1": "1 Main Street", "city": "Springfield", "postal_code": "12345", "country": "US"}}')::jsonb) \gset
INSERT INTO payments (amount, currency) VALUES (100.00, 'EUR');
SELECT peer_complete(:record_id, :attempt, 201, '{"id": "PAY-1", "amount": 100, "currency": "EUR", "status": "captured"}', '{"Location": "/payments/PAY-1"}');
COMMIT;
