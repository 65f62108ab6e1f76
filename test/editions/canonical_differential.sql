--
-- Differential check of the canonical form: the SQL edition's
-- idem_canonical and idem_fingerprint (schema sqled) against the C
-- edition's (schema c), in one database, on edge documents, on numbers of
-- every magnitude and length, and on random documents.  Both must give the
-- same bytes for every document.  idem_derive_key too, with its errors.  Run by canonical_differential.sh, with
-- psql variables count (random documents) and seed.
--
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
-- the SQL edition's helpers, called below to count the ways it took, run
-- under their caller's search_path, as under the edition's own functions
SET search_path = public, sqled;
SELECT setseed(:seed);

CREATE TEMP TABLE docs (id bigint GENERATED ALWAYS AS IDENTITY, kind text, doc jsonb);

--
-- Edge documents, written by hand.
--
INSERT INTO docs (kind, doc)
SELECT 'edge', d::jsonb FROM (VALUES
    ('null'), ('true'), ('false'), ('0'), ('-0'), ('-0.0'), ('0e10'), ('1.0'), ('100.00'),
    ('1e21'), ('-1e21'), ('1e-7'), ('1e-6'), ('0.000001'), ('0.0000001'), ('999999999999999999999'),
    ('999999999999999999999.5'), ('1000000000000000000000.5'), ('0.0000010'), ('0.0000000'),
    ('"x"'), ('""'), ('{}'), ('[]'), ('[{}]'), ('[[]]'), ('{"": {}}'), ('{"": []}'), ('[[], {}, [[]], {"": {}}]'),
    ('{"b": [3, 1, 2], "a": {"y": null, "x": true}}'),
    ('{"b": 1, "aa": 2, "a": 3, "": 4}'),
    ('{"\uE000": 1, "\ud83d\ude02": 2, "\uFB33": 3, "\uFFFD": 4, "\uD7FF": 5, "\ud800\udc00": 6, "a": 7, "é": 8}'),
    ('{"x\ud83d\ude03": 1, "x\ud83d\ude02": 2, "x\ue001": 3, "x\ue000": 4, "x": 5, "x\ud83d\ude02y": 6}'),
    ('{"\ue000\ue001": 1, "\ue001": 2, "\ue000": 3, "\udbff\udfff": 4, "\ue000\ud83d\ude02": 5}'),
    ('"tab\t nl\n \u0001 \u001f \u007f \u2028 \u2029 é \/ \" \\"'),
    ('{"\n": 1, "\u001f": 2, "\"": 3, "\\": 4, "é": 5, "a\"b": 6, "a\\b": 7, "a b": 8}'),
    ('{"a": "b\", \"c\": \"d", "a\", \"b": 1}'),
    ('{"k": "x, \"y\": 1", "k2": "{\n}", "k3": "[\n    1\n]"}'),
    ('{"a": "x\n    }", "b": {"c": "y,\n    \"d"}}'),
    ('["a, b", "c,\n    d", 1.50, "2.50"]'),
    ('{"k": ": x", ": ": [": ", ":"], "a ": 1, "b": {": a": ": ", "c": 10.0}}'),
    ('{"k": "x\": ", "x": [1, "\": "], "z": {"y": 0.10}}'),
    ('{"amount": 100.00, "currency": "EUR", "to": {"name": "Zoë", "iban": "DE89"}}'),
    ('{"a": 1, "a": 2, "b": {"c": 1, "c": [1, 2], "c ": 3}}'),
    ('[100.00, 1E2, -0.0, 2.50, 1e21, 1e-7, 0.000001, 5e-324, 1e1000, -1e-1000, 123e20]'),
    ('{"n": [1.0, 10, 10.0, 100, 100.10, -0.50, 0.0, 1e2, 1.5e1, 1e-5, 12345678901234567890.10]}'),
    ('{"z": [1.50, 2.0, 10, 0.10], "a": {"k": 1.500, "j": 100, "a b": 0.0, "a": -0.50}, "a!": "x{", "b": "[", "c": {"x": "}"}}'),
    ('{"k": 10.0, "l": [10.0], "m": {"n": 10.0, "o": 10}, "p": 0.10, "q": [0.10, 1]}'),
    ('{"x": {"a": 1}, "y": {"b": [2]}}'), ('{"x": {"a": 1}, "y": {}}'), ('{"a": [], "b": [1, 2.50], "c": {}}'),
    ('{"lines": [{"a": 1}], "b": 2}'), ('{"a{": {"b[": "{", "b": "]"}, "a[": ["{", "[", "}"], "a": "x,\n    \"y"}'),
    ('{"k": {"": "", " ": " ", "!": "!"}, "": [""], " ": 1, "!": 2}'),
    ('{"lines": [{"b": 1, "a": 2.50}, {"d": null, "c": 10.0, "c ": "}"}], "k": [{"x": 1}, 2], "e": [{}]}'),
    ('{"l": [{"b": 1}, {"z": "x", "y": [1]}], "m": [{"a": 1}, {}], "n": [{"a": {"b": 1}}]}'),
    ('{"l": [{"b": 1.0, "a": 1}], "m": [{"a": 1}, {"a": 2}, [3]], "n": [{"a": 1}, "{"]}')
) AS t(d);

