-- The floor for a replay: a bare SELECT by the unique key.
\set r random(1, :keys)
SELECT state, fingerprint, response_status, response_headers, response_body FROM floor_records WHERE role = to_regrole(current_user::text) AND tenant = '' AND caller = '' AND operation = 'payments.create' AND key = 'r-' || :r;
