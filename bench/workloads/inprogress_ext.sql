-- A retry of a command still running (committed claim, live lease).
\set r random(1, :keys)
SELECT outcome, http_status, retry_after FROM idem_claim('payments.create', 'p-' || :r, ('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '"}')::jsonb);
