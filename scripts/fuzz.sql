--
-- scripts/fuzz.sql: the random caller scripts/fuzz.sh runs in every client.
--
-- fuzz_round(n, deadline) calls n random functions of the extension, found
-- in the catalog (so functions added later are fuzzed too), with arguments
-- drawn from pools of edge values per type and argument name, named
-- arguments left out at random.  Every call runs in its own subtransaction;
-- its SQLSTATE is counted in fuzz_counts.  An internal error (class XX) or
-- an error the generator itself caused (a syntax error, a function or cast
-- that does not exist) is kept with its statement in fuzz_failures.  Tokens and record ids that
-- proceed answers hand out go to fuzz_tokens, where every client (of every
-- role) picks them up, mangled or not, for later calls.
--
CREATE TABLE fuzz_counts (fn text, result text, calls bigint,
                          PRIMARY KEY (fn, result));
CREATE TABLE fuzz_failures (at timestamptz DEFAULT clock_timestamp(), who text,
                            sqlstate text, message text, stmt text);
CREATE TABLE fuzz_tokens (token text, record_id bigint);
GRANT SELECT, INSERT, UPDATE ON fuzz_counts, fuzz_failures, fuzz_tokens TO PUBLIC;

-- The functions to call and their arguments.
CREATE VIEW fuzz_functions AS
SELECT p.oid, p.proname::text AS name, p.pronargs, p.pronargdefaults,
       p.proargnames AS argnames,
       ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t) AS argtypes
  FROM pg_proc p
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                  AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE p.prorettype <> 'trigger'::regtype
   AND p.proname NOT IN ('idem_launch_worker');
GRANT SELECT ON fuzz_functions TO PUBLIC;

CREATE FUNCTION fuzz_pick(a text[]) RETURNS text
LANGUAGE sql VOLATILE AS $$ SELECT a[1 + floor(random() * array_length(a, 1))::int] $$;

