--
-- Canonical JSON (RFC 8785 with exact numbers) and the request fingerprint.
-- Numbers have a file of their own: canonical_numbers.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
SET client_min_messages = warning;
-- (the C extension when no edition is installed: the file runs alone too)
SELECT count(*) = 0 AS no_edition FROM pg_proc WHERE proname = 'idem_canonical' \gset
\if :no_edition
CREATE EXTENSION IF NOT EXISTS idempotency;
\endif
CREATE EXTENSION IF NOT EXISTS pgcrypto;
RESET client_min_messages;

--
-- The RFC 8785 test vectors (test/data/jcs/, read from the build directory
-- where pg_regress runs psql).  Each output must match byte for byte.
--
\set doc `cat test/data/jcs/input/arrays.json`
\set expected `cat test/data/jcs/output/arrays.json`
SELECT idem_canonical(:'doc') AS arrays,
       convert_to(idem_canonical(:'doc'), 'UTF8') = convert_to(:'expected', 'UTF8') AS same_bytes;

\set doc `cat test/data/jcs/input/french.json`
\set expected `cat test/data/jcs/output/french.json`
SELECT idem_canonical(:'doc') AS french,
       convert_to(idem_canonical(:'doc'), 'UTF8') = convert_to(:'expected', 'UTF8') AS same_bytes;

\set doc `cat test/data/jcs/input/structures.json`
\set expected `cat test/data/jcs/output/structures.json`
SELECT idem_canonical(:'doc') AS structures,
       convert_to(idem_canonical(:'doc'), 'UTF8') = convert_to(:'expected', 'UTF8') AS same_bytes;

\set doc `cat test/data/jcs/input/unicode.json`
\set expected `cat test/data/jcs/output/unicode.json`
SELECT idem_canonical(:'doc') AS unicode,
       convert_to(idem_canonical(:'doc'), 'UTF8') = convert_to(:'expected', 'UTF8') AS same_bytes;

-- weird.json: control characters, DEL, U+0080, and keys that sort
-- differently by UTF-16 code units (U+1F602 before U+FB33) than by bytes.
\set doc `cat test/data/jcs/input/weird.json`
\set expected `cat test/data/jcs/output/weird.json`
SELECT idem_canonical(:'doc') AS weird,
       convert_to(idem_canonical(:'doc'), 'UTF8') = convert_to(:'expected', 'UTF8') AS same_bytes;

-- values.json is the one documented exception.  Its input has the number
-- 333333333.33333329 (17 significant digits); RFC 8785 rounds it to the
-- nearest double, 333333333.3333333, and we keep it exact by design.
-- Everything else in the vector (1E30, 4.50, 2e-3, 1e-27, the string
-- escapes, the literals) must match.
\set doc `cat test/data/jcs/input/values.json`
\set expected `cat test/data/jcs/output/values.json`
SELECT idem_canonical(:'doc') AS "values",
       convert_to(idem_canonical(:'doc'), 'UTF8') = convert_to(:'expected', 'UTF8') AS same_bytes,
       convert_to(idem_canonical(:'doc'), 'UTF8') =
           convert_to(replace(:'expected', '333333333.3333333,', '333333333.33333329,'), 'UTF8')
           AS same_but_the_exact_number;

--
-- Scalars at the top level and the literals.
--
SELECT idem_canonical('null') AS "null", idem_canonical('true') AS "true",
       idem_canonical('false') AS "false", idem_canonical('"x"') AS string,
       idem_canonical('-12.50') AS number;

-- A string that looks like a number stays a string.
SELECT idem_canonical('["1.0", 1.0]');

-- NULL in, NULL out (STRICT).
SELECT idem_canonical(NULL) IS NULL AS canonical_null,
       idem_fingerprint(NULL) IS NULL AS fingerprint_null;

--
-- Structure: no whitespace, members sorted, arrays keep their order.
--
SELECT idem_canonical('{ "b" : [ 3, 1, 2 ] , "a" : { "y" : null, "x" : true } }');

