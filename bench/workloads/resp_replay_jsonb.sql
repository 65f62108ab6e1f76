-- A retry answered with a stored 1 KB jsonb body.
\set r random(1, :keys)
SELECT outcome, http_status, headers, body FROM idem_claim('responses', :prefix || '-' || :r);
