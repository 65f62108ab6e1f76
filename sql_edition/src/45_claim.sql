--
-- Claims: what a request with an idempotency key gets, and the write that
-- answer needs (the C edition's src/claim.c and src/decision.c).
--
-- A claim reads the record of its scope and key and decides, in order:
--
--   1. no record                                 -> proceed (insert attempt 1)
--   2. finished record past expires_at:
--      within expires_at + tombstone_ttl         -> expired (unless on_expired => 'proceed')
--      otherwise                                 -> proceed (reuse: attempt 1)
--   3. fingerprint differs                       -> mismatch
--   4. succeeded or failed                       -> replay
--   5. retryable                                 -> proceed (attempt n+1)
--   6. unknown                                   -> unknown
--   7. processing, lease running                 -> in_progress
--   8. processing, lease ended, policy retry     -> proceed (takeover: n+1)
--   9. processing, lease ended, policy unknown   -> unknown (marked so)
--
-- Answers that need no write (replay, mismatch, in_progress, unknown,
-- expired) are one read: no lock, no subtransaction, no WAL.
--
-- A new key is inserted with INSERT ... ON CONFLICT (key, operation, caller, tenant, role) DO NOTHING: never a
-- 23505, and never two proceeds, since the unique index decides.  Before
-- it, the claim takes a transaction-level advisory lock on a 64-bit hash of
-- the scope and key (idem__key_lock_id), without waiting: a claim that
-- cannot have it meets another transaction inserting the same key and not
-- yet ended, and answers in_progress at once (or waits for that lock, no
-- longer than what is left of `wait`).  So the insert itself never waits
-- for another claim of its key, and only for what any INSERT waits for (the
-- owner's DDL, the table's file being extended), as in the C edition: an
-- answer of in_progress always means another attempt of the key.  Any role
-- may take any advisory lock, and pg_locks shows them all: a lock held by a
-- session that could not act as the claiming role is no claim of the key,
-- and the insert goes ahead without it, bounded by `wait`.  The lock
-- goes with the transaction, or with the savepoint rolled back.
--
-- One lock-table entry per new key until the transaction ends would bound
-- the keys one transaction may claim (the table holds about
-- max_locks_per_transaction x (max_connections + max_prepared_transactions)
-- for every session).  So a transaction holds the key locks of its first
-- 64 new keys only (counted in idempotency_sql.key_locks, a setting local
-- to the transaction, undone with a savepoint as the locks are); for each
-- later one it holds a shared lock on one of 128 buckets of the hashes
-- instead (at most 128 more entries), checks that no transaction holds
-- the key's own lock (a lock taken and given back at once), and inserts
-- under lock_timeout.  A claim that holds a key's lock inserts under
-- lock_timeout too when another transaction holds the key's bucket (a
-- shared lock that an exclusive one taken and given back at once finds):
-- that one may be inserting the key without its lock.  Either way, a
-- claim that meets an uncommitted row of its key waits for it no longer
-- than what is left of `wait` (1 ms when none is), and the other waits of
-- that insert are bounded the same way, but the owner's DDL (the table's
-- lock is taken first, without a bound): the table's file being extended,
-- or an owner's trigger waiting for a lock, for longer than that answers
-- in_progress.  Since the key's lock is taken before the bucket is looked
-- at, and the bucket before the key's lock is checked, one of two claims
-- of a key always sees the other (docs/editions.md).  Two scopes whose hashes
-- collide (one chance in 2^64 per pair of concurrent claims) would answer
-- in_progress to each other, never proceed twice.  The insert runs in a
-- block whose handler keeps a constraint error's DETAIL (the row's values)
-- from the client: a subtransaction per new key.  An existing
-- record is changed by an UPDATE of the version the decision was made on,
-- locked FOR UPDATE SKIP LOCKED, which never waits; a claim with time left
-- to wait then waits for the row's writer in a subtransaction rolled back
-- at once, so that it keeps no lock.  Writes find the record changed
-- rather than overwrite it, and the claim reads again: at most five rounds,
-- as in the C edition.
--
-- Under REPEATABLE READ and SERIALIZABLE, a key claimed and committed by
-- another transaction after the snapshot is a serialization failure, which
-- ON CONFLICT raises itself; a claim that would wait for a running attempt
-- answers in_progress at once, or 40001 when the record changed since the
-- snapshot (a row lock taken and given back at once tells).
--

-- SHA-256 of the empty string: the fingerprint of a claim without a
-- request, which no JSON value's canonical form has.
CREATE OR REPLACE FUNCTION idem__no_request()
RETURNS bytea
LANGUAGE sql IMMUTABLE
RETURN E'\\xe3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'::bytea;

-- The fingerprint of a claim's request, or of none: inlined into the
-- claims' expressions.
CREATE OR REPLACE FUNCTION idem__request_fingerprint(request jsonb)
RETURNS bytea
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN request IS NULL THEN idem__no_request() ELSE idem__fingerprint(request) END;

