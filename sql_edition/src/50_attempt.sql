--
-- What the holder of an attempt token does with it (idem_complete,
-- idem_fail, idem_heartbeat, idem_checkpoint) and how an operator settles
-- a record whose outcome is unknown (idem_resolve): the C edition's
-- src/attempt.c.
--
-- A token write succeeds only while the record is processing the very
-- attempt the token names; otherwise it raises 55000 and changes nothing,
-- so a worker that lost its lease never overwrites the outcome of the
-- attempt that replaced it.  The token's role and secret are checked on the
-- committed record first, before the write locks or waits: a token of
-- another role, or a forged one, gets the same error at once as a token
-- naming no record, and learns nothing about other roles' records, not
-- even from a wait.
--

-- Explain why a token no longer names the record's running attempt.
CREATE OR REPLACE FUNCTION idem__stale_token(p_role regrole, p_record_id bigint, p_attempt integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    detail text;
    hint text;
BEGIN
    SELECT t.state, t.attempt INTO r FROM idem_records AS t
     WHERE t.id = p_record_id AND t.role = p_role;
    IF NOT FOUND THEN
        detail := pg_catalog.format('Record %s no longer exists.', p_record_id);
    ELSIF r.attempt <> p_attempt THEN
        detail := pg_catalog.format('Attempt %s of record %s was replaced by attempt %s.',
                                    p_attempt, p_record_id, r.attempt);
    ELSIF r.state = 'processing' THEN
        detail := pg_catalog.format('The token does not match attempt %s of record %s.',
                                    p_attempt, p_record_id);
    ELSIF r.state = 'unknown' THEN
        detail := pg_catalog.format('The lease of attempt %s of record %s ended and its outcome was marked unknown.',
                                    p_attempt, p_record_id);
        hint := 'Once the outcome is known, settle it with idem_resolve().';
    ELSE
        detail := pg_catalog.format('Attempt %s of record %s already ended as "%s".',
                                    p_attempt, p_record_id, r.state);
    END IF;
    IF hint IS NULL THEN
        RAISE EXCEPTION 'attempt token is no longer valid'
            USING ERRCODE = 'object_not_in_prerequisite_state', DETAIL = detail;
    END IF;
    RAISE EXCEPTION 'attempt token is no longer valid'
        USING ERRCODE = 'object_not_in_prerequisite_state', DETAIL = detail, HINT = hint;
END
$$;

-- Store the outcome of the attempt a token names: succeeded (complete),
-- failed or retryable (fail).
CREATE OR REPLACE FUNCTION idem__finish(p_role regrole, via text, token text,
                             new_state idem_state, http_status integer, body jsonb,
                             headers jsonb, resource_id text, raw_body bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    tok record;
    now_ts timestamptz;
    done boolean;
    e_state text;
    e_message text;
    e_constraint text;
    e_table text;
    e_column text;
    e_schema text;
BEGIN
    IF via = 'idem_complete' THEN
        IF NOT idem__plain_role(p_role, 'idem_complete(text, integer, jsonb, jsonb, text, bytea)') THEN
            PERFORM idem__acting_role(p_role, 'idem_complete(text, integer, jsonb, jsonb, text, bytea)');
        END IF;
    ELSIF NOT idem__plain_role(p_role, 'idem_fail(text, integer, jsonb, jsonb, boolean, bytea)') THEN
        PERFORM idem__acting_role(p_role, 'idem_fail(text, integer, jsonb, jsonb, boolean, bytea)');
    END IF;
    -- Anyone may call this function directly: it writes only what
    -- idem_complete or idem_fail would, never a state the transition table
    -- gives a token's holder no way to reach (processing with neither token
    -- nor lease, which nothing would ever take over; unknown with a
    -- response).
    IF NOT (via = 'idem_complete' AND new_state = 'succeeded'
            OR via = 'idem_fail' AND resource_id IS NULL
               AND (new_state IS NULL OR new_state IN ('failed', 'retryable'))) THEN
        RAISE EXCEPTION 'invalid outcome for an attempt token'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('%s does not store state "%s"%s.',
                                             coalesce(via, '-'), coalesce(new_state::text, '-'),
                                             CASE WHEN resource_id IS NOT NULL THEN ' with a resource_id' ELSE '' END),
                  HINT = 'Call idem_complete() or idem_fail().';
    END IF;
    tok := idem__token_parse(token);
    IF http_status IS NULL THEN
        RAISE EXCEPTION 'http_status must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF http_status < 100 OR http_status > 599
       OR (headers IS NOT NULL AND NOT idem__plain_headers(headers))
       OR (body IS NOT NULL AND raw_body IS NOT NULL)
       OR coalesce(pg_catalog.octet_length(raw_body), 0) + coalesce(pg_catalog.octet_length(resource_id), 0)
          + coalesce(pg_catalog.octet_length(body::text), 0)
          + coalesce(pg_catalog.octet_length(headers::text), 0) > 512 THEN
        PERFORM idem__check_response(http_status, body, headers, resource_id, raw_body);
    END IF;
    IF new_state IS NULL THEN
        RAISE EXCEPTION 'retryable must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.current_setting('transaction_read_only') = 'on' OR pg_catalog.pg_is_in_recovery() THEN
        PERFORM idem__require_writable('store the outcome of an attempt');
    END IF;

    -- One statement: its scan compares the role and the secret on the
    -- version this snapshot sees before it would wait for a row lock, so a
    -- token of another role, or a forged one, never waits.
    now_ts := pg_catalog.clock_timestamp();
    BEGIN
        UPDATE idem_records AS t
           SET state = new_state, response_status = http_status,
               response_headers = headers, response_body = body,
               response_raw_body = raw_body, response_sealed = NULL,
               resource_id = idem__finish.resource_id,
               attempt_token = NULL, locked_until = NULL,
               completed_at = now_ts, updated_at = now_ts, expires_at = now_ts + t.ttl
         WHERE t.id = tok.record_id AND t.role = p_role AND t.attempt_token = tok.secret
           AND t.state = 'processing' AND t.attempt = tok.attempt;
        done := FOUND;
    EXCEPTION WHEN integrity_constraint_violation THEN
        GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
            e_constraint = CONSTRAINT_NAME, e_table = TABLE_NAME,
            e_column = COLUMN_NAME, e_schema = SCHEMA_NAME;
        PERFORM idem__reraise_without_values(e_state, e_message, e_constraint,
                                             e_table, e_column, e_schema);
    END;
    IF done THEN
        IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
            PERFORM idem__outcome_written();
        END IF;
        RETURN;
    END IF;
    PERFORM idem__stale_token(p_role, tok.record_id, tok.attempt);
END
$$;

-- Set the lease end or the recovery point of the attempt a token names.
CREATE OR REPLACE FUNCTION idem__token_write(p_role regrole, tok record, new_locked_until timestamptz,
                                  new_recovery_point text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idem_records AS t
       SET locked_until = coalesce(new_locked_until, t.locked_until),
           recovery_point = coalesce(new_recovery_point, t.recovery_point),
           updated_at = pg_catalog.clock_timestamp()
     WHERE t.id = tok.record_id AND t.role = p_role AND t.attempt_token = tok.secret
       AND t.state = 'processing' AND t.attempt = tok.attempt;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM idem__stale_token(p_role, tok.record_id, tok.attempt);
END
$$;

CREATE OR REPLACE FUNCTION idem__heartbeat(p_role regrole, token text, lease interval)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    tok record;
    lease_us bigint;
    locked_until timestamptz;
BEGIN
    PERFORM idem__acting_role(p_role, 'idem_heartbeat(text, interval)');
    tok := idem__token_parse(token);
    IF lease IS NULL THEN
        lease_us := idem__setting_integer('idempotency.default_lease', 30000, 1, 2147483647, 'ms')::bigint * 1000;
    ELSE
        lease_us := idem__interval_usecs(lease, 'lease', false);
    END IF;
    locked_until := pg_catalog.clock_timestamp() + lease_us * interval '1 microsecond';
    PERFORM idem__require_writable('extend a lease');
    PERFORM idem__token_write(p_role, tok, locked_until, NULL);
    RETURN locked_until;
END
$$;

CREATE OR REPLACE FUNCTION idem__checkpoint(p_role regrole, token text, recovery_point text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    tok record;
    max_size bigint;
BEGIN
    PERFORM idem__acting_role(p_role, 'idem_checkpoint(text, text)');
    tok := idem__token_parse(token);
    IF recovery_point IS NULL THEN
        RAISE EXCEPTION 'recovery_point must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF pg_catalog.octet_length(recovery_point) > 1024 THEN
        max_size := idem__setting_integer('idempotency.max_response_size', 1048576, 1024, 536870911, 'B');
        IF pg_catalog.octet_length(recovery_point) > max_size THEN
            RAISE EXCEPTION 'recovery_point is too large to store'
                USING ERRCODE = 'program_limit_exceeded',
                      DETAIL = pg_catalog.format('It takes %s bytes; idempotency.max_response_size is %s bytes.',
                                                 pg_catalog.octet_length(recovery_point), max_size);
        END IF;
    END IF;
    PERFORM idem__require_writable('record a recovery point');
    PERFORM idem__token_write(p_role, tok, NULL, recovery_point);
END
$$;

-- Settle an unknown record as succeeded, failed or retryable: the calling
-- role's own, or any role's for the owner of idem_records and superusers.
CREATE OR REPLACE FUNCTION idem__resolve(p_role regrole, record_id bigint, state text, http_status integer,
                              body jsonb, headers jsonb, raw_body bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    new_state idem_state;
    any_role boolean;
    now_ts timestamptz;
    found_state idem_state;
    done boolean;
    e_state text;
    e_message text;
    e_constraint text;
    e_table text;
    e_column text;
    e_schema text;
BEGIN
    PERFORM idem__acting_role(p_role, 'idem_resolve(bigint, text, integer, jsonb, jsonb, bytea)');
    IF record_id IS NULL THEN
        RAISE EXCEPTION 'record_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF state IS NULL THEN
        RAISE EXCEPTION 'state must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM idem__check_response(http_status, body, headers, NULL, raw_body);
    IF state IN ('succeeded', 'failed', 'retryable') THEN
        new_state := state::idem_state;
    ELSE
        RAISE EXCEPTION 'invalid state "%" for idem_resolve', idem__clip(state, 32)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'An unknown record is resolved as "succeeded", "failed" or "retryable".';
    END IF;
    PERFORM idem__require_writable('resolve an idempotency record');
    any_role := idem__is_operator(p_role);
    now_ts := pg_catalog.clock_timestamp();
    BEGIN
        UPDATE idem_records AS t
           SET state = new_state, response_status = http_status,
               response_headers = headers, response_body = body,
               response_raw_body = raw_body, response_sealed = NULL,
               completed_at = now_ts, updated_at = now_ts, expires_at = now_ts + t.ttl
         WHERE t.id = idem__resolve.record_id AND t.state = 'unknown'
           AND (t.role = p_role OR any_role);
        done := FOUND;
    EXCEPTION WHEN integrity_constraint_violation THEN
        GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
            e_constraint = CONSTRAINT_NAME, e_table = TABLE_NAME,
            e_column = COLUMN_NAME, e_schema = SCHEMA_NAME;
        PERFORM idem__reraise_without_values(e_state, e_message, e_constraint,
                                             e_table, e_column, e_schema);
    END;
    IF done THEN
        IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
                PERFORM idem__outcome_written();
            END IF;
        RETURN;
    END IF;
    SELECT t.state INTO found_state FROM idem_records AS t
     WHERE t.id = idem__resolve.record_id AND (t.role = p_role OR any_role);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idempotency record % does not exist', record_id
            USING ERRCODE = 'undefined_object';
    END IF;
    RAISE EXCEPTION 'idempotency record % is not unknown', record_id
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = pg_catalog.format('Its state is "%s"; only unknown records are resolved.', found_state);
END
$$;

--
-- The public functions, inlined into the calling statement.
--
CREATE OR REPLACE FUNCTION idem_complete(
    token       text,
    http_status integer,
    body        jsonb DEFAULT NULL,
    headers     jsonb DEFAULT NULL,
    resource_id text DEFAULT NULL,
    raw_body    bytea DEFAULT NULL)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__finish(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)),
                    'idem_complete', token,
                    'succeeded', http_status, body, headers, resource_id, raw_body);

CREATE OR REPLACE FUNCTION idem_fail(
    token       text,
    http_status integer,
    body        jsonb DEFAULT NULL,
    headers     jsonb DEFAULT NULL,
    retryable   boolean DEFAULT false,
    raw_body    bytea DEFAULT NULL)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__finish(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)),
                    'idem_fail', token,
                    CASE WHEN retryable THEN 'retryable' WHEN NOT retryable THEN 'failed' END::idem_state,
                    http_status, body, headers, NULL, raw_body);

CREATE OR REPLACE FUNCTION idem_heartbeat(
    token text,
    lease interval DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__heartbeat(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)), token, lease);

CREATE OR REPLACE FUNCTION idem_checkpoint(
    token          text,
    recovery_point text)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__checkpoint(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)), token,
                        recovery_point);

CREATE OR REPLACE FUNCTION idem_resolve(
    record_id   bigint,
    state       text,
    http_status integer,
    body        jsonb DEFAULT NULL,
    headers     jsonb DEFAULT NULL,
    raw_body    bytea DEFAULT NULL)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__resolve(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)), record_id,
                     state, http_status, body, headers, raw_body);

REVOKE ALL ON FUNCTION
    idem__stale_token(regrole, bigint, integer),
    idem__token_write(regrole, record, timestamptz, text)
    FROM PUBLIC;
