--
-- The fencing token that names one attempt of one record, in the C
-- edition's form: "<record id>.<attempt>.<32 hex digits>".  The hex digits
-- are a random secret of 16 bytes stored with the attempt (attempt_token);
-- a write with the token succeeds only while the record is processing that
-- very attempt.  The secret, not the attempt number, is what fences: a
-- record reused after it expired starts again at attempt 1.  A token of one
-- edition works on the other, the record having kept its attempt_token.
--

-- A new secret: the 16 bytes of a random UUID (122 random bits).
CREATE OR REPLACE FUNCTION idem__new_secret()
RETURNS bytea
LANGUAGE sql VOLATILE
RETURN pg_catalog.uuid_send(pg_catalog.gen_random_uuid());

-- The text form of a token.
CREATE OR REPLACE FUNCTION idem__token_format(record_id bigint, attempt integer, secret bytea)
RETURNS text
LANGUAGE sql IMMUTABLE
RETURN record_id::text || '.' || attempt::text || '.' || pg_catalog.encode(secret, 'hex');

-- Parse a token, raising when it is not exactly the form written: no
-- blanks, signs or leading zeros, lower-case hex digits.  (String
-- functions, not one pattern with counted repeats, which PostgreSQL's
-- regular expressions match slowly.)
CREATE OR REPLACE FUNCTION idem__token_parse(token text, OUT record_id bigint, OUT attempt integer,
                                             OUT secret bytea)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    id_part text := pg_catalog.split_part(token, '.', 1);
    attempt_part text := pg_catalog.split_part(token, '.', 2);
    secret_part text := pg_catalog.split_part(token, '.', 3);
    malformed boolean;
BEGIN
    IF token IS NULL THEN
        RAISE EXCEPTION 'token must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    malformed := CASE WHEN token <> id_part || '.' || attempt_part || '.' || secret_part
                 OR pg_catalog.length(id_part) > 19 OR id_part !~ '^[1-9][0-9]*$'
                 OR pg_catalog.length(attempt_part) > 10 OR attempt_part !~ '^[1-9][0-9]*$'
                 OR pg_catalog.length(secret_part) <> 32 OR secret_part ~ '[^0-9a-f]'
                 THEN true
            ELSE id_part::numeric > 9223372036854775807 OR attempt_part::numeric > 2147483647 END;
    IF malformed THEN
        RAISE EXCEPTION 'invalid attempt token'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the token idem_claim returned with outcome "proceed".';
    END IF;
    record_id := id_part::bigint;
    attempt := attempt_part::integer;
    secret := pg_catalog.decode(secret_part, 'hex');
END
$$;
