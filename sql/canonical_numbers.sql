--
-- Numbers in the canonical form: the exact decimal value of the jsonb
-- numeric, written the way ECMAScript's Number::toString writes a number.
-- With the value as s * 10^(n-k), s of k digits without trailing zeros:
--   k <= n <= 21    digits then n-k zeros        (integers below 1e21)
--   0 < n <= 21     digits with a point inside   (12.5)
--   -6 < n <= 0     "0.", -n zeros, digits       (down to 0.000001)
--   otherwise       d.ddde+-(n-1)                (1e+21, 1e-7)
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
RESET client_min_messages;

-- Every formatting branch, with its edges.
SELECT input, idem_canonical(input::jsonb) AS canonical
  FROM (VALUES
    -- zero, whatever its sign, scale or exponent
    ('0'), ('-0'), ('0.000'), ('-0.0'), ('0e10'), ('-0E-10'),
    -- integers, written in full below 1e21
    ('1'), ('-1'), ('100'), ('1e2'), ('1.00e2'), ('100.000'),
    ('9007199254740993'),
    ('100000000000000000000'), ('1e20'),
    ('999999999999999999999'),
    -- from 1e21 on, exponent form
    ('1e21'), ('1000000000000000000000'), ('-1e21'), ('123e20'),
    ('1000000000000000000001'), ('1e100'), ('1.5E+300'), ('1e1000'),
    -- a point inside the digits
    ('1.0'), ('1.50'), ('-12.340'), ('0.5'), ('10e-1'),
    ('123456789012345678901.5'), ('99999999999999999999.9'),
    -- small fractions: 0.000001 is the last in plain form
    ('0.1'), ('0.001'), ('0.000001'), ('1e-6'), ('0.00000123'),
    ('0.0000001'), ('1e-7'), ('0.000000123'), ('-1.5e-7'),
    ('0.000000000000000000000000001'), ('5e-324'), ('-1e-1000')
  ) AS t(input);

-- 16 to 40 significant digits are kept exactly, never rounded to a double.
SELECT input, idem_canonical(input::jsonb) AS canonical,
       length(ltrim(rtrim(regexp_replace(input, '^-|\.|e.*$', '', 'g'), '0'), '0'))
           AS significant_digits
  FROM (VALUES
    ('9007199254740993'),
    ('0.10000000000000001'),
    ('333333333.33333329'),
    ('123456789012345678'),
    ('1234567890.123456789012'),
    ('0.1000000000000000055511151231257827'),
    ('3.141592653589793238462643383279502884197'),
    ('-2718281828459045235360287471352662497.757'),
    ('12345678901234567890123456789012345678.9')
  ) AS t(input);

-- Different amounts never share a canonical text or a fingerprint, even
-- where they share the nearest double.  Equal amounts always do.
SELECT a, b,
       idem_canonical(a::jsonb) = idem_canonical(b::jsonb) AS same_text,
       idem_fingerprint(a::jsonb) = idem_fingerprint(b::jsonb) AS same_fingerprint,
       a::float8 = b::float8 AS same_double
  FROM (VALUES
    ('0.1', '0.10000000000000000001'),
    ('9007199254740992', '9007199254740993'),
    ('333333333.3333333', '333333333.33333329'),
    ('1e21', '1000000000000000000001'),
    ('100', '100.000'),
    ('100', '1e2'),
    ('-0', '0'),
    ('0.000001', '1e-6')
  ) AS t(a, b);
SELECT idem_fingerprint('{"amount": 12.50, "currency": "EUR"}') =
       idem_fingerprint('{"currency": "EUR", "amount": 12.5}') AS same_request,
       idem_fingerprint('{"amount": 12.50, "currency": "EUR"}') =
       idem_fingerprint('{"amount": 12.500000000000000001, "currency": "EUR"}') AS different_request;

--
-- The number files of the RFC 8785 test vectors.  Every expected text is
-- already in ECMAScript form, so given as a JSON number it must come back
-- unchanged, digit for digit (16 and 17 digit ones included).
--
CREATE TEMP TABLE es6_numbers (ieee_hex text, expected text);
\copy es6_numbers FROM 'test/data/jcs/numbers/es6testfile-first10000.txt' WITH (FORMAT csv)
SELECT count(*) AS numbers,
       count(*) FILTER (WHERE idem_canonical(expected::jsonb) <> expected) AS mismatches,
       count(*) FILTER (WHERE length(ltrim(rtrim(
           regexp_replace(expected, '^-|\.|e.*$', '', 'g'), '0'), '0')) >= 16)
           AS with_16_or_17_significant_digits
  FROM es6_numbers;

CREATE TEMP TABLE appendix_b (ieee_hex text, expected text, comment text);
\copy appendix_b FROM 'test/data/jcs/numbers/rfc8785-appendix-b.csv' WITH (FORMAT csv, HEADER)
SELECT expected, idem_canonical(expected::jsonb) = expected AS unchanged, comment
  FROM appendix_b WHERE expected IS NOT NULL;

-- Appendix B's NaN and Infinity have no JSON text: jsonb cannot hold them,
-- and to_jsonb turns them into strings.
SELECT comment FROM appendix_b WHERE expected IS NULL;
SELECT 'NaN'::jsonb;
SELECT idem_canonical(to_jsonb('NaN'::numeric)) AS nan,
       idem_canonical(to_jsonb('-Infinity'::float8)) AS minus_infinity;

DROP TABLE es6_numbers, appendix_b;
