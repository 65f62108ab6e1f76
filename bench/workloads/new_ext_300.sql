-- A new key with a request of about 300 bytes that differs per call:
-- claim, business write and completion in one transaction.  Run against
-- either edition (the bench database holds the C edition, bench_sql the
-- SQL edition): the editions part of run.sh.
\set n random(1, 2000000000)
\set m random(1, 2000000000)
BEGIN;
SELECT token FROM idem_claim('payments.create', 'n-' || :client_id || '-' || :n || '-' || :m, ('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :n || '", "payment_method": "pm_card_visa", "metadata": {"cart": "c-8841", "channel": "web"}, "shipping": {"name": "Jane Doe", "line1": "1 Main Street", "city": "Springfield", "postal_code": "12345", "country": "US"}}')::jsonb) \gset
INSERT INTO payments (amount, currency) VALUES (100.00, 'EUR');
SELECT idem_complete(:token, 201, '{"id": "PAY-1", "amount": 100, "currency": "EUR", "status": "captured"}', '{"Location": "/payments/PAY-1"}');
COMMIT;
