--
-- Exact responses: a raw body of any content type replays byte for byte,
-- headers given as [name, value] pairs replay in order and with repeats,
-- and with idempotency.encryption_key set nothing of the response is
-- stored in plaintext.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
CREATE FUNCTION pg_temp.error_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || SQLERRM;
END $$;

-- A JSON body given as its bytes keeps its key order, spacing, duplicate
-- keys and number spelling; jsonb would not.
SELECT token AS t FROM idem_claim('exact', 'json-bytes', '{"n": 1}') \gset
SELECT idem_complete(:'t', 200,
         headers => '[["Content-Type", "application/json"], ["Set-Cookie", "a=1; Path=/"],
                      ["ETag", "\"x1\""], ["Set-Cookie", "b=2; Path=/"]]',
         raw_body => convert_to(E'{ "z": 1.50,\n  "a": [1e2, "\\u00e9"], "z": 2 }', 'UTF8'));
SELECT outcome, http_status, body, headers,
       convert_from(raw_body, 'UTF8') AS raw_body_text
  FROM idem_claim('exact', 'json-bytes', '{"n": 1}');
SELECT raw_body = convert_to(E'{ "z": 1.50,\n  "a": [1e2, "\\u00e9"], "z": 2 }', 'UTF8') AS same_bytes,
       jsonb_array_length(headers) AS header_count
  FROM idem_replay('exact', 'json-bytes');

-- Any bytes: every byte value, in an order jsonb could not keep.
SELECT token AS t FROM idem_claim('exact', 'binary') \gset
SELECT idem_complete(:'t', 200, headers => '[["Content-Type", "application/octet-stream"]]',
                     raw_body => (SELECT string_agg(set_byte('\x00'::bytea, 0, 255 - i), '' ORDER BY i)
                                    FROM generate_series(0, 255) i));
SELECT length(raw_body) AS bytes, get_byte(raw_body, 0) AS first, get_byte(raw_body, 255) AS last,
       md5(raw_body) = md5((SELECT string_agg(set_byte('\x00'::bytea, 0, 255 - i), '' ORDER BY i)
                              FROM generate_series(0, 255) i)) AS same_bytes
  FROM idem_replay('exact', 'binary');

-- An empty body and no body are different answers.
SELECT token AS t FROM idem_claim('exact', 'empty-body') \gset
SELECT idem_complete(:'t', 204, raw_body => '');
SELECT token AS t FROM idem_claim('exact', 'no-body') \gset
SELECT idem_complete(:'t', 204);
SELECT key, raw_body IS NULL AS no_raw_body, length(raw_body) AS raw_length, body IS NULL AS no_body
  FROM (VALUES ('empty-body'), ('no-body')) AS k(key), idem_replay('exact', k.key)
 ORDER BY key;

-- 1.0's forms keep working: a jsonb body and a header object.
SELECT token AS t FROM idem_claim('exact', 'v1-forms') \gset
SELECT idem_complete(:'t', 201, '{"id": 7}', '{"Location": "/things/7"}');
SELECT body, headers, raw_body FROM idem_replay('exact', 'v1-forms');

-- Failures and resolves store raw bodies too.
SELECT token AS t FROM idem_claim('exact', 'failed-raw') \gset
SELECT idem_fail(:'t', 422, headers => '[["Content-Type", "text/plain"]]',
                 raw_body => convert_to('card declined', 'UTF8'));
SELECT outcome, state, http_status, convert_from(raw_body, 'UTF8') AS text
  FROM idem_claim('exact', 'failed-raw');
SELECT token IS NOT NULL AS claimed FROM idem_claim('exact', 'resolved-raw', lease => '1 microsecond');
SELECT outcome FROM idem_claim('exact', 'resolved-raw');
SELECT idem_resolve(id, 'succeeded', 200, headers => '[["Content-Type", "text/csv"]]',
                    raw_body => convert_to(E'id,amount\n1,2.50\n', 'UTF8'))
  FROM idem_records WHERE key = 'resolved-raw';
SELECT outcome, http_status, headers, convert_from(raw_body, 'UTF8') AS text
  FROM idem_claim('exact', 'resolved-raw');

-- A 1 MB raw body round-trips; the size limit counts it.
SELECT token AS t FROM idem_claim('exact', 'one-megabyte') \gset
SELECT idem_complete(:'t', 200, raw_body => convert_to(repeat('0123456789abcdef', 65536), 'UTF8'));
SELECT length(raw_body) AS bytes,
       raw_body = convert_to(repeat('0123456789abcdef', 65536), 'UTF8') AS same_bytes
  FROM idem_replay('exact', 'one-megabyte');
SELECT token AS t FROM idem_claim('exact', 'too-large') \gset
SELECT pg_temp.error_of(format($$SELECT idem_complete(%L, 200, raw_body => convert_to(repeat('x', 1048577), 'UTF8'))$$, :'t'));

