-- A retry of a finished command: the stored response.
\set r random(1, :keys)
SELECT outcome, http_status, headers, body FROM idem_claim('payments.create', 'r-' || :r, '{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order 42"}');
