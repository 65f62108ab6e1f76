-- A new key completed with the same 1 KB body given as its bytes.
\set n random(1, 2000000000)
BEGIN;
SELECT token FROM idem_claim('responses', :prefix || '-new-' || :client_id || '-' || :n || '-' || random()) \gset
SELECT idem_complete(:token, 201, headers => '[["Content-Type", "application/json"]]', raw_body => convert_to(:body, 'UTF8'));
COMMIT;
