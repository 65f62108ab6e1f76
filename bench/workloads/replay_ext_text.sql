-- A replay through idem_claim_text: the request as JSON text, fingerprinted
-- without a jsonb value, the options at their defaults.
\set r random(1, :keys)
SELECT outcome, http_status, headers, body FROM idem_claim_text('payments.create', 'r-' || :r, '{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '"}', '');
