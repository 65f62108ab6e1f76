-- A replay's floor with the request checked: the SELECT by the unique key
-- and sha256 of the raw request text compared with the stored one.
\set r random(1, :keys)
SELECT state, fingerprint = sha256(convert_to('{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order ' || :r || '"}', 'UTF8')) AS same_request, response_status, response_headers, response_body FROM floor_hot_records WHERE role = to_regrole(current_user::text) AND tenant = '' AND caller = '' AND operation = 'payments.create' AND key = 'r-' || :r;
