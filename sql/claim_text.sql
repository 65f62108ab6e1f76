--
-- idem_claim_text (version 1.2): idem_claim's answers with the request as
-- JSON text, fingerprinted without a jsonb value.  Its fingerprint must be
-- the jsonb's for every text jsonb accepts, and text jsonb refuses must be
-- refused with the same error, writing nothing.
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

-- A name of its own: idem_claim keeps one declaration, so an untyped
-- literal request still resolves to its jsonb argument.
SELECT p.oid::regprocedure AS function, p.provolatile, p.proisstrict,
       pg_get_function_arguments(p.oid) AS arguments
  FROM pg_proc p WHERE p.proname IN ('idem_claim', 'idem_claim_text') ORDER BY 1;
SELECT outcome, attempt FROM idem_claim('text.resolve', 'k1', '{"a": 1}');
SELECT fingerprint = idem_fingerprint('{"a": 1}') AS jsonb_fingerprint
  FROM idem_records WHERE operation = 'text.resolve' AND key = 'k1';
-- an untyped literal that is not JSON fails as jsonb input, as before
\set VERBOSITY terse
SELECT outcome FROM idem_claim('text.resolve', 'k2', '{"a": ');
\set VERBOSITY default

-- Nobody may call it until granted, as idem_claim.
CREATE ROLE regress_claim_text_app;
SELECT has_function_privilege('regress_claim_text_app',
                              'idem_claim_text(text, text, text, text)', 'EXECUTE') AS may_execute;
DROP ROLE regress_claim_text_app;

--
-- The same answers as idem_claim for the same key and request.  The
-- columns of each answer, the token by its presence only.
--
CREATE FUNCTION pg_temp.answer(d idem_decision) RETURNS text LANGUAGE sql AS $$
  SELECT format('%s token=%s state=%s attempt=%s status=%s headers=%s body=%s error=%s retry_after=%s resource=%s raw=%s',
                d.outcome, d.token IS NOT NULL, d.state, d.attempt, d.http_status, d.headers,
                d.body, d.error_code, d.retry_after, d.resource_id, d.raw_body)
$$;

-- a new key proceeds, by either function; a second claim of the same key
-- and request, by either function, finds it in progress; another request
-- is a mismatch
SELECT token AS text_token, pg_temp.answer(d)
  FROM idem_claim_text('text.same', 'a', '{"n": 1, "m": [1.50, "x"]}', '') d \gset
SELECT :'text_token' IS NOT NULL AS has_token, :'answer' AS answer;
SELECT token AS jsonb_token, pg_temp.answer(d)
  FROM idem_claim('text.same', 'b', '{"n": 1, "m": [1.50, "x"]}') d \gset
SELECT :'jsonb_token' IS NOT NULL AS has_token, :'answer' AS answer;
SELECT k, pg_temp.answer(t) AS by_text, pg_temp.answer(t) = pg_temp.answer(j) AS same
  FROM (VALUES ('a'), ('b')) v(k),
       idem_claim_text('text.same', k, '{"m": [1.5, "x"], "n": 1.0}', '') t,
       idem_claim('text.same', k, '{"m": [1.5, "x"], "n": 1.0}') j;
SELECT k, pg_temp.answer(t) AS by_text, pg_temp.answer(t) = pg_temp.answer(j) AS same
  FROM (VALUES ('a'), ('b')) v(k),
       idem_claim_text('text.same', k, '{"n": 2}', '') t,
       idem_claim('text.same', k, '{"n": 2}') j;
-- both finish; each replays, by either function, the same answer
SELECT idem_complete(:'text_token', 201, '{"id": "pay_a"}', '{"Location": "/p/a"}', 'pay_a');
SELECT idem_fail(:'jsonb_token', 422, '{"error": "declined"}');
SELECT k, pg_temp.answer(t) AS by_text, pg_temp.answer(t) = pg_temp.answer(j) AS same
  FROM (VALUES ('a'), ('b')) v(k),
       idem_claim_text('text.same', k, ' { "n" : 1 , "m" : [ 1.500 , "x" ] } ', '') t,
       idem_claim('text.same', k, ' { "n" : 1 , "m" : [ 1.500 , "x" ] } ') j;
-- no request: distinct from every JSON value, as with idem_claim
SELECT pg_temp.answer(d) FROM idem_claim_text('text.same', 'none', NULL, '') d;
SELECT k, pg_temp.answer(t) AS by_text, pg_temp.answer(t) = pg_temp.answer(j) AS same
  FROM (VALUES ('none')) v(k),
       idem_claim_text('text.same', k, NULL, '') t,
       idem_claim('text.same', k, NULL) j;
