--
-- A retry's request, written as before or differently, and the column
-- request_text_hash (1.3).  The SQL edition keeps in it the hash of a
-- record's fingerprint with its request's text, and a claim whose request
-- prints the same skips computing the fingerprint; the C extension does not
-- use it.  The answers must be the same in both editions whatever the
-- column holds: a hash left behind by a change of the fingerprint, or
-- written by the table's owner, never turns a mismatch into a replay.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
SET client_min_messages = warning;
-- (the C extension when no edition is installed: the file runs alone too)
SELECT count(*) = 0 AS no_edition FROM pg_proc WHERE proname = 'idem_claim' \gset
\if :no_edition
CREATE EXTENSION IF NOT EXISTS idempotency;
\endif
RESET client_min_messages;

SELECT format_type(atttypid, atttypmod) AS type, attnotnull
  FROM pg_attribute
 WHERE attrelid = 'idem_records'::regclass AND attname = 'request_text_hash';

-- The hash of a fingerprint and a request's text, in this database's
-- encoding.
CREATE FUNCTION pg_temp.text_hash(fingerprint bytea, request jsonb) RETURNS bytea
LANGUAGE sql AS $$
SELECT sha256(fingerprint || int4send(pg_char_to_encoding(getdatabaseencoding()))
              || textsend(request::text))
$$;
-- What the column may hold for a record: nothing, or the hash of its
-- fingerprint with the text of the request it was claimed with.
CREATE FUNCTION pg_temp.hash_state(p_operation text, p_key text, request jsonb) RETURNS text
LANGUAGE sql AS $$
SELECT CASE WHEN r.request_text_hash IS NULL THEN 'none'
            WHEN r.request_text_hash = pg_temp.text_hash(r.fingerprint, request) THEN 'this request'
            ELSE 'another' END
  FROM idem_records AS r WHERE r.operation = p_operation AND r.key = p_key
$$;

-- A completed claim, replayed to the same request however it is written.
SELECT token AS t FROM idem_claim('text.retry', 'k1', '{"b": 1, "a": [1.0, "x", {"z": null, "y": true}]}') \gset
SELECT idem_complete(:'t', 201, '{"id": 7}');
SELECT pg_temp.hash_state('text.retry', 'k1', '{"b": 1, "a": [1.0, "x", {"z": null, "y": true}]}')
       IN ('none', 'this request') AS hash_as_expected;
SELECT outcome, http_status, body
  FROM idem_claim('text.retry', 'k1', '{"b": 1, "a": [1.0, "x", {"z": null, "y": true}]}');
SELECT outcome, http_status, body
  FROM idem_claim_text('text.retry', 'k1', '{"b":1,"a":[1.0,"x",{"z":null,"y":true}]}');
-- the same JSON written differently prints differently: its fingerprint
-- is the same
SELECT outcome, http_status, body
  FROM idem_claim('text.retry', 'k1', '{"a": [1.00, "x", {"y": true, "z": null}], "b": 1.0}');
SELECT outcome, http_status, body
  FROM idem_claim_text('text.retry', 'k1', '{"a":[1e0,"x",{"y":true,"z":null}],"b":10e-1}');
-- another request
SELECT outcome, http_status FROM idem_claim('text.retry', 'k1', '{"b": 2, "a": [1.0, "x", {"z": null, "y": true}]}');
SELECT outcome, http_status FROM idem_claim_text('text.retry', 'k1', '{"b": 1}');
SELECT outcome, http_status FROM idem_claim('text.retry', 'k1');

-- The owner's hash of the first request with another fingerprint (as a
-- change of the fingerprint would leave it) matches no request: the
-- claim computes the fingerprint.
UPDATE idem_records
   SET request_text_hash = pg_temp.text_hash(idem_fingerprint('{"other": true}'),
                                             '{"b": 1, "a": [1.0, "x", {"z": null, "y": true}]}')
 WHERE operation = 'text.retry' AND key = 'k1';
SELECT outcome, http_status FROM idem_claim('text.retry', 'k1', '{"b": 1, "a": [1.0, "x", {"z": null, "y": true}]}');
SELECT outcome, http_status FROM idem_claim('text.retry', 'k1', '{"other": true}');
-- and the owner's hash of another request with the record's fingerprint:
-- that request is not the record's all the same
UPDATE idem_records
   SET request_text_hash = pg_temp.text_hash(fingerprint, '{"other": true}')
 WHERE operation = 'text.retry' AND key = 'k1';