-- Empty containers, alone and nested.
SELECT idem_canonical('{}') AS obj, idem_canonical('[]') AS arr,
       idem_canonical('{"a": {}, "b": [], "c": [{}, [], [[]], {"d": {}}]}') AS nested;

-- jsonb stores keys shortest first; canonical order is by code units, so
-- the long key "aa" comes before the short key "b".
SELECT '{"b": 1, "aa": 2, "a": 3, "": 4}'::jsonb::text AS jsonb_order,
       idem_canonical('{"b": 1, "aa": 2, "a": 3, "": 4}') AS canonical_order;

-- Nested arrays and objects, mixed.
SELECT idem_canonical('[{"z": [1, {"k": [true, false, null]}], "a": [[["deep"]]]}, [], [[1, 2], [3]]]');

-- Two requests that differ only in member order and whitespace have one
-- canonical text and one fingerprint.
SELECT idem_canonical('{"amount": 100, "currency": "EUR", "to": {"iban": "DE89", "name": "A"}}') =
       idem_canonical('{"to":{"name":"A","iban":"DE89"},   "currency":"EUR","amount":100}') AS same_text,
       idem_fingerprint('{"amount": 100, "currency": "EUR", "to": {"iban": "DE89", "name": "A"}}') =
       idem_fingerprint('{"to":{"name":"A","iban":"DE89"},   "currency":"EUR","amount":100}') AS same_fingerprint;

--
-- Member order by UTF-16 code units.  UTF-8 byte order is code point
-- order, which puts U+E000..U+FFFF before the astral plane; UTF-16 puts
-- the astral plane (surrogates D800..DFFF) first.
--   "a" U+0061, "é" U+00E9, U+D7FF, U+10000, U+1F602, U+E000, U+FB33, U+FFFD
--
SELECT idem_canonical(jsonb_build_object(
           U&'\FFFD', 8, U&'\E000', 6, U&'\+01F602', 5, 'a', 1,
           U&'\FB33', 7, U&'\+010000', 4, U&'\D7FF', 3, U&'\00E9', 2)) AS utf16_order;

-- The same keys listed in the order above, with the value giving the rank:
-- the canonical text must list them 1..8.
SELECT string_agg(v, ',' ORDER BY ord) AS ranks_in_output_order
  FROM (SELECT m[1] AS v, ord
          FROM regexp_matches(idem_canonical(jsonb_build_object(
                   U&'\FFFD', 8, U&'\E000', 6, U&'\+01F602', 5, 'a', 1,
                   U&'\FB33', 7, U&'\+010000', 4, U&'\D7FF', 3, U&'\00E9', 2)),
               ':([0-9])', 'g') WITH ORDINALITY AS r(m, ord)) s;

-- Keys that share a prefix and differ inside a multi-byte character, and
-- a key that is a prefix of another.
SELECT idem_canonical(jsonb_build_object(
           U&'x\+01F603', 1, U&'x\+01F602', 2, U&'x\E001', 3, U&'x\E000', 4,
           'x', 5, U&'x\+01F602y', 6)) AS shared_prefixes;
-- the values, in output order: 5 (x), 2, 6, 1 (astral), 4, 3 (U+E00x)
SELECT string_agg(m[1], ',' ORDER BY ord) AS values_in_output_order
  FROM regexp_matches(idem_canonical(jsonb_build_object(
           U&'x\+01F603', 1, U&'x\+01F602', 2, U&'x\E001', 3, U&'x\E000', 4,
           'x', 5, U&'x\+01F602y', 6)), ':([0-9])', 'g') WITH ORDINALITY AS r(m, ord);

--
-- String escapes: \b \t \n \f \r \" \\ as short escapes, the other
-- control characters as \u00xx in lower-case hex, everything else as is
-- (DEL, '/', non-ASCII, U+2028 and U+2029 included).
--
SELECT idem_canonical(to_jsonb(string_agg(chr(c), '' ORDER BY c))) AS controls
  FROM generate_series(1, 31) AS c;

SELECT idem_canonical(to_jsonb(text E'quote " backslash \\ slash / del \x7f tab \t'));