SELECT pg_temp.answer(d) FROM idem_claim_text('text.same', 'none', '""', '') d;
-- the tenant is part of the scope, the calling role the caller
SELECT pg_temp.answer(d) FROM idem_claim_text('text.same', 'a', '{"n": 1, "m": [1.5, "x"]}', 'tenant-2') d;
SELECT pg_temp.answer(d) FROM idem_claim('text.same', 'a', '{"n": 1, "m": [1.5, "x"]}', tenant => 'tenant-2') d;
SELECT tenant, caller = '' AS caller_is_role, role = to_regrole(current_user::text) AS role_is_current, state
  FROM idem_records WHERE operation = 'text.same' AND key = 'a' ORDER BY tenant;
-- an expired record answers expired (on_expired 'reject', the default)
UPDATE idem_records SET expires_at = now() - interval '1 second'
 WHERE operation = 'text.same' AND key = 'a' AND tenant = '';
SELECT k, pg_temp.answer(t) AS by_text, pg_temp.answer(t) = pg_temp.answer(j) AS same
  FROM (VALUES ('a')) v(k),
       idem_claim_text('text.same', k, '{"n": 1, "m": [1.5, "x"]}', '') t,
       idem_claim('text.same', k, '{"n": 1, "m": [1.5, "x"]}') j;