SELECT outcome, http_status FROM idem_claim('text.retry', 'k1', '{"b": 1, "a": [1.0, "x", {"z": null, "y": true}]}');

-- An expired record reused for another request: the first request is a
-- mismatch afterwards, the second replays.
SELECT token AS t FROM idem_claim('text.reuse', 'k1', '{"n": 1}') \gset
SELECT idem_complete(:'t', 200, '{"first": true}');
UPDATE idem_records SET expires_at = now() - interval '1 second'
 WHERE operation = 'text.reuse' AND key = 'k1';
SELECT outcome, attempt, token AS t
  FROM idem_claim('text.reuse', 'k1', '{"n": 2}', on_expired => 'proceed') \gset
SELECT :'outcome' AS outcome, :attempt AS attempt;
SELECT idem_complete(:'t', 200, '{"second": true}');
SELECT pg_temp.hash_state('text.reuse', 'k1', '{"n": 2}') IN ('none', 'this request') AS hash_as_expected,
       pg_temp.hash_state('text.reuse', 'k1', '{"n": 1}') <> 'this request' AS first_request_forgotten;
SELECT outcome, http_status FROM idem_claim('text.reuse', 'k1', '{"n": 1}');
SELECT outcome, http_status FROM idem_claim('text.reuse', 'k1', '{"n": 2}');

-- A request of more than 6000 bytes keeps no hash: its text can be far
-- longer than it (a number written 1e131071 prints 131,072 digits).
SELECT jsonb_build_object('pad', repeat('p', 6000), 'n', '1e5000'::jsonb) AS big \gset
SELECT token AS t FROM idem_claim('text.big', 'k1', :'big') \gset
SELECT idem_complete(:'t', 200, '{"big": true}');
SELECT pg_temp.hash_state('text.big', 'k1', :'big') AS hash;
SELECT outcome, http_status, body FROM idem_claim('text.big', 'k1', :'big');
SELECT outcome, http_status FROM idem_claim('text.big', 'k1', jsonb_set(:'big', '{n}', '1e5001'));
-- nor one read compressed from a table, whose size is its compressed size
-- (a claim with an option takes it as it is stored)
CREATE TEMP TABLE stored_requests (request jsonb);
ALTER TABLE stored_requests ALTER COLUMN request SET COMPRESSION pglz;
INSERT INTO stored_requests
  SELECT jsonb_build_object('pad', repeat('p', 20000), 'n', '1e5000'::jsonb);
SELECT pg_column_compression(request) IS NOT NULL AS compressed,
       pg_column_size(request) <= 6000 AS small_when_compressed
  FROM stored_requests;
SELECT (idem_claim('text.big', 'k2', request, ttl => '1 day')).token AS t FROM stored_requests \gset
SELECT idem_complete(:'t', 200, '{"big": 2}');
SELECT pg_temp.hash_state('text.big', 'k2', request) AS hash FROM stored_requests;
SELECT (idem_claim('text.big', 'k2', request)).outcome FROM stored_requests;

-- A claim without a request keeps no hash, and replays to no request.
SELECT token AS t FROM idem_claim('text.none', 'k1') \gset
SELECT idem_complete(:'t', 204, NULL);
SELECT pg_temp.hash_state('text.none', 'k1', NULL) AS hash;
SELECT outcome, http_status FROM idem_claim('text.none', 'k1');
SELECT outcome, http_status FROM idem_claim('text.none', 'k1', '{}');

-- The application's role cannot write the column: it writes no table.
CREATE ROLE regress_request_text_app;
SELECT has_column_privilege('regress_request_text_app', 'idem_records', 'request_text_hash', 'UPDATE')
       AS may_update,
       has_column_privilege('regress_request_text_app', 'idem_records', 'request_text_hash', 'SELECT')
       AS may_read;
DROP ROLE regress_request_text_app;

DELETE FROM idem_records WHERE operation IN ('text.retry', 'text.reuse', 'text.big', 'text.none');