-- What a record keeps in request_text_hash: SHA-256 of its fingerprint,
-- of the database encoding's number and of its request's text as jsonb
-- prints it.  A retry sends the same request, whose text is then the
-- same, and so is its fingerprint: the claim compares this hash and does
-- not compute the canonical text again (a third of a replay's time).
-- Equal texts are equal jsonb values, which have the same canonical text
-- in one encoding; a request that is the same JSON written differently (a
-- number as 1.0 and as 1.00) prints differently, and its fingerprint is
-- computed.  The fingerprint is hashed with the text so that a hash left
-- behind when the fingerprint changed (an expired record reused by the C
-- extension, or by its owner's UPDATE) matches no request; the encoding,
-- because it orders the members of the canonical text (a record moved to
-- a database of another encoding matches no request there).  NULL for a
-- request of more than 6000 bytes, or stored compressed (read from a
-- table: its size is then the compressed size), whose text may be far
-- longer than its jsonb (a number written 1e131071 prints 131,072 digits,
-- its canonical form 9 characters): its fingerprint is computed at each
-- claim.  STABLE as textsend is, so that it is inlined.
CREATE OR REPLACE FUNCTION idem__request_text_hash(fingerprint bytea, request jsonb)
RETURNS bytea
LANGUAGE sql STABLE
RETURN CASE WHEN pg_catalog.pg_column_size(request) OPERATOR(pg_catalog.<=) 6000
                 AND pg_catalog.pg_column_compression(request) IS NULL
            THEN pg_catalog.sha256(fingerprint
                                   OPERATOR(pg_catalog.||) pg_catalog.int4send(pg_catalog.pg_char_to_encoding(pg_catalog.getdatabaseencoding()))
                                   OPERATOR(pg_catalog.||) pg_catalog.textsend(request::text)) END;

-- A response the C extension stored encrypted (response_sealed: a record
-- moved from a server where idempotency.encryption_key was set) cannot be
-- read here: its replay is refused, never answered without its body.
CREATE OR REPLACE FUNCTION idem__sealed_refusal(record_id bigint)
RETURNS bytea
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE EXCEPTION 'cannot decrypt a stored response: its key is not configured'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = pg_catalog.format('The response of idempotency record %s was encrypted by the C extension (idempotency.encryption_key), which the SQL edition cannot decrypt.', record_id),
              HINT = 'Replay it where the C extension holds its key, or store the response there again without encryption before moving the record.';
END
$$;

-- The raw body argument of idem__answer: the stored raw body, or, for a
-- sealed response, the refusal, which idem__answer evaluates only when it
-- answers replay.  Inlined: STABLE, as idem__answer is.
CREATE OR REPLACE FUNCTION idem__unsealed(record_id bigint, raw_body bytea, sealed bytea)
RETURNS bytea
LANGUAGE sql STABLE
RETURN CASE WHEN sealed IS NULL THEN raw_body ELSE idem__sealed_refusal(record_id) END;

-- What a claim answers from a record as it is (its columns, not its row
-- type: a function taking idem_records would keep its owner from adding
-- columns to the table).
CREATE OR REPLACE FUNCTION idem__answer(outcome text, id bigint, state idem_state, attempt integer,
                             recovery_point text, response_status integer,
                             response_headers jsonb, response_body jsonb, resource_id text,
                             response_raw_body bytea, locked_until timestamptz,
                             now_ts timestamptz)
RETURNS idem_decision
LANGUAGE sql STABLE
RETURN ROW(outcome, NULL, id, state, attempt, recovery_point,
           CASE outcome WHEN 'replay' THEN response_status
                        WHEN 'mismatch' THEN 422
                        WHEN 'proceed' THEN NULL
                        ELSE 409 END,
           CASE WHEN outcome = 'replay' THEN response_headers END,
           CASE WHEN outcome = 'replay' THEN response_body END,
           CASE outcome WHEN 'in_progress' THEN 'IDEMPOTENCY_REQUEST_IN_PROGRESS'
                        WHEN 'mismatch' THEN 'IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_REQUEST'
                        WHEN 'unknown' THEN 'IDEMPOTENCY_OUTCOME_UNKNOWN'
                        WHEN 'expired' THEN 'IDEMPOTENCY_KEY_EXPIRED' END,
           CASE WHEN outcome <> 'in_progress' THEN NULL
                WHEN locked_until > now_ts
                THEN LEAST(pg_catalog.ceil(extract(epoch FROM locked_until - now_ts)), 2147483647)::integer
                ELSE 1 END,
           CASE WHEN outcome = 'replay' THEN resource_id END,
           CASE WHEN outcome = 'replay' THEN response_raw_body END)::idem_decision;

-- in_progress for a key another transaction is writing right now: its
-- record is not visible yet.
CREATE OR REPLACE FUNCTION idem__answer_busy()
RETURNS idem_decision
LANGUAGE sql IMMUTABLE
RETURN ROW('in_progress', NULL, NULL, NULL, NULL, NULL, 409, NULL, NULL,
           'IDEMPOTENCY_REQUEST_IN_PROGRESS', 1, NULL, NULL)::idem_decision;

-- The advisory lock that a transaction inserting a key holds until it
-- ends: a hash of the scope and key, each part's length before it so that
-- no two scopes give the same text.
CREATE OR REPLACE FUNCTION idem__key_lock_id(p_role regrole, p_tenant text, p_caller text,
                                             p_operation text, p_key text)
RETURNS bigint
LANGUAGE sql IMMUTABLE
RETURN pg_catalog.hashtextextended(
           p_role::oid::text || ':' || pg_catalog.octet_length(p_tenant)::text || ':' || p_tenant
           || pg_catalog.octet_length(p_caller)::text || ':' || p_caller
           || pg_catalog.octet_length(p_operation)::text || ':' || p_operation || p_key,
           7212);

-- Whether the key's advisory lock is held by a session whose user could
-- not act as the role (a claim of the scope runs only in a session that
-- may), so by something that is no claim of the key: advisory locks are
-- open to every role of the database, and pg_locks shows every lock held.
-- Read only when the lock is not free.  A holder without a session (a
-- prepared transaction) may be a claim.
CREATE OR REPLACE FUNCTION idem__key_lock_foreign(key_lock bigint, p_role regrole)
RETURNS boolean
LANGUAGE sql STABLE
RETURN EXISTS (
    SELECT FROM pg_catalog.pg_locks AS l
      JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) l.pid
     WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
       AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database AS d
                                               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
       AND l.classid OPERATOR(pg_catalog.=) ((key_lock OPERATOR(pg_catalog.>>) 32) OPERATOR(pg_catalog.&) 4294967295)::oid
       AND l.objid OPERATOR(pg_catalog.=) (key_lock OPERATOR(pg_catalog.&) 4294967295)::oid
       AND l.objsubid OPERATOR(pg_catalog.=) 1
       AND a.usename IS NOT NULL
       AND NOT idem__may_become(a.usename, p_role));

-- Insert attempt 1 of a new command, or an inbox message (p_inbox:
-- succeeded at once, without token or lease).  Answers proceed; in_progress
-- when another transaction is inserting the key and has not ended by the
-- deadline; a NULL outcome when a record of the key was committed since
-- the caller's read (read it again).  The other transaction is found by
-- the key's advisory lock, or, where a bucket says it may be there, by the
-- insert, under lock_timeout: waited for no longer than the deadline (nor
-- than lock_timeout's greatest value, 2147483647 ms, for a longer wait); the
-- block's exception handler keeps a constraint error's DETAIL (the row's
-- values, the token's secret among them) from the client.
CREATE OR REPLACE FUNCTION idem__insert_new(p_role regrole, p_operation text, p_key text,
                                            p_tenant text, p_caller text, p_fingerprint bytea,
                                            p_ttl interval, p_lease_us bigint,
                                            p_deadline timestamptz, p_policy idem_lease_policy,
                                            p_inbox boolean, now_ts timestamptz,
                                            p_request_text_hash bytea)
RETURNS idem_decision
LANGUAGE plpgsql AS $$
DECLARE
    secret bytea;
    saved_timeout text := pg_catalog.current_setting('lock_timeout');
    key_lock bigint;
    unlocked boolean := false;
    key_locks integer;
    timed boolean := false;
    new_id bigint;
    same_row boolean;
    dummy text;
    e_state text;
    e_message text;
    e_constraint text;
    e_table text;
    e_column text;
    e_schema text;
BEGIN
    IF pg_catalog.current_setting('transaction_read_only') = 'on' OR pg_catalog.pg_is_in_recovery() THEN
        PERFORM idem__require_writable('claim an idempotency key');
    END IF;
    IF NOT p_inbox THEN
        secret := pg_catalog.uuid_send(pg_catalog.gen_random_uuid());
    END IF;
    key_lock := idem__key_lock_id(p_role, p_tenant, p_caller, p_operation, p_key);
    -- (a placeholder anyone may set: what is not a count counts as none)
    key_locks := coalesce(pg_catalog.substring(pg_catalog.current_setting('idempotency_sql.key_locks', true),
                                               '^[0-9]{1,9}$'), '0')::integer;
    IF key_locks >= 64
       AND pg_catalog.pg_try_advisory_xact_lock_shared(7212, (key_lock & 127)::integer)
       AND pg_catalog.pg_try_advisory_lock(key_lock) AND pg_catalog.pg_advisory_unlock(key_lock) THEN
        -- past 64 key locks: the bucket, held to the end, makes every other
        -- claim of its keys insert under lock_timeout; this one does too,
        -- since another transaction past 64 may be inserting the key
        timed := true;
    ELSIF NOT pg_catalog.pg_try_advisory_xact_lock(key_lock) THEN
        -- another transaction is inserting the key and has not ended
        -- (waited for under REPEATABLE READ too: if it commits, the insert
        -- raises 40001 as the C edition does; if it rolls back, the key is
        -- free); or a session of another role holds the lock, which must
        -- not keep this role's key from ever being claimed: then the insert
        -- goes ahead without the lock, and waits for a claim of the key
        -- that it meets no longer than what is left of wait
        IF idem__key_lock_foreign(key_lock, p_role) THEN
            unlocked := true;
        ELSIF pg_catalog.clock_timestamp() >= p_deadline THEN
            RETURN idem__answer_busy();
        ELSE
            BEGIN
                dummy := pg_catalog.set_config('lock_timeout',
                             LEAST(GREATEST(1, pg_catalog.ceil(extract(epoch FROM p_deadline - pg_catalog.clock_timestamp()) * 1000)), 2147483647)::text || 'ms',
                             true);
                PERFORM pg_catalog.pg_advisory_xact_lock(key_lock);
                dummy := pg_catalog.set_config('lock_timeout', saved_timeout, true);
            EXCEPTION
                WHEN lock_not_available THEN
                    IF NOT idem__key_lock_foreign(key_lock, p_role) THEN
                        RETURN idem__answer_busy();
                    END IF;
                    unlocked := true;
            END;
        END IF;
        -- it ended: its record, if it committed one, makes the insert do
        -- nothing, and the caller reads it
    END IF;
    IF NOT (timed OR unlocked) THEN
        -- the key lock, held until the transaction ends, is counted; a
        -- transaction holding the key's bucket may be inserting the key
        -- without its key lock: then wait for it no longer than wait
        timed := pg_catalog.set_config('idempotency_sql.key_locks', (key_locks + 1)::text, true) IS NULL
                 OR NOT (pg_catalog.pg_try_advisory_lock(7212, (key_lock & 127)::integer)
                         AND pg_catalog.pg_advisory_unlock(7212, (key_lock & 127)::integer));
    END IF;
    BEGIN
        IF unlocked OR timed THEN
            IF timed THEN
                -- (the owner's DDL waited for without a bound, as by any insert)
                LOCK TABLE idem_records IN ROW EXCLUSIVE MODE;
            END IF;
            dummy := pg_catalog.set_config('lock_timeout',
                         LEAST(GREATEST(1, pg_catalog.ceil(extract(epoch FROM p_deadline - pg_catalog.clock_timestamp()) * 1000)), 2147483647)::text || 'ms',
                         true);
        END IF;
        INSERT INTO idem_records AS t
               (role, tenant, caller, operation, key, fingerprint, request_text_hash, state, attempt,
                attempt_token, locked_until, on_lease_expiry, ttl, created_at, claimed_at,
                updated_at, completed_at, expires_at)
        VALUES (p_role, p_tenant, p_caller, p_operation, p_key, p_fingerprint, p_request_text_hash,
                CASE WHEN p_inbox THEN 'succeeded' ELSE 'processing' END::idem_state, 1,
                secret,
                CASE WHEN NOT p_inbox THEN now_ts + p_lease_us * interval '1 microsecond' END,
                p_policy, p_ttl, now_ts, now_ts, now_ts,
                CASE WHEN p_inbox THEN now_ts END, now_ts + p_ttl)
        ON CONFLICT (key, operation, caller, tenant, role) DO NOTHING
        RETURNING t.id, (t.role = p_role AND t.tenant = p_tenant AND t.caller = p_caller
                         AND t.operation = p_operation AND t.key = p_key)
             INTO new_id, same_row;
        dummy := pg_catalog.set_config('lock_timeout', saved_timeout, true);
    EXCEPTION
        WHEN lock_not_available THEN
            -- another transaction is inserting the key and has not ended
            RETURN idem__answer_busy();
        WHEN integrity_constraint_violation THEN
            GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
                e_constraint = CONSTRAINT_NAME, e_table = TABLE_NAME,
                e_column = COLUMN_NAME, e_schema = SCHEMA_NAME;
            PERFORM idem__reraise_without_values(e_state, e_message, e_constraint,
                                                 e_table, e_column, e_schema);
    END;
    IF new_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF same_row IS NOT TRUE THEN
        RAISE EXCEPTION 'a trigger on idem_records changed or skipped a new idempotency record'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A BEFORE INSERT trigger changed the record''s id, scope or key, or returned NULL; the claim''s key would not be the key written.',
                  HINT = 'Drop the trigger, or leave the id, the scope and the key of a new row as they are.';
    END IF;
    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
        PERFORM idem__outcome_written();
    END IF;
    RETURN ROW('proceed',
               CASE WHEN NOT p_inbox THEN new_id::text || '.1.' || pg_catalog.encode(secret, 'hex') END,
               new_id, 'processing', 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::idem_decision;
END
$$;

-- Claim a scope and key whose arguments are checked: read, decide, write
-- what the decision needs, answer.  p_inbox: an idem_inbox message,
-- recorded succeeded at once without token or lease.  Runs inside the
-- definer functions, as the owner of idem_records.
CREATE OR REPLACE FUNCTION idem__claim_key(p_role regrole, p_operation text, p_key text, p_tenant text,
                                p_caller text, p_fingerprint bytea, p_ttl interval,
                                p_lease_us bigint, p_wait_us bigint,
                                p_policy idem_lease_policy, p_proceed_expired boolean,
                                p_inbox boolean, p_request_text_hash bytea DEFAULT NULL)
RETURNS idem_decision
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    now_ts timestamptz := pg_catalog.clock_timestamp();
    deadline timestamptz := now_ts + p_wait_us * interval '1 microsecond';
    outcome text;
    action text;
    rounds integer := 0;
    step_ms integer := 5;
    secret bytea;
    skipped boolean := false;
    attempt_no integer;
    rp text;
    saved_timeout text;
    timeout_ms bigint;
    d idem_decision;
    e_state text;
    e_message text;
    e_constraint text;
    e_table text;
    e_column text;
    e_schema text;
BEGIN
    LOOP
        now_ts := pg_catalog.clock_timestamp();
        SELECT t.id, t.state, t.attempt, t.fingerprint, t.recovery_point, t.locked_until,
               t.on_lease_expiry, t.response_status, t.response_headers, t.response_body,
               t.resource_id, t.response_raw_body, t.response_sealed, t.expires_at
          INTO r FROM idem_records AS t
         WHERE t.key = p_key AND t.operation = p_operation AND t.caller = p_caller
           AND t.tenant = p_tenant AND t.role = p_role;
        IF NOT FOUND THEN
            IF skipped THEN
                RAISE EXCEPTION 'a trigger on idem_records changed or skipped a new idempotency record'
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = 'A BEFORE INSERT trigger changed the record''s id, scope or key, or returned NULL; the claim''s key would not be the key written.',
                          HINT = 'Drop the trigger, or leave the id, the scope and the key of a new row as they are.';
            END IF;
            outcome := 'proceed';
            action := 'insert';
        ELSIF r.state IN ('succeeded', 'failed', 'retryable') AND r.expires_at <= now_ts THEN
            IF NOT p_proceed_expired
               AND now_ts < r.expires_at
                            + idem__setting_integer('idempotency.tombstone_ttl', 604800, 0, 2147483647, 's')
                              * interval '1 second' THEN
                outcome := 'expired';
                action := 'none';
            ELSE
                outcome := 'proceed';
                action := 'reuse';
            END IF;
        ELSIF r.fingerprint <> p_fingerprint THEN
            outcome := 'mismatch';
            action := 'none';
        ELSIF r.state IN ('succeeded', 'failed') THEN
            outcome := 'replay';
            action := 'none';
        ELSIF r.state = 'retryable' THEN
            outcome := 'proceed';
            action := 'new_attempt';
        ELSIF r.state = 'unknown' THEN
            outcome := 'unknown';
            action := 'none';
        ELSIF r.locked_until > now_ts THEN
            outcome := 'in_progress';
            action := 'none';
        ELSIF r.on_lease_expiry = 'retry' THEN
            outcome := 'proceed';
            action := 'takeover';
        ELSE
            outcome := 'unknown';
            action := 'mark_unknown';
        END IF;

        -- an inbox message id held by a record only idem_claim makes
        IF p_inbox AND (action NOT IN ('none', 'insert', 'reuse') OR outcome = 'unknown') THEN
            RAISE EXCEPTION 'message id of consumer "%" is held by an idem_claim record in state "%"',
                            p_operation, r.state
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'idem_inbox records are done at once; this one was made by idem_claim with the same operation name.',
                      HINT = 'Use a consumer name that no idem_claim operation uses.';
        END IF;

        IF action = 'none' THEN
            IF outcome = 'in_progress' AND now_ts < deadline THEN
                IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
                    -- this snapshot never sees the attempt end: no waiting
                    BEGIN
                        PERFORM FROM idem_records AS t WHERE t.id = r.id FOR SHARE NOWAIT;
                        IF NOT FOUND THEN
                            RAISE EXCEPTION USING ERRCODE = 'serialization_failure';
                        END IF;
                        RAISE EXCEPTION USING ERRCODE = 'IDEM0';
                    EXCEPTION
                        WHEN lock_not_available OR sqlstate 'IDEM0' THEN
                            NULL;
                        WHEN serialization_failure THEN
                            RAISE EXCEPTION 'could not serialize access due to concurrent update'
                                USING ERRCODE = 'serialization_failure',
                                      DETAIL = 'The idempotency record changed after this transaction''s snapshot was taken.',
                                      HINT = 'Retry the transaction: it will see the record''s answer.';
                    END;
                    d := idem__answer('in_progress', r.id, r.state, r.attempt, r.recovery_point, r.response_status, r.response_headers, r.response_body, r.resource_id, idem__unsealed(r.id, r.response_raw_body, r.response_sealed), r.locked_until, now_ts);
                    d.retry_after := 1;
                    RETURN d;
                END IF;
                PERFORM pg_catalog.pg_sleep(GREATEST(1, LEAST(step_ms,
                            extract(epoch FROM LEAST(deadline, r.locked_until) - now_ts) * 1000))
                            / 1000.0);
                step_ms := LEAST(step_ms * 2, 100);
                CONTINUE;
            END IF;
            RETURN idem__answer(outcome, r.id, r.state, r.attempt, r.recovery_point, r.response_status, r.response_headers, r.response_body, r.resource_id, idem__unsealed(r.id, r.response_raw_body, r.response_sealed), r.locked_until, now_ts);
        END IF;

        -- the decision needs a write
        IF pg_catalog.current_setting('transaction_read_only') = 'on' OR pg_catalog.pg_is_in_recovery() THEN
            IF action = 'mark_unknown' THEN
                r.state := 'unknown';
                RETURN idem__answer('unknown', r.id, r.state, r.attempt, r.recovery_point, r.response_status, r.response_headers, r.response_body, r.resource_id, idem__unsealed(r.id, r.response_raw_body, r.response_sealed), r.locked_until, now_ts);
            END IF;
            PERFORM idem__require_writable('claim an idempotency key');
        END IF;

        rounds := rounds + 1;
        IF rounds > 5 AND now_ts >= deadline THEN
            RETURN idem__answer_busy();     -- the row keeps being written by others
        END IF;

        IF NOT p_inbox THEN
            secret := pg_catalog.uuid_send(pg_catalog.gen_random_uuid());
        END IF;

        IF action = 'insert' THEN
            d := idem__insert_new(p_role, p_operation, p_key, p_tenant, p_caller, p_fingerprint,
                                  p_ttl, p_lease_us, deadline, p_policy, p_inbox, now_ts,
                                  p_request_text_hash);
            IF d.outcome IS NOT NULL THEN
                RETURN d;
            END IF;
            -- a record committed since the read: read it
            skipped := true;
            CONTINUE;
        END IF;
        skipped := false;

        BEGIN
            IF action = 'mark_unknown' THEN
                UPDATE idem_records AS t
                   SET state = 'unknown', updated_at = now_ts, expires_at = now_ts + t.ttl
                 WHERE t.id = (SELECT s.id FROM idem_records AS s
                                WHERE s.id = r.id AND s.attempt = r.attempt AND s.state = 'processing'
                                  AND s.locked_until <= now_ts
                                  FOR UPDATE SKIP LOCKED);
                IF FOUND THEN
                    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
                    PERFORM idem__outcome_written();
                END IF;
                    r.state := 'unknown';
                    RETURN idem__answer('unknown', r.id, r.state, r.attempt, r.recovery_point, r.response_status, r.response_headers, r.response_body, r.resource_id, idem__unsealed(r.id, r.response_raw_body, r.response_sealed), r.locked_until, now_ts);
                END IF;
            ELSE
                -- a new command on an expired record, a takeover or a new attempt
                IF action <> 'reuse' AND r.attempt = 2147483647 THEN
                    RAISE EXCEPTION 'the idempotency record has reached the largest attempt number'
                        USING ERRCODE = 'program_limit_exceeded',
                              DETAIL = pg_catalog.format('Attempt %s was its last; no further attempt can start.', r.attempt),
                              HINT = 'The owner of idem_records can delete the record to start the command over.';
                END IF;
                attempt_no := CASE WHEN action = 'reuse' THEN 1 ELSE r.attempt + 1 END;
                IF action = 'reuse' AND idem__setting_enum('idempotency.cleanup_action', 'delete', ARRAY['delete', 'archive']) = 'archive' THEN
                    PERFORM idem__require_archive_for_reuse();
                    WITH target AS (
                        SELECT s.* FROM idem_records AS s
                         WHERE s.id = r.id AND s.state = r.state AND s.attempt = r.attempt
                           AND s.expires_at <= now_ts
                           AND (r.state <> 'processing' OR s.locked_until <= now_ts)
                           FOR UPDATE SKIP LOCKED),
                    archived AS (
                        INSERT INTO idem_records_archive
                               (id, role, tenant, caller, operation, key, fingerprint, state, attempt,
                                attempt_token, recovery_point, locked_until, on_lease_expiry, ttl,
                                response_status, response_headers, response_body, resource_id,
                                created_at, claimed_at, updated_at, completed_at, expires_at,
                                response_raw_body, response_sealed, former_role, request_text_hash,
                                archived_at)
                        SELECT o.id, o.role, o.tenant, o.caller, o.operation, o.key, o.fingerprint,
                               o.state, o.attempt, o.attempt_token, o.recovery_point, o.locked_until,
                               o.on_lease_expiry, o.ttl, o.response_status, o.response_headers,
                               o.response_body, o.resource_id, o.created_at, o.claimed_at,
                               o.updated_at, o.completed_at, o.expires_at, o.response_raw_body,
                               o.response_sealed, o.former_role, o.request_text_hash,
                               pg_catalog.clock_timestamp()
                          FROM target AS o
                         WHERE NOT EXISTS (SELECT FROM idem_records_archive AS x
                                            WHERE x.id = o.id AND x.claimed_at = o.claimed_at))
                    UPDATE idem_records AS t
                       SET fingerprint = p_fingerprint, request_text_hash = p_request_text_hash,
                           state = CASE WHEN p_inbox THEN 'succeeded' ELSE 'processing' END::idem_state,
                           attempt = 1, attempt_token = secret, recovery_point = NULL,
                           locked_until = CASE WHEN NOT p_inbox THEN now_ts + p_lease_us * interval '1 microsecond' END,
                           on_lease_expiry = p_policy, ttl = p_ttl,
                           response_status = NULL, response_headers = NULL, response_body = NULL,
                           resource_id = NULL, response_raw_body = NULL, response_sealed = NULL,
                           claimed_at = now_ts, updated_at = now_ts,
                           completed_at = CASE WHEN p_inbox THEN now_ts END,
                           expires_at = now_ts + p_ttl
                     WHERE t.id = (SELECT target.id FROM target)
                    RETURNING t.recovery_point INTO rp;
                ELSE
                    UPDATE idem_records AS t
                       SET fingerprint = p_fingerprint,
                           -- (a takeover or a new attempt keeps the fingerprint)
                           request_text_hash = coalesce(p_request_text_hash,
                                                        CASE WHEN action <> 'reuse' THEN t.request_text_hash END),
                           state = CASE WHEN p_inbox THEN 'succeeded' ELSE 'processing' END::idem_state,
                           attempt = attempt_no, attempt_token = secret,
                           recovery_point = CASE WHEN action = 'reuse' THEN NULL ELSE t.recovery_point END,
                           locked_until = CASE WHEN NOT p_inbox THEN now_ts + p_lease_us * interval '1 microsecond' END,
                           on_lease_expiry = p_policy, ttl = p_ttl,
                           response_status = NULL, response_headers = NULL, response_body = NULL,
                           resource_id = NULL, response_raw_body = NULL, response_sealed = NULL,
                           claimed_at = now_ts, updated_at = now_ts,
                           completed_at = CASE WHEN p_inbox THEN now_ts END,
                           expires_at = now_ts + p_ttl
                     WHERE t.id = (SELECT s.id FROM idem_records AS s
                                    WHERE s.id = r.id AND s.state = r.state AND s.attempt = r.attempt
                                      AND (action <> 'reuse' OR s.expires_at <= now_ts)
                                      AND (r.state <> 'processing' OR s.locked_until <= now_ts)
                                      FOR UPDATE SKIP LOCKED)
                    RETURNING t.recovery_point INTO rp;
                END IF;
                IF FOUND THEN
                    IF pg_catalog.current_setting('synchronous_commit') = 'off' THEN
                    PERFORM idem__outcome_written();
                END IF;
                    RETURN ROW('proceed',
                               CASE WHEN NOT p_inbox
                                    THEN r.id::text || '.' || attempt_no::text || '.' || pg_catalog.encode(secret, 'hex') END,
                               r.id, 'processing', attempt_no, rp, NULL, NULL, NULL, NULL, NULL, NULL,
                               NULL)::idem_decision;
                END IF;
            END IF;
        EXCEPTION
            WHEN integrity_constraint_violation THEN
                GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
                    e_constraint = CONSTRAINT_NAME, e_table = TABLE_NAME,
                    e_column = COLUMN_NAME, e_schema = SCHEMA_NAME;
                PERFORM idem__reraise_without_values(e_state, e_message, e_constraint,
                                                     e_table, e_column, e_schema);
        END;

        -- The record changed since it was read, or another transaction is
        -- writing it (a completion racing this takeover, say).  With time
        -- left, wait for that writer (a row lock taken in a subtransaction
        -- that is rolled back at once, so that nothing stays locked);
        -- without, answer in_progress if it is still at it, else read again.
        now_ts := pg_catalog.clock_timestamp();
        saved_timeout := pg_catalog.current_setting('lock_timeout');
        timeout_ms := LEAST(pg_catalog.ceil(extract(epoch FROM deadline - now_ts) * 1000), 2147483647);
        BEGIN
            IF timeout_ms > 0 THEN
                PERFORM pg_catalog.set_config('lock_timeout', timeout_ms::text || 'ms', true);
                PERFORM FROM idem_records AS t WHERE t.id = r.id FOR SHARE;
            ELSE
                PERFORM FROM idem_records AS t WHERE t.id = r.id FOR SHARE NOWAIT;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'IDEM0';
        EXCEPTION
            WHEN lock_not_available THEN
                RETURN idem__answer_busy();
            WHEN sqlstate 'IDEM0' THEN
                NULL;
        END;
    END LOOP;
END
$$;

-- The options every claim takes after its scope, checked as the C
-- edition checks them and in its order: ttl, lease, wait as microseconds
-- (NULL: the settings'), on_lease_expiry, on_expired.
CREATE OR REPLACE FUNCTION idem__claim_options(ttl interval, lease interval, wait interval,
                                    on_lease_expiry text, on_expired text,
                                    OUT ttl_value interval, OUT lease_us bigint, OUT wait_us bigint,
                                    OUT policy idem_lease_policy, OUT proceed_expired boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF ttl IS NULL THEN
        ttl_value := idem__setting_integer('idempotency.default_ttl', 86400, 1, 2147483647, 's')
                     * interval '1 second';
    ELSE
        ttl_value := ttl;
    END IF;
    PERFORM idem__interval_usecs(ttl_value, 'ttl', false);
    IF lease IS NULL THEN
        lease_us := idem__setting_integer('idempotency.default_lease', 30000, 1, 2147483647, 'ms')::bigint * 1000;
    ELSE
        lease_us := idem__interval_usecs(lease, 'lease', false);
    END IF;
    IF wait IS NULL THEN
        wait_us := idem__setting_integer('idempotency.claim_wait', 0, 0, 2147483647, 'ms')::bigint * 1000;
    ELSE
        wait_us := idem__interval_usecs(wait, 'wait', true);
    END IF;
    policy := idem__parse_policy(on_lease_expiry);
    proceed_expired := idem__parse_on_expired(on_expired);
END
$$;

-- The scope of a call: operation, key and tenant given, checked in the C
-- edition's order; the key is checked inline when it plainly passes.
CREATE OR REPLACE FUNCTION idem__check_scope(operation text, key text, tenant text)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF operation IS NULL THEN
        RAISE EXCEPTION 'operation must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF key IS NULL THEN
        RAISE EXCEPTION 'key must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF tenant IS NULL THEN
        RAISE EXCEPTION 'tenant must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF operation = '' OR operation ~ E'[\\x01-\\x1f\\x7f]'
       OR pg_catalog.octet_length(operation) > 255 THEN
        PERFORM idem__check_name(operation, 'operation', false);
    END IF;
    IF key = '' OR key ~ '[^ -~]' OR pg_catalog.octet_length(key) > 255 THEN
        PERFORM idem__check_key(key);
    END IF;
    IF tenant ~ E'[\\x01-\\x1f\\x7f]' OR pg_catalog.octet_length(tenant) > 255 THEN
        PERFORM idem__check_name(tenant, 'tenant', true);
    END IF;
    IF pg_catalog.current_setting('idempotency.max_key_length', true) <> ''
       AND pg_catalog.current_setting('idempotency.max_key_length', true) <> '255' THEN
        PERFORM idem__check_name(operation, 'operation', false);
        PERFORM idem__check_key(key);
        PERFORM idem__check_name(tenant, 'tenant', true);
    END IF;
END
$$;

-- Whether the settings a claim reads are at their defaults: never set
-- (what they are on a server without the C edition's library), reset, or
-- set to the text of the default, which is how a server that loaded that
-- library shows them.  Inlined into the claims' expressions: no call, no
-- parsing.
CREATE OR REPLACE FUNCTION idem__default_claim_settings()
RETURNS boolean
LANGUAGE sql STABLE
RETURN coalesce(pg_catalog.current_setting('idempotency.default_ttl', true), '') IN ('', '1d')
       AND coalesce(pg_catalog.current_setting('idempotency.default_lease', true), '') IN ('', '30s')
       AND coalesce(pg_catalog.current_setting('idempotency.claim_wait', true), '') IN ('', '0');

-- Whether a scope plainly passes its checks: operation, key and tenant
-- given, a key of 1 to 255 bytes of printable ASCII, names without control
-- characters within 255 bytes, idempotency.max_key_length not set or set
-- to its default (as a server that loaded the C edition's library shows
-- it).  When it does not, idem__check_scope finds the error, if any.  Inlined into
-- the claims' expressions: no call.
CREATE OR REPLACE FUNCTION idem__plain_scope(operation text, key text, tenant text)
RETURNS boolean
LANGUAGE sql STABLE
RETURN coalesce(NOT (key = '' OR pg_catalog.octet_length(key) > 255 OR key ~ '[^ -~]'
                     OR operation = '' OR pg_catalog.octet_length(operation) > 255
                     OR operation ~ E'[\\x01-\\x1f\\x7f]'
                     OR pg_catalog.octet_length(tenant) > 255 OR tenant ~ E'[\\x01-\\x1f\\x7f]'
                     OR coalesce(pg_catalog.current_setting('idempotency.max_key_length', true), '') NOT IN ('', '255')),
                false);

-- Whether the role a call passes is plainly the caller's: the session's
-- own role, which may execute the public function the call came through.
-- When it is not, idem__acting_role decides.  Inlined, as above, with the
-- check of the table (16_table.sql), which costs nothing once planned.
CREATE OR REPLACE FUNCTION idem__plain_role(role regrole, via regprocedure)
RETURNS boolean
LANGUAGE sql STABLE
RETURN idem__table_checked()
       AND coalesce(role OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(session_user))
                    AND pg_catalog.has_function_privilege(role, via, 'EXECUTE'), false);

-- A claim with every option at its default, the call every request of a
-- client library makes: one statement reads the record; the answers that
-- need no write and no wait (replay, mismatch, unknown, in_progress) are
-- made from it; a new key goes straight to its insert; anything else to
-- idem__claim_key.  The request's fingerprint is computed only when the
-- record does not hold the hash of this request's text with its own
-- fingerprint (idem__request_text_hash): a new key, a request written
-- differently, a record made otherwise.  The statement reads the columns
-- alone, and the answer is made afterwards from the outcome held in a
-- variable: PL/pgSQL compiles a statement's expressions again in each
-- transaction, and an answer made in the statement, the inlined
-- idem__answer repeating the outcome's expression at each of its uses,
-- cost a claim about as much again as the rest of the statement.
CREATE OR REPLACE FUNCTION idem__claim_plain(p_role regrole, p_operation text, p_key text,
                                             p_tenant text, p_request jsonb)
RETURNS idem_decision
LANGUAGE plpgsql AS $$
DECLARE
    now_ts timestamptz := pg_catalog.clock_timestamp();
    r record;
    fingerprint bytea;
    outcome text;
    inserted idem_decision;
BEGIN
    SELECT t.id, t.state, t.attempt, t.fingerprint, t.recovery_point, t.locked_until,
           t.response_status, t.response_headers, t.response_body, t.resource_id,
           t.response_raw_body, t.response_sealed, t.expires_at, t.request_text_hash
      INTO r
      FROM idem_records AS t
     WHERE t.key = p_key AND t.operation = p_operation AND t.caller = ''
       AND t.tenant = p_tenant AND t.role = p_role;
    -- FOUND first: a record variable that no row was ever read into has no
    -- fields to test
    IF NOT FOUND THEN
        fingerprint := idem__request_fingerprint(p_request);
        inserted := idem__insert_new(p_role, p_operation, p_key, p_tenant, '', fingerprint,
                                     interval '86400 seconds', 30000000, now_ts, 'unknown',
                                     false, now_ts, idem__request_text_hash(fingerprint, p_request));
        IF inserted.outcome IS NOT NULL THEN
            RETURN inserted;
        END IF;
    ELSE
        fingerprint := CASE WHEN r.request_text_hash = idem__request_text_hash(r.fingerprint, p_request)
                                 THEN r.fingerprint
                            ELSE idem__request_fingerprint(p_request) END;
        -- NULL: an expired record to reuse, a retryable one, a lease that
        -- ended (idem__claim_key decides)
        outcome := CASE WHEN r.state IN ('succeeded', 'failed', 'retryable') AND r.expires_at <= now_ts THEN NULL
                        WHEN r.fingerprint <> fingerprint THEN 'mismatch'
                        WHEN r.state IN ('succeeded', 'failed') THEN 'replay'
                        WHEN r.state = 'unknown' THEN 'unknown'
                        WHEN r.state = 'processing' AND r.locked_until > now_ts THEN 'in_progress' END;
        IF outcome = 'replay' AND r.response_sealed IS NULL THEN
            -- idem__answer's replay, written out: the common answer
            RETURN ROW('replay', NULL, r.id, r.state, r.attempt, r.recovery_point, r.response_status,
                       r.response_headers, r.response_body, NULL, NULL, r.resource_id,
                       r.response_raw_body)::idem_decision;
        ELSIF outcome IS NOT NULL THEN
            RETURN idem__answer(outcome, r.id, r.state, r.attempt, r.recovery_point, r.response_status,
                                r.response_headers, r.response_body, r.resource_id,
                                idem__unsealed(r.id, r.response_raw_body, r.response_sealed),
                                r.locked_until, now_ts);
        END IF;
    END IF;
    RETURN idem__claim_key(p_role, p_operation, p_key, p_tenant, '', fingerprint,
                           interval '86400 seconds', 30000000, 0, 'unknown', false, false,
                           idem__request_text_hash(fingerprint, p_request));
END
$$;

-- idem_claim's body, as the owner of idem_records.  Every claim of an
-- application runs it, so the common case is tested inline (the calling
-- role is the session's, a key of printable ASCII within the default
-- limit, settings at their defaults) and the helpers are called only to
-- find the exact error or read a setting that is set.
CREATE OR REPLACE FUNCTION idem__claim(p_role regrole, operation text, key text, request jsonb,
                                       tenant text, caller text, ttl interval, lease interval,
                                       wait interval, on_lease_expiry text, on_expired text)
RETURNS idem_decision
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    scope_caller text := '';
    ttl_value interval := ttl;
    lease_us bigint;
    wait_us bigint;
    policy idem_lease_policy;
    proceed_expired boolean;
    fingerprint bytea;
    o record;
BEGIN
    IF NOT idem__plain_role(p_role, 'idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text)') THEN
        PERFORM idem__acting_role(p_role, 'idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text)');
    END IF;
    IF NOT idem__plain_scope(operation, key, tenant) THEN
        PERFORM idem__check_scope(operation, key, tenant);
    END IF;
    IF caller IS NOT NULL THEN
        scope_caller := idem__scope_caller(p_role, caller);
    END IF;
    IF caller IS NOT NULL OR ttl IS NOT NULL OR lease IS NOT NULL OR wait IS NOT NULL
       OR on_lease_expiry IS DISTINCT FROM 'unknown' OR on_expired IS DISTINCT FROM 'reject'
       OR NOT idem__default_claim_settings() THEN
        o := idem__claim_options(ttl, lease, wait, on_lease_expiry, on_expired);
        fingerprint := idem__request_fingerprint(request);
        RETURN idem__claim_key(p_role, operation, key, tenant, scope_caller, fingerprint,
                               o.ttl_value, o.lease_us, o.wait_us, o.policy, o.proceed_expired,
                               false, idem__request_text_hash(fingerprint, request));
    END IF;
    RETURN idem__claim_plain(p_role, operation, key, tenant, request);
END
$$;

-- idem_claim_text's body: the request's text read as jsonb reads it (its
-- errors first, as idem_claim's cast), every option at its default.
CREATE OR REPLACE FUNCTION idem__claim_text(p_role regrole, operation text, key text,
                                            request text, tenant text)
RETURNS idem_decision
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    doc jsonb := request::jsonb;
    fingerprint bytea;
    o record;
BEGIN
    IF NOT idem__plain_role(p_role, 'idem_claim_text(text, text, text, text)') THEN
        PERFORM idem__acting_role(p_role, 'idem_claim_text(text, text, text, text)');
    END IF;
    IF NOT idem__plain_scope(operation, key, tenant) THEN
        PERFORM idem__check_scope(operation, key, tenant);
    END IF;
    IF NOT idem__default_claim_settings() THEN
        o := idem__claim_options(NULL, NULL, NULL, 'unknown', 'reject');
        fingerprint := idem__request_fingerprint(doc);
        RETURN idem__claim_key(p_role, operation, key, tenant, '', fingerprint,
                               o.ttl_value, o.lease_us, o.wait_us, 'unknown', false, false,
                               idem__request_text_hash(fingerprint, doc));
    END IF;
    RETURN idem__claim_plain(p_role, operation, key, tenant, doc);
END
$$;

-- The items of idem_claim_many: a one-dimensional array without NULLs (a
-- NULL array is refused like a NULL key); returns how many.
CREATE OR REPLACE FUNCTION idem__check_items(items anyarray, name text)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF items IS NULL THEN
        RAISE EXCEPTION '% must not be null', name USING ERRCODE = 'null_value_not_allowed';
    ELSIF pg_catalog.array_ndims(items) > 1 THEN
        RAISE EXCEPTION '% must be a one-dimensional array', name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('The array given has %s dimensions.', pg_catalog.array_ndims(items));
    ELSIF pg_catalog.array_position(items, NULL) IS NOT NULL THEN
        RAISE EXCEPTION '% must not contain NULL', name
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = pg_catalog.format('Element %s is NULL.',
                                             pg_catalog.array_position(items, NULL) - pg_catalog.array_lower(items, 1) + 1);
    END IF;
    RETURN coalesce(pg_catalog.cardinality(items), 0);
END
$$;

-- idem_claim_many's body: every key and request checked before the first
-- claim; one claim per item in input order; wait bounds the whole call; a
-- key repeated within the call is claimed again without waiting.
CREATE OR REPLACE FUNCTION idem__claim_many(p_role regrole, operation text, keys text[], requests jsonb[],
                                 tenant text, caller text, ttl interval, lease interval,
                                 wait interval, on_lease_expiry text, on_expired text)
RETURNS TABLE (key text, outcome text, token text, record_id bigint, state idem_state,
               attempt integer, recovery_point text, http_status integer, headers jsonb,
               body jsonb, error_code text, retry_after integer, resource_id text,
               raw_body bytea)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    scope_caller text;
    o record;
    n integer;
    fingerprints bytea[];
    seen text[];
    deadline timestamptz;
    d idem_decision;
    i integer;
    first_pos jsonb := '{}';
BEGIN
    PERFORM idem__acting_role(p_role, 'idem_claim_many(text, text[], jsonb[], text, text, interval, interval, interval, text, text)');
    IF operation IS NULL THEN
        RAISE EXCEPTION 'operation must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF tenant IS NULL THEN
        RAISE EXCEPTION 'tenant must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM idem__check_name(operation, 'operation', false);
    PERFORM idem__check_name(tenant, 'tenant', true);
    scope_caller := idem__scope_caller(p_role, caller);
    n := idem__check_items(keys, 'keys');
    IF requests IS NOT NULL THEN
        IF idem__check_items(requests, 'requests') <> n THEN
            RAISE EXCEPTION 'keys and requests must have the same number of elements'
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = pg_catalog.format('keys has %s elements, requests has %s.',
                                                 n, coalesce(pg_catalog.cardinality(requests), 0));
        END IF;
        -- the arrays are read by position from 1: a slice is numbered
        -- from 1 whatever the array's lower bound (array_cat with an
        -- empty array returns the array as it is)
        requests := requests[:];
    END IF;
    keys := keys[:];
    o := idem__claim_options(ttl, lease, wait, on_lease_expiry, on_expired);

    fingerprints := pg_catalog.array_fill(NULL::bytea, ARRAY[GREATEST(n, 1)]);
    FOR i IN 1 .. n LOOP
        PERFORM idem__check_key(keys[i]);
        fingerprints[i] := idem__request_fingerprint(requests[i]);
    END LOOP;

    deadline := pg_catalog.clock_timestamp() + o.wait_us * interval '1 microsecond';
    FOR i IN 1 .. n LOOP
        d := idem__claim_key(p_role, operation, keys[i], tenant, scope_caller, fingerprints[i],
                             o.ttl_value, o.lease_us,
                             CASE WHEN first_pos ? keys[i] THEN 0
                                  ELSE GREATEST(0, (extract(epoch FROM deadline - pg_catalog.clock_timestamp()) * 1000000)::bigint) END,
                             o.policy, o.proceed_expired, false,
                             idem__request_text_hash(fingerprints[i], requests[i]));
        first_pos := first_pos || pg_catalog.jsonb_build_object(keys[i], i);
        key := keys[i];
        outcome := d.outcome; token := d.token; record_id := d.record_id; state := d.state;
        attempt := d.attempt; recovery_point := d.recovery_point; http_status := d.http_status;
        headers := d.headers; body := d.body; error_code := d.error_code;
        retry_after := d.retry_after; resource_id := d.resource_id; raw_body := d.raw_body;
        RETURN NEXT;
    END LOOP;
END
$$;

-- idem_inbox's body: a consumer's message id recorded succeeded at once, in
-- the consumer's transaction.
CREATE OR REPLACE FUNCTION idem__inbox(p_role regrole, consumer text, message_id text, message jsonb,
                            ttl interval)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    fingerprint bytea;
    ttl_value interval;
    d idem_decision;
    stored bytea;
BEGIN
    PERFORM idem__acting_role(p_role, 'idem_inbox(text, text, jsonb, interval)');
    IF consumer IS NULL THEN
        RAISE EXCEPTION 'consumer must not be null' USING ERRCODE = 'null_value_not_allowed';
    ELSIF message_id IS NULL THEN
        RAISE EXCEPTION 'message_id must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM idem__check_name(consumer, 'consumer', false);
    PERFORM idem__check_key(message_id);
    fingerprint := idem__request_fingerprint(message);
    ttl_value := coalesce(ttl, idem__setting_integer('idempotency.default_ttl', 86400, 1, 2147483647, 's')
                               * interval '1 second');
    PERFORM idem__interval_usecs(ttl_value, 'ttl', false);
    d := idem__claim_key(p_role, consumer, message_id, '', '', fingerprint, ttl_value, 0,
                         idem__setting_integer('idempotency.claim_wait', 0, 0, 2147483647, 'ms')::bigint * 1000,
                         'unknown', false, true, idem__request_text_hash(fingerprint, message));
    IF d.outcome = 'expired' THEN
        -- a tombstone keeps the fingerprint: a different message is a mismatch
        SELECT r.fingerprint INTO stored FROM idem_records AS r WHERE r.id = d.record_id;
        IF stored IS DISTINCT FROM fingerprint THEN
            RETURN 'mismatch';
        END IF;
        RETURN 'duplicate';
    END IF;
    RETURN CASE d.outcome WHEN 'proceed' THEN 'proceed'
                          WHEN 'replay' THEN 'duplicate'
                          WHEN 'in_progress' THEN 'in_progress'
                          WHEN 'mismatch' THEN 'mismatch' END;
END
$$;

-- idem_replay's body: what a claim would answer, without a request and
-- without writing; a tombstone shows as expired; no row when there is no
-- record or it is past the tombstone window.
CREATE OR REPLACE FUNCTION idem__replay(p_role regrole, operation text, key text, tenant text, caller text)
RETURNS SETOF idem_decision
LANGUAGE plpgsql STABLE SECURITY DEFINER ROWS 1 AS $$
DECLARE
    r record;
    now_ts timestamptz := pg_catalog.clock_timestamp();
    scope_caller text;
BEGIN
    PERFORM idem__acting_role(p_role, 'idem_replay(text, text, text, text)');
    PERFORM idem__check_scope(operation, key, tenant);
    scope_caller := idem__scope_caller(p_role, caller);
    SELECT t.id, t.state, t.attempt, t.fingerprint, t.recovery_point, t.locked_until,
               t.on_lease_expiry, t.response_status, t.response_headers, t.response_body,
               t.resource_id, t.response_raw_body, t.response_sealed, t.expires_at
          INTO r FROM idem_records AS t
     WHERE t.key = idem__replay.key AND t.operation = idem__replay.operation
       AND t.caller = scope_caller AND t.tenant = idem__replay.tenant AND t.role = p_role;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.state IN ('succeeded', 'failed', 'retryable') AND r.expires_at <= now_ts THEN
        IF now_ts < r.expires_at + idem__setting_integer('idempotency.tombstone_ttl', 604800, 0, 2147483647, 's')
                                   * interval '1 second' THEN
            RETURN NEXT idem__answer('expired', r.id, r.state, r.attempt, r.recovery_point, r.response_status, r.response_headers, r.response_body, r.resource_id, idem__unsealed(r.id, r.response_raw_body, r.response_sealed), r.locked_until, now_ts);
        END IF;
        RETURN;
    END IF;
    RETURN NEXT idem__answer(CASE WHEN r.state IN ('succeeded', 'failed') THEN 'replay'
                                  WHEN r.state = 'retryable' THEN 'proceed'
                                  WHEN r.state = 'unknown' THEN 'unknown'
                                  WHEN r.locked_until > now_ts THEN 'in_progress'
                                  WHEN r.on_lease_expiry = 'retry' THEN 'proceed'
                                  ELSE 'unknown' END,
                             r.id, r.state, r.attempt, r.recovery_point, r.response_status,
                             r.response_headers, r.response_body, r.resource_id,
                             idem__unsealed(r.id, r.response_raw_body, r.response_sealed),
                             r.locked_until, now_ts);
END
$$;

--
-- The public functions: each passes the calling role to its body.  They
-- are inlined into the calling statement (LANGUAGE sql, one expression, no
-- SET clause), so the wrapper costs nothing.
--
CREATE OR REPLACE FUNCTION idem_claim(
    operation       text,
    key             text,
    request         jsonb DEFAULT NULL,
    tenant          text DEFAULT '',
    caller          text DEFAULT NULL,
    ttl             interval DEFAULT NULL,
    lease           interval DEFAULT NULL,
    wait            interval DEFAULT NULL,
    on_lease_expiry text DEFAULT 'unknown',
    on_expired      text DEFAULT 'reject')
RETURNS idem_decision
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__claim(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)), operation, key,
                   request, tenant, caller, ttl, lease, wait, on_lease_expiry, on_expired);

COMMENT ON FUNCTION idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text) IS
    'Claim an idempotency key: proceed, replay, in_progress, mismatch, unknown or expired';

CREATE OR REPLACE FUNCTION idem_claim_text(
    operation text,
    key       text,
    request   text,
    tenant    text DEFAULT '')
RETURNS idem_decision
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__claim_text(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)), operation,
                        key, request, tenant);

COMMENT ON FUNCTION idem_claim_text(text, text, text, text) IS
    'Claim an idempotency key with a request given as JSON text and the default options: idem_claim''s answer';

CREATE OR REPLACE FUNCTION idem_claim_many(
    operation       text,
    keys            text[],
    requests        jsonb[] DEFAULT NULL,
    tenant          text DEFAULT '',
    caller          text DEFAULT NULL,
    ttl             interval DEFAULT NULL,
    lease           interval DEFAULT NULL,
    wait            interval DEFAULT NULL,
    on_lease_expiry text DEFAULT 'unknown',
    on_expired      text DEFAULT 'reject')
RETURNS TABLE (
    key            text,
    outcome        text,
    token          text,
    record_id      bigint,
    state          idem_state,
    attempt        integer,
    recovery_point text,
    http_status    integer,
    headers        jsonb,
    body           jsonb,
    error_code     text,
    retry_after    integer,
    resource_id    text,
    raw_body       bytea)
LANGUAGE sql VOLATILE PARALLEL UNSAFE ROWS 100
BEGIN ATOMIC
    SELECT * FROM idem__claim_many(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)),
                                   operation, keys, requests, tenant, caller, ttl, lease, wait,
                                   on_lease_expiry, on_expired);