SELECT idem_canonical(to_jsonb(text U&'line\2028separator\2029paragraph')) =
       U&'"line\2028separator\2029paragraph"' AS u2028_u2029_left_raw,
       encode(convert_to(idem_canonical(to_jsonb(text U&'\2028\2029')), 'UTF8'), 'hex') AS bytes;

-- Escapes in member names too.
SELECT idem_canonical(jsonb_build_object(E'\n', 1, E'\u001f', 2, '"', 3, E'\\', 4, 'é', 5));

-- jsonb's input escapes are decoded; canonical output re-escapes only
-- what RFC 8785 requires.
SELECT idem_canonical('"\u0041\u00e9\u20ac\ud83d\ude02\u000b\/"');

--
-- The fingerprint is SHA-256 of the canonical text in UTF-8, equal to the
-- built-in sha256() and to pgcrypto's digest() of that text.
--
CREATE TEMP TABLE docs (name text, doc jsonb);
INSERT INTO docs VALUES
    ('null', 'null'),
    ('number', '-1.50e3'),
    ('string', to_jsonb(text U&'\+01F602 \2028 \0001')),
    ('empty object', '{}'),
    ('empty array', '[]'),
    ('payment', '{"amount": "100.00", "currency": "EUR", "lines": [{"sku": "A-1", "qty": 2}]}'),
    ('unicode keys', jsonb_build_object(U&'\E000', 1, U&'\+01F602', 2, 'é', 3));
\set doc `cat test/data/jcs/input/weird.json`
INSERT INTO docs VALUES ('weird.json', :'doc');
\set doc `cat test/data/jcs/input/values.json`
INSERT INTO docs VALUES ('values.json', :'doc');

SELECT name,
       idem_fingerprint(doc) = sha256(convert_to(idem_canonical(doc), 'UTF8')) AS same_as_sha256,
       idem_fingerprint(doc) = digest(idem_canonical(doc), 'sha256') AS same_as_pgcrypto,
       octet_length(idem_fingerprint(doc)) AS bytes
  FROM docs ORDER BY name;

-- One known value, so that a change of the canonical form cannot go
-- unnoticed: SHA-256 of the 32 bytes {"a":[1,2.5,"x"],"b":{"c":null}}.
SELECT idem_canonical('{"b": {"c": null}, "a": [1, 2.50, "x"]}'),
       encode(idem_fingerprint('{"b": {"c": null}, "a": [1, 2.50, "x"]}'), 'hex');

