-- The PL/pgSQL peer for a replay.
\set r random(1, :keys)
SELECT outcome, http_status, headers, body FROM peer_claim('payments.create', 'r-' || :r, ('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '"}')::jsonb);