END;

COMMENT ON FUNCTION idem_claim_many(text, text[], jsonb[], text, text, interval, interval, interval, text, text) IS
    'Claim many idempotency keys at once: one decision per key, in input order';

CREATE OR REPLACE FUNCTION idem_inbox(
    consumer   text,
    message_id text,
    message    jsonb DEFAULT NULL,
    ttl        interval DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN idem__inbox(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)), consumer,
                   message_id, message, ttl);

COMMENT ON FUNCTION idem_inbox(text, text, jsonb, interval) IS
    'Record a consumed message id: proceed, duplicate, in_progress or mismatch';

CREATE OR REPLACE FUNCTION idem_replay(
    operation text,
    key       text,
    tenant    text DEFAULT '',
    caller    text DEFAULT NULL)
RETURNS SETOF idem_decision
LANGUAGE sql STABLE PARALLEL RESTRICTED ROWS 1
BEGIN ATOMIC
    SELECT * FROM idem__replay(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)),
                               operation, key, tenant, caller);
END;

-- Only the definer functions run these, as the owner of idem_records.
REVOKE ALL ON FUNCTION
    idem__claim_key(regrole, text, text, text, text, bytea, interval, bigint, bigint,
                    idem_lease_policy, boolean, boolean, bytea),
    idem__claim_plain(regrole, text, text, text, jsonb),
    idem__insert_new(regrole, text, text, text, text, bytea, interval, bigint, timestamptz,
                     idem_lease_policy, boolean, timestamptz, bytea)
    FROM PUBLIC;