--
-- Bad responses: 22023, a message naming what is wrong, nothing stored
-- (the attempt is still processing afterwards).
--
SELECT token AS t FROM idem_claim('exact', 'bad') \gset
SELECT stmt, pg_temp.error_of(format(stmt, :'t')) AS error FROM (VALUES
  ($$SELECT idem_complete(%L, 200, headers => '[["Connection", "close"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["Transfer-Encoding", "chunked"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '{"keep-alive": "timeout=5"}')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["Upgrade", "h2c"], ["TE", "trailers"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["Proxy-Connection", "close"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["Trailer", "Expires"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["X-A", "a\r\nSet-Cookie: evil=1"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["X A", "v"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["", "v"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["X-A"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["X-A", "b", "c"]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["X-A", 1]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[["X-A", ["b"]]]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '["X-A", "b"]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '[{"X-A": "b"}]')$$),
  ($$SELECT idem_complete(%L, 200, headers => '"X-A: b"')$$),
  ($$SELECT idem_complete(%L, 200, headers => 'null')$$),
  ($$SELECT idem_complete(%L, 200, '{}', raw_body => '\x00')$$),
  ($$SELECT idem_fail(%L, 500, '{}', raw_body => '')$$)
) AS s(stmt);
SELECT state, response_headers, response_raw_body FROM idem_records WHERE key = 'bad';
-- Empty header lists are fine, in both forms.
SELECT idem_complete(:'t', 200, headers => '[]', raw_body => '');
SELECT headers FROM idem_replay('exact', 'bad');

--
-- Encryption at rest.
--
-- A key is 64 hexadecimal digits, nothing else.
SELECT pg_temp.error_of($$SET idempotency.encryption_key = 'abc'$$);
SELECT pg_temp.error_of($$SET idempotency.encryption_key = '$$ || repeat('g', 64) || $$'$$);
SELECT pg_temp.error_of($$SET idempotency.encryption_key = '$$ || repeat('0', 66) || $$'$$);
-- ... and never stored where every role can read it.
SELECT pg_temp.error_of($$ALTER ROLE CURRENT_USER SET idempotency.encryption_key = '$$ || repeat('ab', 32) || $$'$$);
SELECT pg_temp.error_of($$CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql
                          SET idempotency.encryption_key = '$$ || repeat('ab', 32) || $$' AS 'SELECT 1'$$);

-- (in the SQL edition the setting is a placeholder and the ALTER ROLE
-- above succeeds: nothing of it stays in the catalogs)
ALTER ROLE CURRENT_USER RESET idempotency.encryption_key;
SET idempotency.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SHOW idempotency.encryption_key;
SELECT count(*) AS listed FROM pg_settings WHERE name LIKE 'idempotency.encryption%';

SELECT token AS t FROM idem_claim('exact', 'sealed') \gset
SELECT idem_complete(:'t', 201, headers => '[["Set-Cookie", "session=s3cr3t-cookie"], ["Set-Cookie", "b=2"]]',
                     raw_body => convert_to('{"card": "4242-secret-number"}', 'UTF8'), resource_id => 'pay_9');
SELECT token AS t FROM idem_claim('exact', 'sealed-json') \gset
SELECT idem_complete(:'t', 200, '{"iban": "DE89-secret-iban"}');
-- Nothing of the responses is in the rows, not even compressed away: the
-- sealed column is all there is, and it holds no plaintext.
SELECT key, response_headers IS NULL AS no_headers, response_body IS NULL AS no_body,
       response_raw_body IS NULL AS no_raw_body, resource_id,
       position('secret' IN encode(response_sealed, 'escape')) = 0 AS no_plaintext,
       get_byte(response_sealed, 0) AS format
  FROM idem_records WHERE key LIKE 'sealed%' ORDER BY key;
-- The replay is the response as given.
SELECT outcome, http_status, headers, convert_from(raw_body, 'UTF8') AS raw_body, resource_id
  FROM idem_claim('exact', 'sealed');
SELECT body FROM idem_replay('exact', 'sealed-json');

-- Rotation: the old key, set as the previous one, still opens what it sealed.
SET idempotency.encryption_key_previous = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SET idempotency.encryption_key = 'ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT body FROM idem_replay('exact', 'sealed-json');
-- Without it, the replay is a clear error, never garbage.
RESET idempotency.encryption_key_previous;
\set VERBOSITY terse
SELECT body FROM idem_replay('exact', 'sealed-json');
-- A response changed in the table, or moved onto another record, does not open.
SET idempotency.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
UPDATE idem_records SET response_sealed = overlay(response_sealed PLACING '\xff' FROM 30 FOR 1)
 WHERE key = 'sealed-json';
SELECT body FROM idem_replay('exact', 'sealed-json');
UPDATE idem_records SET response_sealed = (SELECT response_sealed FROM idem_records WHERE key = 'sealed')
 WHERE key = 'sealed-json';
SELECT body FROM idem_replay('exact', 'sealed-json');
\set VERBOSITY default
-- Without any key, plaintext again; sealed records need their key.
RESET idempotency.encryption_key;
SHOW idempotency.encryption_key;
SELECT token AS t FROM idem_claim('exact', 'plain-again') \gset
SELECT idem_complete(:'t', 200, '{"a": 1}');
SELECT response_body, response_sealed IS NULL AS not_sealed FROM idem_records WHERE key = 'plain-again';

-- Other roles cannot read or set the keys.  (Reading, 42501: the message
-- is PostgreSQL's, worded differently by each version.)
CREATE ROLE regress_exact_reader;
SET ROLE regress_exact_reader;
SELECT split_part(pg_temp.error_of('SHOW idempotency.encryption_key'), ' ', 1) AS error_of;
SELECT pg_temp.error_of($$SET idempotency.encryption_key = '$$ || repeat('ab', 32) || $$'$$);
RESET ROLE;
DROP ROLE regress_exact_reader;

DELETE FROM idem_records WHERE operation = 'exact';