--
-- Deep nesting.  jsonb itself refuses documents nested deeper than the
-- server's stack allows (max_stack_depth); canonicalization walks the
-- binary form with a heap stack and has no limit of its own.  Find the
-- deepest array and object jsonb accepts here and canonicalize them.
--
CREATE FUNCTION pg_temp.deepest(open text, close text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    lo int := 1;
    hi int := 1000000;
    mid int;
BEGIN
    WHILE hi - lo > 1 LOOP
        mid := (lo + hi) / 2;
        BEGIN
            PERFORM (repeat(open, mid) || '1' || repeat(close, mid))::jsonb;
            lo := mid;
        EXCEPTION WHEN statement_too_complex OR program_limit_exceeded THEN
            hi := mid;
        END;
    END LOOP;
    RETURN lo;
END;
$$;

SELECT pg_temp.deepest('[ ', ' ]') AS n \gset
SELECT :n > 1000 AS deep_enough,
       idem_canonical((repeat('[ ', :n) || '1.0' || repeat(' ]', :n))::jsonb) =
           repeat('[', :n) || '1' || repeat(']', :n) AS deepest_array_ok,
       idem_fingerprint((repeat('[ ', :n) || '1.0' || repeat(' ]', :n))::jsonb) =
           sha256(convert_to(repeat('[', :n) || '1' || repeat(']', :n), 'UTF8')) AS fingerprint_ok;

SELECT pg_temp.deepest('{"b": {}, "aa": ', '}') AS n \gset
SELECT :n > 1000 AS deep_enough,
       idem_canonical((repeat('{"b": {}, "aa": ', :n) || '1' || repeat('}', :n))::jsonb) =
           repeat('{"aa":', :n) || '1' || repeat(',"b":{}}', :n) AS deepest_object_ok,
       idem_fingerprint((repeat('{"b": {}, "aa": ', :n) || '1' || repeat('}', :n))::jsonb) =
           sha256(convert_to(repeat('{"aa":', :n) || '1' || repeat(',"b":{}}', :n), 'UTF8')) AS fingerprint_ok;

--
-- A document of more than 1 MB: 16,000 objects, checked against the
-- canonical text built independently with format().  The fingerprint is
-- hashed in pieces while walking, so it also checks the buffer flushes.
--
CREATE TEMP TABLE big AS
SELECT jsonb_agg(jsonb_build_object(
           'id', i,
           'name', 'item ' || i || U&' \00E9\+01F602',
           'amount', i * 1.25,
           'tags', jsonb_build_array('a', E'b\n', i % 7 = 0),
           U&'\E000', NULL,
           U&'\+01F602', i::text) ORDER BY i) AS doc
  FROM generate_series(1, 16000) AS i;

CREATE TEMP TABLE big_expected AS
SELECT '[' || string_agg(format(
           U&'{"amount":%s,"id":%s,"name":"item %s \00E9\+01F602","tags":["a","b\\n",%s],"\+01F602":"%s","\E000":null}',
           rtrim(rtrim((i * 1.25)::text, '0'), '.'), i, i, (i % 7 = 0)::text, i),
           ',' ORDER BY i) || ']' AS text
  FROM generate_series(1, 16000) AS i;

SELECT octet_length(convert_to(e.text, 'UTF8')) > 1024 * 1024 AS over_1mb,
       idem_canonical(b.doc) = e.text AS canonical_ok,
       idem_fingerprint(b.doc) = sha256(convert_to(e.text, 'UTF8')) AS fingerprint_ok,
       idem_fingerprint(b.doc) = digest(e.text, 'sha256') AS pgcrypto_ok
  FROM big b, big_expected e;

-- One long string, longer than the hash buffer, on its own and among
-- short values.
SELECT idem_fingerprint(to_jsonb(repeat('x', 100000))) =
           sha256(convert_to('"' || repeat('x', 100000) || '"', 'UTF8')) AS long_string_ok,
       idem_fingerprint(jsonb_build_array(1, repeat(E'\n', 50000), 2)) =
           sha256(convert_to('[1,"' || repeat('\n', 50000) || '",2]', 'UTF8')) AS long_escapes_ok;

-- Texts that fit in the first buffer are hashed in one call, longer ones
-- streamed: both agree with sha256() at every length around the 64-byte
-- block boundaries (55/56 bytes: one or two padding blocks) and around the
-- 8192-byte buffer.
SELECT count(*) AS lengths,
       count(*) FILTER (WHERE idem_fingerprint(to_jsonb(s)) =
                              sha256(convert_to('"' || s || '"', 'UTF8'))) AS agree
  FROM (SELECT repeat('a', n) AS s
          FROM generate_series(0, 300) n
        UNION ALL
        SELECT repeat('b', n) FROM generate_series(8150, 8250) n) t;
-- ... and for documents of mixed content and every size up to a few KB.
SELECT count(*) AS documents,
       count(*) FILTER (WHERE idem_fingerprint(d) =
                              sha256(convert_to(idem_canonical(d), 'UTF8'))) AS agree
  FROM (SELECT jsonb_build_object('k' || n, left(repeat(md5(n::text) || U&'\00e9\+01F602', 1 + n / 20), n),
                                  'n', n * 1.5, 'a', jsonb_build_array(n, md5(n::text))) AS d
          FROM generate_series(0, 3000) n) t;

-- Canonicalization is idempotent: the canonical text parses back to the
-- same canonical text.
SELECT idem_canonical(idem_canonical(doc)::jsonb) = idem_canonical(doc) AS idempotent
  FROM big;

DROP TABLE docs, big, big_expected;
DROP EXTENSION pgcrypto;