-- One SQL literal for an argument, by name and type: 'NULL' or a quoted value.
CREATE FUNCTION fuzz_value(argname text, argtype text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  r double precision := random();
  tok text;
  v text;
BEGIN
  IF r < 0.04 THEN
    RETURN 'NULL::' || argtype;
  END IF;

  IF argtype = 'text' AND argname = 'token' THEN
    SELECT token INTO tok FROM fuzz_tokens
     OFFSET floor(random() * greatest(1, (SELECT count(*) FROM fuzz_tokens)))::int LIMIT 1;
    IF tok IS NOT NULL AND r < 0.6 THEN
      v := tok;
    ELSIF tok IS NOT NULL AND r < 0.8 THEN
      -- a mangled real token: another attempt, id, or secret
      v := CASE floor(random() * 4)::int
             WHEN 0 THEN regexp_replace(tok, '^(\d+)\.(\d+)\.', '\1.' || (floor(random() * 3))::int || '.')
             WHEN 1 THEN regexp_replace(tok, '^(\d+)\.', (floor(random() * 50))::int || '.')
             WHEN 2 THEN overlay(tok placing fuzz_pick(ARRAY['0', 'f', 'G', '.', ' ']) from length(tok) for 1)
             ELSE tok || fuzz_pick(ARRAY['', '0', ' ', E'\n'])
           END;
    ELSE
      v := fuzz_pick(ARRAY['', 'garbage', '1.1.', '.1.00', '1..00',
                           '1.1.00000000000000000000000000000000',
                           '9223372036854775807.2147483647.ffffffffffffffffffffffffffffffff',
                           '9223372036854775808.1.00000000000000000000000000000000',
                           '-1.1.00000000000000000000000000000000',
                           '0x10.1.00000000000000000000000000000000',
                           ' 1.1.00000000000000000000000000000000',
                           '+1.+1.00000000000000000000000000000000',
                           repeat('9', 5000), E'1.1.\u00e9']);
    END IF;
  ELSIF argtype = 'text' AND argname IN ('key', 'step') THEN
    v := CASE WHEN r < 0.7 THEN fuzz_pick(ARRAY['k1', 'k2', 'k3', 'k4', 'k5', 'k6'])
              ELSE fuzz_pick(ARRAY['', ' ', repeat('k', 255), repeat('k', 256), repeat('k', 10000),
                                   E'k\t', E'k\x01', E'k\x7f', 'clé', E'\u2603', E'\U0001F600',
                                   $q$'; DROP TABLE idem_records; --$q$, '%s%n%x', 'k\', '$1'])
         END;
  ELSIF argtype = 'text' AND argname IN ('operation', 'tenant', 'caller') THEN
    v := CASE WHEN r < 0.7 THEN fuzz_pick(ARRAY['payments.create', 'refunds.create', '', 'acme', 'svc'])
              ELSE fuzz_pick(ARRAY[' ', repeat('o', 255), repeat('o', 256), repeat('o', 10000),
                                   E'op\n', E'op\x1b[31m', 'opé', E'\u2603', repeat('é', 200),
                                   current_user, 'postgres'])
         END;
  ELSIF argtype = 'text' AND argname = 'on_lease_expiry' THEN
    v := fuzz_pick(ARRAY['unknown', 'retry', 'unknown', 'retry', '', 'RETRY', 'forget', repeat('x', 10000)]);
  ELSIF argtype = 'text' AND argname = 'state' THEN
    v := fuzz_pick(ARRAY['succeeded', 'failed', 'retryable', 'unknown', 'processing', '', repeat('s', 10000)]);
  ELSIF argtype = 'text' THEN
    v := fuzz_pick(ARRAY['', 'x', 'step-1', 'PAY-1', repeat('r', 2000), E'a\nb', E'\u2603',
                         repeat('p', 1100000)]);
  ELSIF argtype = 'jsonb' THEN
    v := CASE floor(random() * 20)::int
           WHEN 0 THEN repeat('[', 3000) || repeat(']', 3000)
           WHEN 1 THEN repeat('{"a":', 2000) || '"x"' || repeat('}', 2000)
           WHEN 2 THEN (SELECT jsonb_agg(i)::text FROM generate_series(1, 20000) i)
           WHEN 3 THEN to_jsonb(repeat('x', 1100000))::text
           ELSE fuzz_pick(ARRAY['null', '1', '-0', '1.000', '1e308', '-1e-308', '"s"', '""', '[]', '{}',
                                '{"a": 1}', '{"amount": 100, "currency": "EUR"}', '{"currency": "EUR", "amount": 100.0}',
                                '{"Location": "/p/1"}', '{"a": "b", "c": "d"}', '{"a": ["b"]}',
                                '{"a": {"b": "c"}}', '{"a": null}', '{"": ""}', '[1, "x", null, true]',
                                '{"\u00e9": "\u2603"}', 'true', '"\ud83d\ude00"',
                                '123456789012345678901234567890.123456789'])
         END;
  ELSIF argtype IN ('integer', 'bigint') AND argname IN ('record_id') THEN
    SELECT record_id::text INTO v FROM fuzz_tokens
     OFFSET floor(random() * greatest(1, (SELECT count(*) FROM fuzz_tokens)))::int LIMIT 1;
    IF v IS NULL OR r < 0.3 THEN
      v := fuzz_pick(ARRAY['-1', '0', '1', '2', '9223372036854775807', '-9223372036854775808']);
    END IF;
  ELSIF argtype IN ('integer', 'bigint') THEN
    v := CASE WHEN r < 0.6 THEN fuzz_pick(ARRAY['200', '201', '409', '422', '500', '503'])
              ELSE fuzz_pick(ARRAY['-2147483648', '-1', '0', '1', '99', '100', '599', '600', '2147483647'])
         END;
  ELSIF argtype = 'interval' THEN
    v := fuzz_pick(ARRAY['0', '-1 second', '1 microsecond', '1 millisecond', '10 milliseconds',
                         '100 milliseconds', '1 second', '1 hour', '1 day', '100 years',
                         '178000000 years', '-178000000 years', '2147483647 months',
                         '2147483647 days', '1 day -86400 seconds', '-1 month 31 days']);
  ELSIF argtype = 'boolean' THEN
    v := fuzz_pick(ARRAY['true', 'false']);
  ELSE
    RETURN 'NULL::' || argtype;
  END IF;
  RETURN quote_literal(v) || '::' || argtype;
END $$;

-- Call n random functions; stop early after the deadline.
CREATE FUNCTION fuzz_round(n int, deadline timestamptz) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  f record;
  args text[];
  stmt text;
  res jsonb;
  res_text text;
  msg text;
  i int;
  a int;
  done int := 0;
  counts jsonb := '{}';
  k text;
BEGIN
  FOR i IN 1 .. n LOOP
    EXIT WHEN clock_timestamp() > deadline;
    SELECT * INTO f FROM fuzz_functions ORDER BY random() LIMIT 1;
    args := '{}';
    FOR a IN 1 .. f.pronargs LOOP
      IF coalesce(f.argnames[a], '') = '' THEN
        args := args || fuzz_value('', f.argtypes[a]);
        CONTINUE;
      END IF;
      -- defaulted arguments are left out now and then (named notation)
      CONTINUE WHEN a > f.pronargs - f.pronargdefaults AND random() < 0.4;
      args := args || (quote_ident(f.argnames[a]) || ' => ' ||
                       fuzz_value(f.argnames[a], f.argtypes[a]));
    END LOOP;
    stmt := format('SELECT to_jsonb(r) FROM %I(%s) AS r LIMIT 1', f.name,
                   array_to_string(args, ', '));
    BEGIN
      EXECUTE stmt INTO res;
      res_text := 'ok';
      IF jsonb_typeof(res) = 'object' AND res ? 'outcome' THEN
        res_text := 'ok:' || (res->>'outcome');
        IF res->>'token' IS NOT NULL THEN
          INSERT INTO fuzz_tokens VALUES (res->>'token', (res->>'record_id')::bigint);
        END IF;
      END IF;
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
      res_text := SQLSTATE;
      IF SQLSTATE LIKE 'XX%' OR SQLSTATE IN ('42601', '42883', '42725', '42804', '42846', '22P02') THEN
        INSERT INTO fuzz_failures (who, sqlstate, message, stmt)
        VALUES (current_user, SQLSTATE, msg, left(stmt, 2000));
      END IF;
    END;
    k := f.name || '|' || res_text;
    counts := jsonb_set(counts, ARRAY[k], to_jsonb(coalesce((counts->>k)::int, 0) + 1));
    done := done + 1;
  END LOOP;
  -- one upsert per round, in key order: clients never deadlock on the counts
  INSERT INTO fuzz_counts
  SELECT split_part(key, '|', 1), split_part(key, '|', 2), value::bigint
    FROM jsonb_each_text(counts) ORDER BY key
      ON CONFLICT ON CONSTRAINT fuzz_counts_pkey DO UPDATE SET calls = fuzz_counts.calls + excluded.calls;
  RETURN done;
END $$;