-- In a transaction block a new key is written when idem_claim's would be
-- (once, at its completion, unless the table's own objects rule that out).
BEGIN;
SELECT token AS once_token FROM idem_claim_text('text.same', 'once', '{"n": 7}', '') \gset
SELECT count(*) AS text_written_yet FROM idem_records WHERE operation = 'text.same' AND key = 'once' \gset
SELECT idem_complete(:'once_token', 201, '{"id": 7}');
COMMIT;
BEGIN;
SELECT token AS once_token FROM idem_claim('text.same', 'once-jsonb', '{"n": 7}') \gset
SELECT count(*) AS jsonb_written_yet FROM idem_records WHERE operation = 'text.same' AND key = 'once-jsonb' \gset
SELECT idem_complete(:'once_token', 201, '{"id": 7}');
COMMIT;
SELECT :text_written_yet = :jsonb_written_yet AS written_alike;
SELECT key, state, response_status, fingerprint = idem_fingerprint('{"n": 7}') AS same_fingerprint
  FROM idem_records WHERE operation = 'text.same' AND key IN ('once', 'once-jsonb') ORDER BY key;

--
-- Arguments: the scope's are checked as idem_claim checks them.
--
\set VERBOSITY terse
SELECT outcome FROM idem_claim_text(NULL, 'k', '{}', '');
SELECT outcome FROM idem_claim_text('text.args', NULL, '{}', '');
SELECT outcome FROM idem_claim_text('text.args', 'k', '{}', NULL);
SELECT outcome FROM idem_claim_text('', 'k', '{}', '');
SELECT outcome FROM idem_claim_text('text.args', '', '{}', '');
SELECT outcome FROM idem_claim_text('text.args', E'k\x01', '{}', '');
SELECT outcome FROM idem_claim_text('text.args', 'clé', '{}', '');
SELECT outcome FROM idem_claim_text('text.args', repeat('k', 1000), '{}', '');
-- a key with NUL cannot even be made a text value
SELECT outcome FROM idem_claim_text('text.args', convert_from('\x6b006b'::bytea, 'UTF8'), '{}', '');
-- the request is read first, as idem_claim's cast to jsonb comes first
SELECT outcome FROM idem_claim_text('text.args', NULL, '{', '');
SELECT outcome FROM idem_claim('text.args', NULL, '{');
-- invalid UTF-8 never reaches it: the text is refused on input
SELECT outcome FROM idem_claim_text('text.args', 'k', convert_from('\x7b2261223a2022c3227d'::bytea, 'UTF8'), '');
\set VERBOSITY default
SELECT count(*) AS written FROM idem_records WHERE operation = 'text.args';

--
-- The fingerprint of the text against the jsonb's, and the errors of text
-- jsonb refuses, for each document: 'same: ok' when both fingerprint the
-- same digest (the claim by text proceeds, a claim of the jsonb finds it in
-- progress, not a mismatch, and the stored fingerprint is the jsonb's);
-- 'same: <error>' when both refuse it with the same SQLSTATE and message.
-- Each claim is rolled back: nothing is written.
--
CREATE FUNCTION pg_temp.text_vs_jsonb(doc text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    by_jsonb text;
    by_text text;
BEGIN
    BEGIN
        PERFORM idem_fingerprint(doc::jsonb);
        by_jsonb := 'ok';
    EXCEPTION WHEN OTHERS THEN
        by_jsonb := SQLSTATE || ' ' || SQLERRM;
    END;
    BEGIN
        IF (SELECT outcome FROM idem_claim_text('text.fp', 'doc', doc, '')) <> 'proceed' THEN
            RAISE SQLSTATE 'P0001' USING MESSAGE = 'not proceed';
        END IF;
        IF (SELECT outcome FROM idem_claim('text.fp', 'doc', doc::jsonb)) <> 'in_progress' THEN
            RAISE SQLSTATE 'P0001' USING MESSAGE = 'mismatch';
        END IF;
        IF NOT (SELECT fingerprint = idem_fingerprint(doc::jsonb) FROM idem_records
                 WHERE operation = 'text.fp' AND key = 'doc') THEN
            RAISE SQLSTATE 'P0001' USING MESSAGE = 'stored fingerprint differs';
        END IF;
        RAISE SQLSTATE 'P0001' USING MESSAGE = 'ok';
    EXCEPTION WHEN SQLSTATE 'P0001' THEN
        by_text := SQLERRM;
    WHEN OTHERS THEN
        by_text := SQLSTATE || ' ' || SQLERRM;
    END;
    IF by_jsonb = by_text THEN
        RETURN 'same: ' || by_jsonb;
    END IF;
    RETURN 'DIFFERENT: jsonb ' || by_jsonb || ', text ' || by_text;
END
$$;

SELECT doc, pg_temp.text_vs_jsonb(doc) AS result
  FROM (VALUES
    -- structure, order, whitespace, repeated names (jsonb keeps the last)
    ('{}'), ('[]'), ('[{}, [], [[]], {"a": {}}]'), ('{"b": 1, "a": 2}'),
    (E' \t\r\n{ "a" : [ 1 , 2 ] , "b" : null } \n'),
    ('{"a": 1, "a": 2}'), ('{"a": 2, "a": 1}'),
    ('{"a": {"x": 1, "x": [1, 2]}, "b": [{"c": 1, "c": {"d": 1}}], "a": 3}'),
    ('{"a": 1, "b": {"a": 2, "a": 3}, "a": {"c": 1, "c": 2}}'),
    ('{"aa": 1, "a": 2, "": 3, "b": 4, "ab": 5, "a\u0001": 6}'),
    ('{"z": [{"b": 1, "a": 2}, {"d": [3, {"f": 1, "e": 2}]}], "y": true, "x": false}'),
    -- scalars at the top
    ('"x"'), ('true'), ('false'), ('null'), ('0'), ('-0'), ('-0.0'), ('0.0e5'),
    -- numbers: exact, in ECMAScript form, at the edges of the direct path
    ('1.0'), ('100.00'), ('1e2'), ('1E+2'), ('1e-7'), ('0.000001'), ('0.0000001'),
    ('1e20'), ('1e21'), ('123456789012345678901'), ('1234567890123456789012'),
    ('-1.5e300'), ('1.5e-7'), ('0.10000000000000000001'), ('1e999'), ('1e-999'),
    ('-0.000e-999'), ('1234567890123456789012345678901234567890'),
    ('12345678901234567890123456789012345678901'),
    ('1.23456789012345678901234567890123456789'),
    ('1.234567890123456789012345678901234567890'),
    ('1e0999'), ('1e1000'), ('1e-1000'), ('9e9999'), ('1e-16383'), ('1e-16384'),
    ('0e-16384'), ('1e131071'), ('1e131072'), ('1e1000000'), ('-1e-1000000'),
    ('[1, -1, 1.5, -1.5, 1e-6, 1e-7, 1e21, 1e20, 99.990, 0.5e1]'),
    -- strings: escapes, Unicode, surrogate pairs, UTF-16 member order
    ('"\/\b\f\n\r\t\"\\"'), ('"\u0001\u001f\u007f\u0080\u2028\u2029"'),
    ('"\u00e9 é \ud83d\ude02"'), ('{"\ud83d\ude02": 1, "\ufb33": 2, "é": 3, "e": 4}'),
    ('{"\u20ac": 1, "\ud800\udc00": 2, "\uffff": 3}'),
    -- refused by jsonb: the same error
    (''), (' '), ('{'), ('{"a": 1,}'), ('[1,]'), ('{"a"}'), ('{"a": }'), ('[1 2]'),
    ('01'), ('-'), ('1.'), ('.5'), ('+1'), ('1e'), ('1e+'), ('NaN'), ('Infinity'),
    ('nul'), ('truex'), ('"abc'), (E'"a\tb"'), ('"\x"'), ('"\u12"'), ('"\u0000"'),
    ('{"a\u0000": 1}'), ('"\ud800"'), ('"\udc00"'), ('"\ud800\u0041"'),
    ('{"a": 1} {"b": 2}'), ('[1]]'), (E'{"a": 1}\u0001')
  ) AS d(doc);

-- Long and deep documents: past the length fingerprinted from the text
-- (16 KB), jsonb's own path; either side of it, the same digest.
SELECT n, pg_temp.text_vs_jsonb(doc) AS result
  FROM (SELECT n, '{"s": "' || repeat('x', n - 9) || '"}' AS doc
          FROM unnest(ARRAY[16383, 16384, 16385, 100000]) n) d;
SELECT n, pg_temp.text_vs_jsonb(doc) AS result
  FROM (SELECT n, '{"b": ' || repeat('{"b": 1, "a": ', n) || '1' || repeat('}', n) || ', "a": 0}' AS doc
          FROM unnest(ARRAY[10, 1000, 2000, 5000]) n) d;
SELECT n, pg_temp.text_vs_jsonb(doc) AS result
  FROM (SELECT n, repeat('[', n) || repeat(']', n) AS doc
          FROM unnest(ARRAY[1000, 8000]) n) d;
SELECT pg_temp.text_vs_jsonb('[' || string_agg(format('{"k%s": %s, "k%s": "%s"}', g % 7, g, g % 5, g), ',') || ']')
       AS many_members
  FROM generate_series(1, 300) g;
SELECT pg_temp.text_vs_jsonb(string_agg(x, '')) AS unterminated_long
  FROM (SELECT '{"s": "' || repeat('y', 20000) AS x) s;

-- The RFC 8785 test vectors (test/data/jcs/).
\set doc `cat test/data/jcs/input/arrays.json`
SELECT pg_temp.text_vs_jsonb(:'doc') AS arrays;
\set doc `cat test/data/jcs/input/french.json`
SELECT pg_temp.text_vs_jsonb(:'doc') AS french;
\set doc `cat test/data/jcs/input/structures.json`
SELECT pg_temp.text_vs_jsonb(:'doc') AS structures;
\set doc `cat test/data/jcs/input/unicode.json`
SELECT pg_temp.text_vs_jsonb(:'doc') AS unicode;
\set doc `cat test/data/jcs/input/values.json`
SELECT pg_temp.text_vs_jsonb(:'doc') AS "values";
\set doc `cat test/data/jcs/input/weird.json`
SELECT pg_temp.text_vs_jsonb(:'doc') AS weird;

-- Numbers of every shape the direct path reads, against numeric_in.
SELECT count(*) AS numbers,
       count(*) FILTER (WHERE pg_temp.text_vs_jsonb(doc) <> 'same: ok') AS different
  FROM (SELECT format('[%s%s%s%s]', sign, mantissa, frac, exp) AS doc
          FROM unnest(ARRAY['', '-']) sign,
               unnest(ARRAY['0', '1', '9', '10', '100', '1000', '10000', '12345', '99999999',
                            '1000000000000000000000', '123456789012345678901234567890']) mantissa,
               unnest(ARRAY['', '.0', '.5', '.05', '.000100', '.123456789', '.0000000001']) frac,
               unnest(ARRAY['', 'e0', 'e1', 'E+3', 'e-3', 'e6', 'e-6', 'e-7', 'e20', 'e21', 'e-20',
                            'e-21', 'e100', 'e-100', 'e999', 'e-999']) exp) n;

-- A number that numeric_in reads (over 40 characters, or an exponent of
-- four digits or more) is read as jsonb_in reads it: once the token after
-- it is lexed, so an invalid token there is the error, not the number's.
SELECT doc, pg_temp.text_vs_jsonb(doc) AS result
  FROM (VALUES ('[1e1000000 x]'), ('1e-16384/'), ('1e1000000 @'), ('[1e1000000 "abc'),
               ('{"a": 1e1000000 "\u12"}'), ('[1e1000000, x]'), ('[1e1000000]'),
               ('[1e0999 #]'), ('[1e0999 ]'), ('[' || repeat('1', 41) || ' x]'),
               ('[' || repeat('1', 41) || ' ]'), ('[1e999 x]'), ('[1e1000000x]')
  ) AS d(doc);

-- Nothing was written by any of them.
SELECT count(*) AS written FROM idem_records WHERE operation = 'text.fp';