-- Deep nesting: below, at and beyond the depth where the recursion hands
-- over to the explicit stack.
INSERT INTO docs (kind, doc)
SELECT 'deep', (repeat(open, n) || core || repeat(close, n))::jsonb
  FROM (VALUES ('[', ']', '1.50'), ('{"b": {}, "aa": ', '}', '"x"'),
               ('[{"z": 1.0, "a": ', '}]', '{}'), ('{"a\n": [', ']}', '1e21'))
       AS s(open, close, core),
       (VALUES (1), (2), (30), (31), (32), (33), (34), (64), (300), (2000)) AS d(n);

--
-- Numbers: 1 to 40 significant digits, at every decimal exponent from
-- -300 to 300 (and beyond), both signs, with trailing zeros.
--
-- k random digits, the first not zero
CREATE FUNCTION pg_temp.digits(k int) RETURNS text LANGUAGE sql AS $$
    SELECT (1 + floor(random() * 9))::int::text
           || coalesce((SELECT string_agg(floor(random() * 10)::int::text, '')
                          FROM generate_series(2, k)), '')
$$;

CREATE TEMP TABLE numbers AS
SELECT CASE WHEN random() < 0.5 THEN '-' ELSE '' END
       || rtrim(left(ds, 1) || '.' || substr(ds, 2) || repeat('0', (random() * 3)::int), '.')
       || 'e' || e AS num
  FROM generate_series(-310, 310) AS e,
       LATERAL (SELECT pg_temp.digits(k) AS ds
                  FROM generate_series(1, 40) AS k
                 WHERE random() < 0.25 + 0 * e) AS d;
INSERT INTO numbers
SELECT CASE WHEN random() < 0.5 THEN '-' ELSE '' END || pg_temp.digits(k)
       || CASE WHEN random() < 0.5 THEN '.' || repeat('0', 1 + (random() * 3)::int) ELSE '' END
  FROM generate_series(1, 40) AS k, generate_series(1, 20) AS r;
INSERT INTO numbers
SELECT CASE WHEN random() < 0.5 THEN '-' ELSE '' END || '0.' || repeat('0', z) || pg_temp.digits(k)
       || repeat('0', (random() * 2)::int)
  FROM generate_series(0, 12) AS z, generate_series(1, 20) AS k;

ALTER TABLE numbers ADD COLUMN id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
SELECT set_config('differential.numbers', count(*)::text, false) AS numbers FROM numbers \gset
-- the numbers written without an exponent, for the plain documents
CREATE TEMP TABLE plain_numbers AS
SELECT row_number() OVER () AS id, num FROM numbers
 WHERE abs(num::numeric) < 1e21 AND (abs(num::numeric) >= 0.000001 OR num::numeric = 0);
ALTER TABLE plain_numbers ADD PRIMARY KEY (id);
SELECT set_config('differential.plain_numbers', count(*)::text, false) FROM plain_numbers;

