-- A retry answered with a stored 1 KB raw body.
\set r random(1, :keys)
SELECT outcome, http_status, headers, raw_body FROM idem_claim('responses', :prefix || '-' || :r);
