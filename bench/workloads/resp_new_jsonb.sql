-- A new key completed with a 1 KB JSON body given as jsonb.
\set n random(1, 2000000000)
BEGIN;
SELECT token FROM idem_claim('responses', :prefix || '-new-' || :client_id || '-' || :n || '-' || random()) \gset
SELECT idem_complete(:token, 201, :body::jsonb, '[["Content-Type", "application/json"]]');
COMMIT;