INSERT INTO docs (kind, doc) SELECT 'number', num::jsonb FROM numbers;
-- numbers inside the plain documents' text as well, several per object
INSERT INTO docs (kind, doc)
SELECT 'numbers', jsonb_object_agg('k' || (n % 7) || n, num::jsonb)
  FROM (SELECT num, row_number() OVER () AS n FROM numbers) s
 GROUP BY n / 7;
INSERT INTO docs (kind, doc)
SELECT 'numbers', jsonb_agg(num::jsonb)
  FROM (SELECT num, row_number() OVER () AS n FROM numbers) s
 GROUP BY n / 11;

--
-- Random documents.  Names and strings come from alphabets that the
-- plain path takes (ASCII, Latin, Greek, CJK: below U+E000, no escape)
-- and from ones it leaves to the other (astral plane, U+E000..U+FFFF,
-- quotes, backslashes, control characters, U+2028), so both paths and
-- the way between them are compared.
--
CREATE FUNCTION pg_temp.rchar(plain boolean) RETURNS text LANGUAGE sql AS $$
    SELECT CASE WHEN plain THEN
        CASE (random() * 5)::int
            WHEN 0 THEN translate(chr(32 + (random() * 94)::int), '"\', '''/')
            WHEN 1 THEN chr(97 + (random() * 25)::int)
            WHEN 2 THEN chr(160 + (random() * 400)::int)
            WHEN 3 THEN chr(913 + (random() * 50)::int)
            WHEN 4 THEN chr(19968 + (random() * 2000)::int)
            ELSE (ARRAY[',', ': ', ', ', ' '])[1 + (random() * 3)::int] END
    ELSE
        CASE (random() * 9)::int
            WHEN 0 THEN chr(1 + (random() * 31)::int)
            WHEN 1 THEN (ARRAY['"', '\', '/', chr(127), chr(8232), chr(8233), ': ', ', "'])[1 + (random() * 7)::int]
            WHEN 2 THEN chr(57344 + (random() * 8191)::int)
            WHEN 3 THEN chr(65536 + (random() * 1048575)::int)
            WHEN 4 THEN chr(127744 + (random() * 1000)::int)
            WHEN 5 THEN chr(55000 + (random() * 295)::int)
            ELSE chr(97 + (random() * 3)::int) END
    END
$$;

CREATE FUNCTION pg_temp.rstring(plain boolean, maxlen int) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(pg_temp.rchar(plain), ''), '')
      FROM generate_series(1, (random() * maxlen)::int)
$$;

CREATE FUNCTION pg_temp.rdoc(depth int, plain boolean) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r float8 := random();
    result jsonb;
    n int;
    prefix text;
BEGIN
    IF depth <= 0 OR r < 0.45 THEN
        r := random();
        IF r >= 0.3 AND r < 0.7 THEN
            -- most numbers of plain documents need no exponent
            IF plain AND random() < 0.9 THEN
                n := 1 + (random() * (current_setting('differential.plain_numbers')::int - 1))::int;
                RETURN (SELECT num::jsonb FROM plain_numbers WHERE id = n);
            END IF;
            n := 1 + (random() * (current_setting('differential.numbers')::int - 1))::int;
            RETURN (SELECT num::jsonb FROM numbers WHERE id = n);
        END IF;
        RETURN CASE
            WHEN r < 0.3 THEN to_jsonb(pg_temp.rstring(plain, 12))
            WHEN r < 0.8 THEN to_jsonb((random() * 100000)::int)
            WHEN r < 0.87 THEN 'true'
            WHEN r < 0.93 THEN 'false'
            ELSE 'null' END;
    END IF;
    n := (random() * 8)::int;
    IF r < 0.75 THEN
        -- names that share prefixes, and differ in length
        prefix := pg_temp.rstring(plain, 3);
        SELECT coalesce(jsonb_object_agg(
                   CASE WHEN random() < 0.4 THEN prefix ELSE '' END || pg_temp.rstring(plain, 6),
                   pg_temp.rdoc(depth - 1, plain)), '{}')
          INTO result FROM generate_series(1, n);
    ELSE
        SELECT coalesce(jsonb_agg(pg_temp.rdoc(depth - 1, plain)), '[]')
          INTO result FROM generate_series(1, n);
    END IF;
    RETURN result;
END;
$$;

INSERT INTO docs (kind, doc)
SELECT CASE WHEN i % 3 = 0 THEN 'random' ELSE 'random plain' END,
       pg_temp.rdoc(CASE WHEN i % 3 = 0 THEN 1 + (random() * 5)::int ELSE 1 + (random() * 3)::int END,
                    i % 3 <> 0)
  FROM generate_series(1, :count) AS i;

-- Request-like documents of a few hundred bytes up to several KB.
INSERT INTO docs (kind, doc)
SELECT 'request', jsonb_build_object(
           'amount', (SELECT num::jsonb FROM plain_numbers WHERE id = 1 + i % 1000),
           'currency', 'EUR', 'capture', i % 2 = 0, 'reference', 'ref-' || i,
           'description', pg_temp.rstring(i % 4 <> 0, 40),
           'metadata', jsonb_build_object('order', i, 'channel', 'web', 'note', NULL),
           'items', (SELECT jsonb_agg(jsonb_build_object('sku', 'SKU-' || j, 'qty', j,
                                                         'price', round((random() * 1000)::numeric, 2))
                                      || CASE WHEN i % 3 = 0 THEN '{}'
                                              ELSE jsonb_build_object('tags', jsonb_build_array('a', j % 3)) END)
                       FROM generate_series(1, i % 12 + (i % 10) / 9 * 40) AS j))
  FROM generate_series(1, 300) AS i;

--
-- The comparison.
--
CREATE TEMP TABLE results AS
SELECT id, kind, doc,
       c.idem_canonical(doc) AS c_text, sqled.idem_canonical(doc) AS sql_text,
       c.idem_fingerprint(doc) AS c_fp, sqled.idem_fingerprint(doc) AS sql_fp
  FROM docs;

-- plain: written by the SQL edition's string path (idem__plain), the
-- others from the jsonb; both must be well represented.
SELECT kind, count(*) AS documents,
       count(*) FILTER (WHERE jsonb_typeof(doc) IN ('object', 'array')
                          AND sqled.idem__plain(doc) IS NOT NULL) AS plain,
       count(*) FILTER (WHERE c_text IS DISTINCT FROM sql_text
                           OR convert_to(c_text, 'UTF8') IS DISTINCT FROM convert_to(sql_text, 'UTF8'))
           AS text_mismatches,
       count(*) FILTER (WHERE c_fp IS DISTINCT FROM sql_fp) AS fingerprint_mismatches
  FROM results GROUP BY kind ORDER BY kind;

--
-- idem_derive_key: the same key for random keys and steps, and the same
-- SQLSTATE, message, detail and hint for every refused argument.
--
CREATE FUNCTION pg_temp.outcome(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    state text;
    message text;
    detail text;
    hint text;
BEGIN
    EXECUTE stmt INTO message;
    RETURN message;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN concat_ws(' | ', state, message, detail, hint);
END;
$$;

CREATE TEMP TABLE derive AS
SELECT format('SELECT @schema@.idem_derive_key(%L, %L)', k, st) AS stmt
  FROM (SELECT CASE WHEN i % 5 = 0 THEN pg_temp.rstring(i % 2 = 0, 30)
                    ELSE left(md5(i::text) || ' -_.:/~', 1 + i % 40) END AS k,
               CASE WHEN i % 7 = 0 THEN pg_temp.rstring(false, 20)
                    ELSE 'step ' || pg_temp.rstring(true, 20) END AS st
          FROM generate_series(1, 500) AS i) AS r
UNION ALL
SELECT format('SELECT @schema@.idem_derive_key(%s, %s)', k, st)
  FROM (VALUES ('NULL', $$'step'$$), ($$'k'$$, 'NULL'), ('NULL', 'NULL'), ($$''$$, $$''$$),
               ($$'k'$$, $$''$$), ($$repeat('k', 255)$$, $$repeat('s', 255)$$),
               ($$repeat('k', 256)$$, $$'s'$$), ($$'k'$$, $$repeat('é', 128)$$),
               ($$E'k\n'$$, $$'s'$$), ($$'kéy'$$, $$'s'$$), ($$E'k\x7f'$$, $$'s'$$),
               ($$'k'$$, $$E'é\x7f'$$), ($$'k'$$, $$E'ab\x01'$$), ($$'ab'$$, $$'c'$$), ($$'a'$$, $$'bc'$$))
       AS t(k, st);

CREATE TEMP TABLE derive_results AS
SELECT stmt, pg_temp.outcome(replace(stmt, '@schema@', 'c')) AS c_outcome,
       pg_temp.outcome(replace(stmt, '@schema@', 'sqled')) AS sql_outcome
  FROM derive;
SELECT count(*) AS derive_calls,
       count(*) FILTER (WHERE c_outcome LIKE '22%') AS refused,
       count(*) FILTER (WHERE c_outcome IS DISTINCT FROM sql_outcome) AS derive_mismatches
  FROM derive_results;
SELECT stmt, c_outcome, sql_outcome FROM derive_results
 WHERE c_outcome IS DISTINCT FROM sql_outcome LIMIT 5;

SELECT count(*) FILTER (WHERE jsonb_typeof(doc) IN ('object', 'array')
                          AND sqled.idem__plain(doc) IS NOT NULL) AS plain,
       count(*) FILTER (WHERE jsonb_typeof(doc) IN ('object', 'array')
                          AND sqled.idem__plain(doc) IS NULL) AS general
  FROM results \gset
\echo containers written by the string path :plain, from the jsonb :general

-- the objects the SQL edition writes in one call: plain, whose members'
-- containers hold no container and are not empty (or are arrays of
-- objects that hold none, counted next)
SELECT count(*) AS one_call
  FROM results
 WHERE jsonb_typeof(doc) = 'object' AND doc <> '{}' AND sqled.idem__plain_pretty(doc) IS NOT NULL
   AND NOT EXISTS (SELECT FROM jsonb_each(doc) AS m
                    WHERE m.value IN ('{}', '[]')
                       OR CASE jsonb_typeof(m.value)
                              WHEN 'object' THEN EXISTS (SELECT FROM jsonb_each(m.value) AS n
                                                          WHERE jsonb_typeof(n.value) IN ('object', 'array'))
                              WHEN 'array' THEN EXISTS (SELECT FROM jsonb_array_elements(m.value) AS e
                                                         WHERE jsonb_typeof(e) IN ('object', 'array'))
                              ELSE false END)
\gset
\echo objects written in one call :one_call

-- among them or not, the plain objects with a member that is an array of
-- objects that hold no container (written in one call when the rest is)
SELECT count(*) AS object_arrays
  FROM results
 WHERE jsonb_typeof(doc) = 'object' AND sqled.idem__plain_pretty(doc) IS NOT NULL
   AND EXISTS (SELECT FROM jsonb_each(doc) AS m
                WHERE jsonb_typeof(m.value) = 'array' AND m.value <> '[]'
                  AND NOT EXISTS (SELECT FROM jsonb_array_elements(m.value) AS e
                                   WHERE jsonb_typeof(e) <> 'object' OR e = '{}'
                                      OR EXISTS (SELECT FROM jsonb_each(e) AS n
                                                  WHERE jsonb_typeof(n.value) IN ('object', 'array'))))
\gset
\echo plain objects with an array of objects of scalars :object_arrays

SELECT count(*) AS documents,
       sum(octet_length(convert_to(c_text, 'UTF8'))) AS canonical_bytes,
       count(*) FILTER (WHERE c_text IS DISTINCT FROM sql_text OR c_fp IS DISTINCT FROM sql_fp)
       + (SELECT count(*) FROM derive_results WHERE c_outcome IS DISTINCT FROM sql_outcome)
           AS mismatches
  FROM results \gset
\echo documents :documents canonical_bytes :canonical_bytes mismatches :mismatches

-- The first mismatches, if any, to look at.
SELECT id, kind, left(doc::text, 200) AS doc, left(c_text, 200) AS c_text, left(sql_text, 200) AS sql_text
  FROM results
 WHERE c_text IS DISTINCT FROM sql_text OR c_fp IS DISTINCT FROM sql_fp
 ORDER BY id LIMIT 5;
