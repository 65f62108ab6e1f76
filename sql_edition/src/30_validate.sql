--
-- Checks of the functions' arguments and settings.  Every check raises
-- before anything is read or written, with the C edition's SQLSTATE and
-- message (src/validate.c), so a bad call changes nothing.
--
-- The claim functions test the common case inline (a key of printable
-- ASCII within the limit) and call these only to find the exact error.
-- Settings are read by 12_settings.sql's readers.
--

-- idempotency.max_key_length (1 to 8192, 255 by default).
CREATE OR REPLACE FUNCTION idem__max_key_length()
RETURNS integer
LANGUAGE sql STABLE
RETURN CASE WHEN pg_catalog.current_setting('idempotency.max_key_length', true) IS NULL
              OR pg_catalog.current_setting('idempotency.max_key_length', true) = ''
            THEN 255
            ELSE idem__setting_integer('idempotency.max_key_length', 255, 1, 8192) END;

-- The first byte of a value that a pattern refuses: its position and hex
-- value, for a message.
CREATE OR REPLACE FUNCTION idem__bad_byte(value text, allowed text, OUT pos integer, OUT hex text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bytes bytea := pg_catalog.convert_to(value, pg_catalog.getdatabaseencoding());
    b integer;
BEGIN
    FOR i IN 0 .. pg_catalog.length(bytes) - 1 LOOP
        b := pg_catalog.get_byte(bytes, i);
        IF (allowed = 'key' AND (b < 32 OR b > 126))
           OR (allowed = 'name' AND (b < 32 OR b = 127))
           OR (allowed = 'header' AND ((b < 32 AND b <> 9) OR b = 127)) THEN
            pos := i + 1;
            hex := pg_catalog.lpad(pg_catalog.to_hex(b), 2, '0');
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- An idempotency key: 1 to idempotency.max_key_length bytes of printable
-- ASCII, as HTTP header values carry them.
CREATE OR REPLACE FUNCTION idem__check_key(key text)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    len integer := pg_catalog.octet_length(key);
    max_len integer := idem__max_key_length();
    bad record;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'key must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF len = 0 THEN
        RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF len > max_len THEN
        RAISE EXCEPTION 'idempotency key is too long'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('The key is %s bytes long; the limit is %s.', len, max_len),
                  HINT = 'Raise idempotency.max_key_length to accept longer keys.';
    END IF;
    bad := idem__bad_byte(key, 'key');
    IF bad.pos IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency key must be printable ASCII'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('Byte %s of the key is 0x%s.', bad.pos, bad.hex);
    END IF;
END
$$;

-- An operation, tenant, caller or consumer name: at most
-- idempotency.max_key_length bytes, no control characters.
CREATE OR REPLACE FUNCTION idem__check_name(value text, what text, allow_empty boolean)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    len integer := pg_catalog.octet_length(value);
    max_len integer := idem__max_key_length();
    bad record;
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be null', what USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF len = 0 AND NOT allow_empty THEN
        RAISE EXCEPTION '% must not be empty', what USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF len > max_len THEN
        RAISE EXCEPTION '% is too long', what
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('It is %s bytes long; the limit is %s.', len, max_len);
    END IF;
    bad := idem__bad_byte(value, 'name');
    IF bad.pos IS NOT NULL THEN
        RAISE EXCEPTION '% must not contain control characters', what
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('Byte %s is 0x%s.', bad.pos, bad.hex);
    END IF;
END
$$;

-- An interval argument (ttl, lease, wait) as microseconds, a month counted
-- as 30 days and a day as 24 hours, as leases and waits are applied.  No
-- part may be negative: a ttl is applied in calendar arithmetic
-- (timestamptz + interval), where a mixed interval such as
-- '1 mon -30 days' would end before it starts on some dates.  Positive
-- (or zero where allowed) and at most 365,250 days.
CREATE OR REPLACE FUNCTION idem__interval_usecs(value interval, what text, allow_zero boolean)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    months numeric := pg_catalog.date_part('year', value)::numeric * 12
                      + pg_catalog.date_part('month', value)::numeric;
    days numeric := pg_catalog.date_part('day', value)::numeric;
    usecs numeric;
BEGIN
    usecs := extract(epoch FROM value
                                 - pg_catalog.make_interval(months => months::integer,
                                                            days => days::integer)) * 1000000;
    IF months < 0 OR days < 0 OR usecs < 0 THEN
        RAISE EXCEPTION '% must be %', what, CASE WHEN allow_zero THEN 'zero or positive' ELSE 'positive' END
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('The value given is %s; no part of it (months, days, time) may be negative.', value);
    END IF;
    IF NOT allow_zero AND months = 0 AND days = 0 AND usecs = 0 THEN
        RAISE EXCEPTION '% must be positive', what
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('The value given is %s.', value);
    END IF;
    days := months * 30 + days;
    usecs := days * 86400000000 + usecs;
    IF days > 365250 OR usecs > 365250 * 86400000000::numeric THEN
        RAISE EXCEPTION '% is out of range', what
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('The value given is %s; the longest accepted is 365250 days.', value);
    END IF;
    RETURN usecs::bigint;
END
$$;

-- An HTTP status code: 100 to 599.
CREATE OR REPLACE FUNCTION idem__check_http_status(status integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF status IS NULL THEN
        RAISE EXCEPTION 'http_status must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF status < 100 OR status > 599 THEN
        RAISE EXCEPTION 'http_status must be between 100 and 599'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('The value given is %s.', status);
    END IF;
END
$$;

-- A header name: an HTTP token (RFC 9110), not a hop-by-hop header.
CREATE OR REPLACE FUNCTION idem__check_header_name(name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bytes bytea;
    b integer;
BEGIN
    IF name = '' THEN
        RAISE EXCEPTION 'a header name must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF name !~ '^[0-9a-zA-Z!#$%&''*+.^_`|~-]+$' THEN
        bytes := pg_catalog.convert_to(name, pg_catalog.getdatabaseencoding());
        FOR i IN 0 .. pg_catalog.length(bytes) - 1 LOOP
            b := pg_catalog.get_byte(bytes, i);
            IF NOT (pg_catalog.chr(b) ~ '^[0-9a-zA-Z!#$%&''*+.^_`|~-]$' AND b < 128) THEN
                RAISE EXCEPTION 'header name "%" is not an HTTP token', idem__clip(name, 64)
                    USING ERRCODE = 'invalid_parameter_value',
                          DETAIL = pg_catalog.format('Byte %s is 0x%s; a name is letters, digits and !#$%%&''*+-.^_`|~.',
                                                     i + 1, pg_catalog.lpad(pg_catalog.to_hex(b), 2, '0'));
            END IF;
        END LOOP;
    END IF;
    IF pg_catalog.lower(name) IN ('connection', 'keep-alive', 'proxy-connection', 'te', 'trailer',
                                  'transfer-encoding', 'upgrade') THEN
        RAISE EXCEPTION 'header "%" is hop-by-hop and cannot be stored', name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'Connection, Keep-Alive, Proxy-Connection, TE, Trailer, Transfer-Encoding and Upgrade describe one connection, not the response.',
                  HINT = 'Store the end-to-end headers of the response only.';
    END IF;
END
$$;

-- A header value: no control characters but tab.
CREATE OR REPLACE FUNCTION idem__check_header_value(name text, value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bad record;
BEGIN
    IF value ~ E'[\\x01-\\x08\\x0a-\\x1f\\x7f]' THEN
        bad := idem__bad_byte(value, 'header');
        RAISE EXCEPTION 'value of header "%" contains a control character', idem__clip(name, 64)
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('Byte %s is 0x%s; a stored header could split the replayed response.',
                                             bad.pos, bad.hex);
    END IF;
END
$$;

-- Response headers: a JSON object of strings (one value per name), or a
-- JSON array of [name, value] pairs of strings, kept in order and with
-- repeats.  Names must be HTTP tokens and values free of control
-- characters other than tab, so that a replay can never split a response.
CREATE OR REPLACE FUNCTION idem__check_headers(headers jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    shape constant text := 'headers must be a JSON object of strings or an array of [name, value] pairs';
    kind text := pg_catalog.jsonb_typeof(headers);
    item record;
    pair jsonb;
    n integer;
BEGIN
    IF kind = 'object' THEN
        FOR item IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(headers) AS e LOOP
            PERFORM idem__check_header_name(item.key);
            IF pg_catalog.jsonb_typeof(item.value) <> 'string' THEN
                RAISE EXCEPTION '%', shape
                    USING ERRCODE = 'invalid_parameter_value',
                          DETAIL = pg_catalog.format('Header "%s" is not a string.', idem__clip(item.key, 64));
            END IF;
            PERFORM idem__check_header_value(item.key, item.value #>> '{}');
        END LOOP;
    ELSIF kind = 'array' THEN
        FOR pair IN SELECT e FROM pg_catalog.jsonb_array_elements(headers) AS e LOOP
            IF pg_catalog.jsonb_typeof(pair) = 'object' THEN
                RAISE EXCEPTION '%', shape
                    USING ERRCODE = 'invalid_parameter_value', DETAIL = 'An element is an object.';
            ELSIF pg_catalog.jsonb_typeof(pair) <> 'array' THEN
                RAISE EXCEPTION '%', shape
                    USING ERRCODE = 'invalid_parameter_value',
                          DETAIL = pg_catalog.format('An element is a JSON %s.',
                                                     CASE WHEN pg_catalog.jsonb_typeof(pair) = 'string'
                                                          THEN 'string' ELSE 'scalar' END);
            END IF;
            n := 0;
            FOR item IN SELECT e.value, e.ordinality
                          FROM pg_catalog.jsonb_array_elements(pair) WITH ORDINALITY AS e LOOP
                IF pg_catalog.jsonb_typeof(item.value) <> 'string' THEN
                    RAISE EXCEPTION '%', shape
                        USING ERRCODE = 'invalid_parameter_value',
                              DETAIL = 'A pair holds a JSON value that is not a string.';
                END IF;
                n := n + 1;
                IF n = 1 THEN
                    PERFORM idem__check_header_name(item.value #>> '{}');
                ELSIF n = 2 THEN
                    PERFORM idem__check_header_value(pair ->> 0, item.value #>> '{}');
                END IF;
            END LOOP;
            IF n <> 2 THEN
                RAISE EXCEPTION '%', shape
                    USING ERRCODE = 'invalid_parameter_value',
                          DETAIL = pg_catalog.format('A pair holds %s strings; it must hold a name and a value.', n);
            END IF;
        END LOOP;
    ELSE
        RAISE EXCEPTION '%', shape
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'The value given is a JSON scalar.';
    END IF;
END
$$;

-- Whether response headers plainly pass idem__check_headers: an object of
-- plain strings or a list of [name, value] pairs, names HTTP tokens that
-- are not hop-by-hop, values without quotes, backslashes or control
-- characters, read from the value's text form by one pattern.  When they
-- do not, idem__check_headers decides.
CREATE OR REPLACE FUNCTION idem__plain_headers(headers jsonb)
RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN coalesce((headers::text ~ E'^(\\{\\}|\\{"[0-9A-Za-z!#$%&''*+.^_`|~-]+": "[^"\\\\\\x01-\\x1f\\x7f]*"(, "[0-9A-Za-z!#$%&''*+.^_`|~-]+": "[^"\\\\\\x01-\\x1f\\x7f]*")*\\}|\\[\\]|\\[\\["[0-9A-Za-z!#$%&''*+.^_`|~-]+", "[^"\\\\\\x01-\\x1f\\x7f]*"\\](, \\["[0-9A-Za-z!#$%&''*+.^_`|~-]+", "[^"\\\\\\x01-\\x1f\\x7f]*"\\])*\\])$')
                AND headers::text !~* '"(connection|keep-alive|proxy-connection|te|trailer|transfer-encoding|upgrade)"',
                false);

-- A user-supplied string shortened for a message: at most maxlen bytes,
-- cut at a character boundary, with "..." when it was longer.
CREATE OR REPLACE FUNCTION idem__clip(value text, maxlen integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    cut text := value;
BEGIN
    IF pg_catalog.octet_length(value) <= maxlen THEN
        RETURN value;
    END IF;
    cut := pg_catalog.left(value, maxlen);
    WHILE pg_catalog.octet_length(cut) > maxlen LOOP
        cut := pg_catalog.left(cut, -1);
    END LOOP;
    RETURN cut || '...';
END
$$;

-- on_lease_expiry: 'unknown' or 'retry'.
CREATE OR REPLACE FUNCTION idem__parse_policy(policy text)
RETURNS idem_lease_policy
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF policy IS NULL THEN
        RAISE EXCEPTION 'on_lease_expiry must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF policy = 'unknown' THEN
        RETURN 'unknown';
    ELSIF policy = 'retry' THEN
        RETURN 'retry';
    END IF;
    RAISE EXCEPTION 'invalid on_lease_expiry "%"', idem__clip(policy, 32)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'Use "unknown" (the outcome must be reconciled) or "retry" (a later claim may run the command again).';
END
$$;

-- on_expired: true for 'proceed' (a new command over an expired record),
-- false for 'reject' (answer expired).
CREATE OR REPLACE FUNCTION idem__parse_on_expired(value text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'on_expired must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF value = 'reject' THEN
        RETURN false;
    ELSIF value = 'proceed' THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'invalid on_expired "%"', idem__clip(value, 32)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'Use "reject" (answer expired: the client queries the resource first) or "proceed" (run the command again as a new one).';
END
$$;

-- A response to store: status 100 to 599; a body as JSON or raw bytes, not
-- both; headers an object of strings or a list of [name, value] pairs;
-- body, raw body, headers and resource id together within
-- idempotency.max_response_size bytes.  jsonb values count their stored
-- size, as in the C edition.
CREATE OR REPLACE FUNCTION idem__check_response(http_status integer, body jsonb, headers jsonb,
                                     resource_id text, raw_body bytea)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    size bigint;
    max_size bigint;
BEGIN
    PERFORM idem__check_http_status(http_status);
    IF body IS NOT NULL AND raw_body IS NOT NULL THEN
        RAISE EXCEPTION 'a response has either a body or a raw_body, not both'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the exact bytes sent to the client as raw_body, or a JSON body as body.';
    END IF;
    size := coalesce(pg_catalog.pg_column_size(body) - 4, 0)
            + coalesce(pg_catalog.pg_column_size(headers) - 4, 0)
            + coalesce(pg_catalog.octet_length(resource_id), 0)
            + coalesce(pg_catalog.octet_length(raw_body), 0);
    IF size > 1024 THEN
        max_size := idem__setting_integer('idempotency.max_response_size', 1048576, 1024, 536870911, 'B');
        IF size > max_size THEN
            RAISE EXCEPTION 'response is too large to store'
                USING ERRCODE = 'program_limit_exceeded',
                      DETAIL = pg_catalog.format('Its body, raw body, headers and resource id take %s bytes; idempotency.max_response_size is %s bytes.',
                                                 size, max_size),
                      HINT = 'Store the id of the resource the command created and a small body, not the whole document; or raise idempotency.max_response_size.';
        END IF;
    END IF;
    IF headers IS NOT NULL THEN
        PERFORM idem__check_headers(headers);
    END IF;
END
$$;

-- Raise a clear error when the transaction cannot write: on a standby or in
-- a read-only transaction.
CREATE OR REPLACE FUNCTION idem__require_writable(what text)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot % on a standby server', what
            USING ERRCODE = 'read_only_sql_transaction',
                  DETAIL = 'The server is in recovery: idempotency records can be read here but not written.',
                  HINT = 'Send claims and their completions to the primary; idem_replay() and claims that replay work on a standby.';
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'cannot % in a read-only transaction', what
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'Claims that replay and idem_replay() work read-only; anything that writes a record needs a read-write transaction.';
    END IF;
END
$$;

-- Whether idem_records_archive is there, in the schema of idem_records, as
-- the C extension looks it up: by name in that schema alone, never in
-- pg_temp, which the pinned search_path lists last, so that no table of a
-- caller's can take its place when it was renamed.
CREATE OR REPLACE FUNCTION idem__archive_present()
RETURNS boolean
LANGUAGE sql STABLE
AS $$
SELECT EXISTS (SELECT FROM pg_catalog.pg_class AS a
                WHERE a.relname OPERATOR(pg_catalog.=) 'idem_records_archive'
                  AND a.relnamespace OPERATOR(pg_catalog.=)
                      (SELECT r.relnamespace FROM pg_catalog.pg_class AS r
                        WHERE r.oid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass))
$$;

-- With idempotency.cleanup_action = 'archive', a claim that reuses an
-- expired record for a new command copies it to the archive first; when
-- the copy cannot be made, the reuse is refused rather than made without
-- it, as cleanup refuses to delete.
CREATE OR REPLACE FUNCTION idem__require_archive_for_reuse()
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT idem__archive_present() THEN
        RAISE EXCEPTION 'idempotency cannot reuse an expired record: relation "idem_records_archive" does not exist'
            USING ERRCODE = 'undefined_table',
                  DETAIL = 'idempotency.cleanup_action is "archive": no record is reused for a new command without a copy of the previous one.',
                  HINT = 'Give the table back its name, or set idempotency.cleanup_action to "delete".';
    END IF;
END
$$;

-- A write that someone acts on (a claim that proceeds, an outcome, a lease
-- marked unknown) commits synchronously, as with the C edition's
-- idempotency.synchronous_outcomes (on by default): an asynchronous commit
-- is visible before it is on disk, and a crash would take back an answer
-- already acted on.  Only synchronous_commit = off needs raising, once per
-- transaction; the writers call this only then.
CREATE OR REPLACE FUNCTION idem__outcome_written()
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF idem__setting_boolean('idempotency.synchronous_outcomes', true) THEN
        PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
    END IF;
END
$$;

-- Raise again a constraint error (SQLSTATE class 23) that a write of a
-- record raised, with its message but not PostgreSQL's DETAIL, which would
-- show the row's values (the key, the scope, the attempt token's secret)
-- to the client and in the server log.
CREATE OR REPLACE FUNCTION idem__reraise_without_values(state text, message text, constraint_name text,
                                             table_name text, column_name text,
                                             schema_name text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', message
        USING ERRCODE = state,
              DETAIL = 'The values of the idempotency record are not shown.',
              CONSTRAINT = coalesce(constraint_name, ''), TABLE = coalesce(table_name, ''),
              COLUMN = coalesce(column_name, ''), SCHEMA = coalesce(schema_name, '');
END
$$;
