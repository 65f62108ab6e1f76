-- The PL/pgSQL peer for a retry of a command still running.
\set r random(1, :keys)
SELECT outcome, http_status FROM peer_claim('payments.create', 'p-' || :r, ('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '"}')::jsonb);
