-- The SELECT with sha256 of the raw request text, for a request of about
-- 300 bytes (keys q-N).
\set r random(1, :keys)
SELECT state, fingerprint = sha256(convert_to('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '", "payment_method": "pm_card_visa", "metadata": {"cart": "c-8841", "channel": "web"}, "shipping": {"name": "Jane Doe", "line1": "1 Main Street", "city": "Springfield", "postal_code": "12345", "country": "US"}}', 'UTF8')) AS same_request, response_status, response_headers, response_body FROM floor_hot_records WHERE role = to_regrole(current_user::text) AND tenant = '' AND caller = '' AND operation = 'payments.create' AND key = 'q-' || :r;
