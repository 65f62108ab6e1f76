--
-- Canonical JSON and the request fingerprint (docs/fingerprint.md), and
-- idem_derive_key: the C edition's src/canonical.c and src/derive.c in SQL
-- and PL/pgSQL, giving the same bytes for every jsonb.
--
-- The canonical text is assembled from what jsonb already prints right:
-- a string scalar's text output (to_json of a text, or a jsonb string
-- cast to text) escapes exactly what RFC 8785 escapes, in the same way
-- (\" \\ \b \f \n \r \t, \u00xx in lower-case hex, nothing else), and
-- true, false and null print as themselves.  What has to be rebuilt is
-- the rest: whitespace, member order and numbers.
--
-- The fingerprint runs on every claim, and a query run from PL/pgSQL
-- costs more to start and end than a request costs to write.  So the
-- common document (idem__plain: no escape, no character from U+E000 on,
-- under 2 KB of jsonb_pretty text) is written from its jsonb_pretty text
-- by string functions in statements that are simple expressions, with one
-- call per container that holds containers and no query at all.  Any
-- other document is written from the jsonb: a query per object, which
-- sorts its names mapped to UTF-16 order, arrays element by element;
-- below idem__max_recursion levels the walk goes on with an explicit
-- stack, so that the deepest document jsonb accepts never overflows the
-- server's stack.
--
-- The small LANGUAGE sql helpers below are written to be inlined into the
-- statements that call them (one SELECT of an expression, not STRICT since
-- their CASE is not, no more volatile than their body, no SET clause): a
-- search_path pinned on them would stop the inlining and cost a function
-- call, and a plan, each time.  They call only pg_catalog functions.
--

-- Nesting handled by recursion before the explicit stack takes over: far
-- deeper than requests are, far shallower than the server's stack allows.
CREATE OR REPLACE FUNCTION idem__max_recursion() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 32 $$;

-- A member name as a key that sorts, byte for byte (COLLATE "C"), in the
-- order of its UTF-16 code units.  Code point order (which "C" gives) is
-- UTF-16 order except between characters outside the BMP (surrogates
-- D800-DFFF in UTF-16) and characters U+E000-U+FFFF, which UTF-16 puts
-- after them: each of the latter gets the prefix U+E001 and each astral
-- character U+E000, which keeps every other order.  Only names with a
-- character beyond ASCII need it.
CREATE OR REPLACE FUNCTION idem__utf16_key(name text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN octet_length(name) = length(name) THEN name
            ELSE regexp_replace(regexp_replace(name,
                     E'([\\uE000-\\uFFFF])', chr(57345) || E'\\1', 'g'),
                     E'([\\U00010000-\\U0010FFFF])', chr(57344) || E'\\1', 'g')
       END
$$;

-- A number whose plain text (numeric_out: no exponent, the scale's
-- trailing zeros) is not already in ECMAScript form: zero of any scale,
-- trailing zeros after the point, integers of 22 digits or more, values
-- below 1e-6.  With the value written as s * 10^(n-k), s of k digits
-- without trailing zeros: k <= n <= 21 digits then zeros; 0 < n <= 21 a
-- point inside; -6 < n <= 0 "0." then zeros; otherwise d.ddde+-(n-1).
CREATE OR REPLACE FUNCTION idem__number_rewrite(plain text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    negative boolean := left(plain, 1) = '-';
    unsigned text := ltrim(plain, '-');
    point integer := strpos(unsigned, '.');
    whole text;
    fraction text;
    digits text;
    zeros integer;
BEGIN
    IF plain IN ('NaN', 'Infinity', '-Infinity') THEN
        RAISE EXCEPTION 'cannot canonicalize a jsonb number that is NaN or infinite'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'JSON has no NaN or infinite numbers.';
    END IF;
    IF point = 0 THEN
        whole := unsigned;
        fraction := '';
    ELSE
        whole := left(unsigned, point - 1);
        fraction := rtrim(substr(unsigned, point + 1), '0');
    END IF;

    IF whole <> '0' THEN
        -- n is the length of the whole part, which has no leading zero
        IF length(whole) <= 21 THEN
            RETURN CASE WHEN negative THEN '-' ELSE '' END || whole
                   || CASE WHEN fraction = '' THEN '' ELSE '.' || fraction END;
        END IF;
        digits := rtrim(whole || fraction, '0');
        RETURN CASE WHEN negative THEN '-' ELSE '' END || left(digits, 1)
               || CASE WHEN length(digits) > 1 THEN '.' || substr(digits, 2) ELSE '' END
               || 'e+' || (length(whole) - 1)::text;
    END IF;

    IF fraction = '' THEN
        RETURN '0';             -- zero, whatever its sign or scale
    END IF;
    digits := ltrim(fraction, '0');
    zeros := length(fraction) - length(digits);     -- n = -zeros
    IF zeros < 6 THEN
        RETURN CASE WHEN negative THEN '-' ELSE '' END || '0.' || fraction;
    END IF;
    RETURN CASE WHEN negative THEN '-' ELSE '' END || left(digits, 1)
           || CASE WHEN length(digits) > 1 THEN '.' || substr(digits, 2) ELSE '' END
           || 'e-' || (zeros + 1)::text;
END;
$$;

-- The canonical text of a number, from its plain text.  Most numbers of
-- requests are already in ECMAScript form (integers below 1e21, decimals
-- without trailing zeros): they are recognised here without a call.
CREATE OR REPLACE FUNCTION idem__number(plain text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE
    WHEN strpos(plain, '.') = 0 THEN
        CASE WHEN length(plain) <= 21 THEN plain ELSE idem__number_rewrite(plain) END
    WHEN strpos(plain, '.') <= 22 AND right(plain, 1) <> '0'
         AND plain NOT LIKE '0.000000%' AND plain NOT LIKE '-0.000000%' THEN plain
    ELSE idem__number_rewrite(plain)
END
$$;

-- The canonical text of a container depth levels down, for any document:
-- a small nested container by the string path when it is plain by itself
-- (idem__plain), else an object's members sorted by a query and an array
-- written element by element.
CREATE OR REPLACE FUNCTION idem__container(doc jsonb, depth integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    parts text[] := '{}';
    plain bytea;
    i integer;
BEGIN
    IF depth >= idem__max_recursion() THEN
        RETURN idem__container_deep(doc);
    END IF;
    -- a small container of a large document may be plain
    IF depth > 0 AND pg_column_size(doc) <= 1000 THEN
        plain := idem__plain(doc);
        IF plain IS NOT NULL THEN
            RETURN convert_from(plain, getdatabaseencoding());
        END IF;
    END IF;
    IF jsonb_typeof(doc) = 'object' THEN
        RETURN idem__object_by_query(doc, depth);
    END IF;
    -- a long array in one query, which reads a stored value once, where
    -- doc -> i would read it whole for each element
    IF jsonb_array_length(doc) > 8 THEN
        RETURN '[' || (SELECT string_agg(idem__value(e.value, depth + 1), ',' ORDER BY e.n)
                         FROM jsonb_array_elements(doc) WITH ORDINALITY AS e(value, n)) || ']';
    END IF;
    FOR i IN 0 .. jsonb_array_length(doc) - 1 LOOP
        parts := parts || idem__value(doc -> i, depth + 1);
    END LOOP;
    RETURN '[' || array_to_string(parts, ',') || ']';
END;
$$;

-- The canonical text, in the database encoding, of a container of depth
-- depth (bracket: the byte of its opening bracket) whose members or
-- elements are written in body as idem__pretty leaves them: one a line,
-- containers already replaced by their canonical text (idem__pretty).
-- STABLE as getdatabaseencoding is, so that it is inlined.
CREATE OR REPLACE FUNCTION idem__pretty_join(body bytea, depth integer, bracket integer) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT convert_to(CASE
    WHEN bracket = 91 THEN
        '[' || replace(convert_from(body, getdatabaseencoding()), E',\n' || repeat(' ', 4 * depth + 4), ',') || ']'
    WHEN length(body) = 0 THEN '{}'
    ELSE '{"' || replace(array_to_string(tsvector_to_array(array_to_tsvector(
                     string_to_array(convert_from(substring(body FROM 2), getdatabaseencoding()),
                                     E',\n' || repeat(' ', 4 * depth + 4) || '"'))), ',"'),
                         chr(1), '":') || '}'
END, getdatabaseencoding())
$$;

-- The canonical text of a container of a plain document (idem__plain),
-- in the database encoding, from the container's text as jsonb_pretty
-- writes it, in which "": "" has become U+0001 and numbers have lost the
-- trailing zeros of their fraction; depth is the container's depth in the
-- document, which gives its indentation.
--
-- In such a text a line is a container's bracket or one member or element
-- (strings hold no line break, which would be escaped), and a quote can
-- only open or close a string.  So a bracket followed by a line break
-- opens a container, the first one found opens a container of the next
-- depth, and the line of that depth's indentation and closing bracket
-- closes it: each is replaced by its canonical text, which has no line
-- break.  Then the members or elements are the pieces between a comma, a
-- line break and the indentation, and in an object a quote; each name is
-- already written as RFC 8785 writes it.  An object's pieces, name U+0001
-- value, are sorted by array_to_tsvector, which sorts strings byte by
-- byte with a shorter one first on a common prefix: code point order of
-- the names (U+0001 is below every byte of a name, and no two names are
-- equal).  The text is searched as bytes: positions in text of more than
-- one byte per character cost a walk from its start.
CREATE OR REPLACE FUNCTION idem__pretty(pretty bytea, depth integer) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    indent bytea := E'\\x0a'::bytea || decode(repeat('20', 4 * depth + 4), 'hex');
    body bytea;
    nested bytea;
    open integer;
    other integer;
    close integer;
BEGIN
    -- between the opening line's break and indentation and the closing line's
    body := substring(pretty FROM 4 * depth + 7 FOR greatest(length(pretty) - 8 * depth - 8, 0));
    LOOP
        open := position(E'\\x7b0a'::bytea IN body);                     -- {\n
        other := position(E'\\x5b0a'::bytea IN body);                    -- [\n
        IF open = 0 OR (other > 0 AND other < open) THEN
            open := other;
        END IF;
        EXIT WHEN open = 0;
        close := open + length(indent)
                 + position(indent || CASE get_byte(body, open - 1) WHEN 123 THEN E'\\x7d'::bytea ELSE E'\\x5d'::bytea END
                            IN substring(body FROM open));
        nested := substring(body FROM open FOR close - open);
        -- a container without containers is written here, without a call
        IF position(E'\\x7b0a'::bytea IN substring(nested FROM 2)) = 0
           AND position(E'\\x5b0a'::bytea IN substring(nested FROM 2)) = 0 THEN
            nested := idem__pretty_join(substring(nested FROM 4 * depth + 11
                                                  FOR greatest(length(nested) - 8 * depth - 16, 0)),
                                        depth + 1, get_byte(nested, 0));
        ELSE
            nested := idem__pretty(nested, depth + 1);
        END IF;
        body := substring(body FROM 1 FOR open - 1) || nested || substring(body FROM close);
    END LOOP;
    RETURN idem__pretty_join(body, depth, get_byte(pretty, 0));
END;
$$;

-- The canonical text of an object depth levels down, its members sorted
-- by a query on their names mapped to UTF-16 order.
CREATE OR REPLACE FUNCTION idem__object_by_query(doc jsonb, depth integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN '{' || coalesce((
        SELECT string_agg(to_json(e.key)::text || ':' || idem__value(e.value, depth + 1), ','
                          ORDER BY idem__utf16_key(e.key) COLLATE "C")
          FROM jsonb_each(doc) AS e), '') || '}';
END;
$$;

-- The canonical text of a container, walked with an explicit stack: the
-- containers open on the way down, the names of each open object in
-- canonical order, and the next member or element of each.
CREATE OR REPLACE FUNCTION idem__container_deep(doc jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    parts text[] := '{}';
    containers jsonb[] := '{}';
    names jsonb[] := '{}';
    next_member integer[] := '{}';
    sizes integer[] := '{}';
    top integer := 0;
    child jsonb := doc;         -- the container to open next
    name text;
    i integer;
BEGIN
    LOOP
        IF child IS NOT NULL THEN
            top := top + 1;
            containers[top] := child;
            next_member[top] := 0;
            IF jsonb_typeof(child) = 'object' THEN
                names[top] := (SELECT coalesce(jsonb_agg(k ORDER BY idem__utf16_key(k) COLLATE "C"), '[]')
                                 FROM jsonb_object_keys(child) AS k);
                sizes[top] := jsonb_array_length(names[top]);
                parts := parts || '{'::text;
            ELSE
                names[top] := NULL;
                sizes[top] := jsonb_array_length(child);
                parts := parts || '['::text;
            END IF;
            child := NULL;
        END IF;

        i := next_member[top];
        IF i = sizes[top] THEN
            parts := parts || CASE WHEN names[top] IS NULL THEN ']' ELSE '}' END;
            top := top - 1;
            EXIT WHEN top = 0;
            CONTINUE;
        END IF;
        next_member[top] := i + 1;
        IF i > 0 THEN
            parts := parts || ','::text;
        END IF;

        IF names[top] IS NULL THEN
            child := containers[top] -> i;
        ELSE
            name := names[top] ->> i;
            parts := parts || (to_json(name)::text || ':');
            child := containers[top] -> name;
        END IF;
        IF jsonb_typeof(child) NOT IN ('object', 'array') THEN
            parts := parts || idem__value(child, 0);
            child := NULL;
        END IF;
    END LOOP;
    RETURN array_to_string(parts, '');
END;
$$;

-- The canonical text of a value found depth levels down (created after the
-- functions it calls, since the body of a SQL function is checked).
CREATE OR REPLACE FUNCTION idem__value(member jsonb, depth integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE jsonb_typeof(member)
    WHEN 'object' THEN idem__container(member, depth)
    WHEN 'array' THEN idem__container(member, depth)
    WHEN 'number' THEN idem__number(member::text)
    ELSE member::text           -- strings, true, false, null
END
$$;

-- The text jsonb_pretty writes for a plain document, else NULL, with its
-- numbers in ECMAScript form and "": "" (the end of each name) as U+0001.
-- A plain document has no backslash in its text (so no escape: no quote,
-- backslash or control character in any name or string), no character
-- from U+E000 on (so code point order is UTF-16 order), no number that
-- needs an exponent (from 1e21 on, or below 1e-6) and is short enough for
-- every piece that is sorted to fit in a lexeme (2047 bytes).  Most
-- requests are.
CREATE OR REPLACE FUNCTION idem__plain_pretty(doc jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    pretty text;
    chunks text[];
    ending text;
    i integer;
BEGIN
    -- indentation grows with depth: a deep document's text would be huge
    IF pg_catalog.pg_column_size(doc) > 6000 THEN
        RETURN NULL;
    END IF;
    pretty := pg_catalog.jsonb_pretty(doc);
    -- "": "" is taken for the end of a name: a name or string that begins
    -- with ": " would look the same after its opening quote, which always
    -- follows a space.  A number below 1e-6 is written 0.000000...
    IF pg_catalog.octet_length(pretty) > 2000 OR pg_catalog.strpos(pretty, E'\\') > 0
       OR pg_catalog.strpos(pretty, ' ": ') > 0 OR pg_catalog.strpos(pretty, '0.000000') > 0 THEN
        RETURN NULL;
    END IF;
    -- .abs() of anything but a number is an error, which a filter takes
    -- for false: this finds the numbers from 1e21 on, either sign (a
    -- regular expression for 22 digits costs more)
    IF pg_catalog.jsonb_path_exists(doc, 'lax $.** ? (@.abs() >= 1e21)') THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.octet_length(pretty) <> pg_catalog.length(pretty)
       AND pretty ~ E'[\\uE000-\\U0010FFFF]' THEN
        RETURN NULL;
    END IF;
    -- A number ends a line, and only a number ends one with a digit: the
    -- text is cut after each number ending in 0, before its line break
    -- (and comma), which leaves the number's last 0 out.  The number is
    -- what follows the last space of a piece; when it has a point, its
    -- fraction loses its trailing zeros, and the point when nothing is
    -- left after it.
    IF pg_catalog.strpos(pretty, '.') > 0 THEN
        FOREACH ending IN ARRAY ARRAY[E'0,\n', E'0\n'] LOOP
            CONTINUE WHEN pg_catalog.strpos(pretty, ending) = 0;
            chunks := pg_catalog.string_to_array(pretty, ending);
            FOR i IN 1 .. pg_catalog.cardinality(chunks) - 1 LOOP
                IF pg_catalog.strpos(pg_catalog.split_part(chunks[i], ' ', -1), '.') > 0 THEN
                    chunks[i] := pg_catalog.rtrim(pg_catalog.rtrim(chunks[i], '0'), '.')
                                 || pg_catalog.ltrim(ending, '0');
                ELSE
                    chunks[i] := chunks[i] || ending;
                END IF;
            END LOOP;
            pretty := pg_catalog.array_to_string(chunks, '');
        END LOOP;
    END IF;
    RETURN pg_catalog.replace(pretty, '": ', pg_catalog.chr(1));
END;
$$;

-- The canonical text of a container, in the database encoding, when the
-- document is plain (idem__plain_pretty), else NULL: written by string
-- functions, one call per container that holds containers.
CREATE OR REPLACE FUNCTION idem__plain(doc jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN idem__pretty(pg_catalog.convert_to(idem__plain_pretty(doc), pg_catalog.getdatabaseencoding()), 0);
END;
$$;

-- The canonical text of any value, in the database encoding.  An object
-- of a plain document whose members hold scalars, containers of scalars
-- and arrays of objects of scalars (most requests) is written here, in
-- one call, from its idem__plain_pretty text:
--
-- A line of that text is a bracket or a member or element (strings hold
-- no line break), a quote only opens or closes a string, and indentation
-- is four spaces a level.  So a line break and four spaces, then a
-- closing bracket, ends a container of a member, and the pieces between
-- these are each the members before such a container and the container
-- up to its opening bracket, a line break and eight spaces, then its
-- members or elements, one a line at eight spaces.  The members of the
-- document are what lies between a comma, a line break, four spaces and
-- a quote.  Members are sorted by array_to_tsvector, which sorts strings
-- byte by byte with a shorter one first on a common prefix: code point
-- order of the names (U+0001 ends each name, below every byte of a name,
-- and no two names are equal).  Other documents go to idem__pretty, which
-- takes any plain container, or to idem__container, which takes any.
CREATE OR REPLACE FUNCTION idem__canonical_bytes(doc jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    pretty text;
    body text;
    chunks text[];
    parts text[];
    elements text[];
    flat boolean := true;
    i integer;
    j integer;
BEGIN
    IF pg_catalog.jsonb_typeof(doc) NOT IN ('object', 'array') THEN
        RETURN pg_catalog.convert_to(idem__value(doc, 0), pg_catalog.getdatabaseencoding());
    END IF;
    pretty := idem__plain_pretty(doc);
    IF pretty IS NULL THEN
        RETURN pg_catalog.convert_to(idem__container(doc, 0), pg_catalog.getdatabaseencoding());
    END IF;
    IF pg_catalog.jsonb_typeof(doc) <> 'object' OR pretty = E'{\n}' THEN
        RETURN idem__pretty(pg_catalog.convert_to(pretty, pg_catalog.getdatabaseencoding()), 0);
    END IF;
    -- the members, without the first one's opening quote
    body := pg_catalog.replace(pg_catalog.replace(pretty, E'{\n    "', ''), E'\n}', '');
    chunks := pg_catalog.string_to_array(
        CASE WHEN pg_catalog.strpos(body, E'[\n') = 0 THEN body
             ELSE pg_catalog.replace(body, E'\n    ]', E'\n    }') END,
        E'\n    }');
    -- each piece but the last ends with a container, opened by the only
    -- bracket that ends a line in the piece when the container holds no
    -- container (any bracket that does is followed by eight spaces or
    -- more); its members or elements follow eight spaces
    FOR i IN 1 .. pg_catalog.cardinality(chunks) - 1 LOOP
        parts := pg_catalog.string_to_array(chunks[i], E'{\n        ');
        IF pg_catalog.cardinality(parts) = 2 AND pg_catalog.strpos(chunks[i], E'[\n') = 0 THEN
            chunks[i] := parts[1] || '{' || pg_catalog.array_to_string(pg_catalog.tsvector_to_array(
                             pg_catalog.array_to_tsvector(pg_catalog.string_to_array(parts[2], E',\n        '))),
                             ',') || '}';
            CONTINUE;
        END IF;
        -- an array of objects that hold no container, members at twelve
        -- spaces: nothing else of it is on a line of its own
        parts := pg_catalog.string_to_array(chunks[i], E'[\n        {\n            ');
        IF pg_catalog.cardinality(parts) = 2
           AND pg_catalog.strpos(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(parts[2],
                   E'\n        },\n        {\n            ', ''), E',\n            "', ''), E'\n        }', ''),
                   E'\n') = 0 THEN
            elements := pg_catalog.string_to_array(
                pg_catalog.replace(parts[2], E'\n        },\n        {\n            ', E'\n        }'),
                E'\n        }');
            FOR j IN 1 .. pg_catalog.cardinality(elements) - 1 LOOP
                elements[j] := '{' || pg_catalog.array_to_string(pg_catalog.tsvector_to_array(
                                   pg_catalog.array_to_tsvector(pg_catalog.string_to_array(
                                       elements[j], E',\n            '))), ',') || '}';
            END LOOP;
            chunks[i] := parts[1] || '[' || pg_catalog.array_to_string(elements[1:pg_catalog.cardinality(elements) - 1], ',') || ']';
            CONTINUE;
        END IF;
        parts := CASE WHEN pg_catalog.strpos(chunks[i], E'{\n') = 0 THEN pg_catalog.string_to_array(chunks[i], E'[\n        ') END;
        IF coalesce(pg_catalog.cardinality(parts), 0) <> 2 THEN
            flat := false;
            EXIT;
        END IF;
        chunks[i] := parts[1] || '[' || pg_catalog.replace(parts[2], E',\n        ', ',') || ']';
    END LOOP;
    IF NOT flat THEN
        RETURN idem__pretty(pg_catalog.convert_to(pretty, pg_catalog.getdatabaseencoding()), 0);
    END IF;
    RETURN pg_catalog.convert_to(pg_catalog.replace(
        '{"' || pg_catalog.array_to_string(pg_catalog.tsvector_to_array(pg_catalog.array_to_tsvector(
                    pg_catalog.string_to_array(pg_catalog.array_to_string(chunks, ''), E',\n    "'))), ',"')
        || '}', pg_catalog.chr(1), '":'), pg_catalog.getdatabaseencoding());
END;
$$;

-- The request fingerprint, for the edition's own functions: without a
-- search_path of its own (which would be set and reset at each call) and
-- inlined into the statement that calls it.
CREATE OR REPLACE FUNCTION idem__fingerprint(doc jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT pg_catalog.sha256(idem__canonical_bytes(doc))
$$;

-- RFC 8785 canonical JSON text of a value, with numbers kept exact.
CREATE OR REPLACE FUNCTION idem_canonical(value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN convert_from(idem__canonical_bytes(value), getdatabaseencoding());
END;
$$;

COMMENT ON FUNCTION idem_canonical(jsonb) IS
    'RFC 8785 canonical JSON text of a jsonb value, with numbers kept exact';

-- SHA-256 of the canonical text: the request fingerprint of idem_claim.
-- The bytes hashed are the text's in the database encoding, as the C
-- edition hashes them (UTF-8 in the databases that hold non-ASCII text).
CREATE OR REPLACE FUNCTION idem_fingerprint(value jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN idem__fingerprint(value);
END;
$$;

COMMENT ON FUNCTION idem_fingerprint(jsonb) IS
    'SHA-256 of idem_canonical(value) in UTF-8: the request fingerprint';

-- A deterministic key for a downstream call or an outbox event, derived
-- from the command's idempotency key and a step name: the SHA-256 of a
-- domain string (with its terminating NUL byte, as the C edition hashes
-- it) and of key and step, each prefixed by its length in 4 bytes, so that
-- ("ab", "c") and ("a", "bc") differ; its first 16 bytes as a UUID of
-- version 8.  Not STRICT: a NULL key must not quietly give a NULL key.
CREATE OR REPLACE FUNCTION idem_derive_key(key text, step text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    setting text := nullif(btrim(current_setting('idempotency.max_key_length', true)), '');
    max_length integer := 255;
    key_bytes bytea;
    step_bytes bytea;
    digest bytea;
    bad text;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'key must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF step IS NULL THEN
        RAISE EXCEPTION 'step must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF setting IS NOT NULL THEN
        IF setting !~ '^[+-]?[0-9]{1,9}$' THEN
            RAISE EXCEPTION 'invalid value for parameter "idempotency.max_key_length": "%"', setting
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        max_length := setting::integer;
        IF max_length NOT BETWEEN 1 AND 8192 THEN
            RAISE EXCEPTION '% is outside the valid range for parameter "idempotency.max_key_length" (1 .. 8192)',
                max_length USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    key_bytes := convert_to(key, getdatabaseencoding());
    IF length(key_bytes) = 0 THEN
        RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(key_bytes) > max_length THEN
        RAISE EXCEPTION 'idempotency key is too long'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('The key is %s bytes long; the limit is %s.', length(key_bytes), max_length),
                  HINT = 'Raise idempotency.max_key_length to accept longer keys.';
    END IF;
    -- the first byte outside printable ASCII begins the first such character
    bad := substring(key FROM E'[^\\x20-\\x7e]');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency key must be printable ASCII'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('Byte %s of the key is 0x%s.', strpos(key, bad),
                                  lpad(to_hex(get_byte(convert_to(bad, getdatabaseencoding()), 0)), 2, '0'));
    END IF;

    step_bytes := convert_to(step, getdatabaseencoding());
    IF length(step_bytes) = 0 THEN
        RAISE EXCEPTION 'step must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(step_bytes) > max_length THEN
        RAISE EXCEPTION 'step is too long'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('It is %s bytes long; the limit is %s.', length(step_bytes), max_length);
    END IF;
    bad := substring(step FROM E'[\\x01-\\x1f\\x7f]');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'step must not contain control characters'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('Byte %s is 0x%s.', octet_length(left(step, strpos(step, bad) - 1)) + 1,
                                  lpad(to_hex(ascii(bad)), 2, '0'));
    END IF;

    digest := sha256(E'\\x6964656d706f74656e6379206465726976655f6b657920763100'::bytea
                     || int4send(length(key_bytes)) || key_bytes
                     || int4send(length(step_bytes)) || step_bytes);
    digest := set_byte(digest, 6, (get_byte(digest, 6) & 15) | 128);      -- version 8
    digest := set_byte(digest, 8, (get_byte(digest, 8) & 63) | 128);      -- variant 10
    RETURN encode(substring(digest FROM 1 FOR 16), 'hex')::uuid::text;
END;
$$;
