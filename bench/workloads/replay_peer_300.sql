-- The PL/pgSQL peer for a replay of a key (q-N) claimed with a request of
-- about 300 bytes.
\set r random(1, :keys)
SELECT outcome, http_status, headers, body FROM peer_claim('payments.create', 'q-' || :r, ('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '", "payment_method": "pm_card_visa", "metadata": {"cart": "c-8841", "channel": "web"}, "shipping": {"name": "Jane Doe", "line1": "1 Main Street", "city": "Springfield", "postal_code": "12345", "country": "US"}}')::jsonb);
