-- A retry of a finished command: the stored response.  The request is the
-- one the key was first claimed with, built afresh on each call.
\set r random(1, :keys)
SELECT outcome, http_status, headers, body FROM idem_claim('payments.create', 'r-' || :r, ('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '"}')::jsonb);
