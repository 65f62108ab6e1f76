--
-- The records guard: every INSERT and UPDATE of idem_records obeys the state
-- machine, whoever runs it, the table owner's raw statements included.  The
-- same transition table as the C edition's (src/state_machine.c), refused
-- with the same SQLSTATE (23514) and messages:
--
--   from \ to    processing                  succeeded  failed  retryable  unknown
--   (insert)     attempt 1                   -          -       -          -
--   processing   heartbeat, or takeover      complete   fail    fail/lease lease
--                (attempt+1, lease ended)
--   retryable    new attempt (attempt+1),    -          -       -          -
--                or reuse once expired
--   unknown      -                           resolve    resolve resolve    -
--   succeeded,   reuse once expired          -          -       -          -
--   failed       (attempt 1)
--
-- A record is born processing at attempt 1, or succeeded at attempt 1
-- without a response (idem_inbox), except when a top-level COPY ... FROM
-- loads it (how psql and pg_restore bring back dumped records).  Role,
-- scope, key, id and created_at never change; the fingerprint changes only
-- when an expired record is reused.  Keeping a finished or unknown state is
-- not a transition (an operator extending expires_at).
--
CREATE OR REPLACE FUNCTION idem_records_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    from_state idem_state;
    to_state idem_state;
    expired boolean;
    finished_from boolean;
    archive regclass;
    detail text;
BEGIN
    -- no write while a statement copies the table to new storage, which
    -- would lose it (16_table.sql)
    IF pg_catalog.to_regclass(pg_catalog.format('%I.%I', TG_TABLE_SCHEMA, 'pg_temp_' || TG_RELID::text))
       IS NOT NULL THEN
        PERFORM idem__refuse_write_during_rewrite(TG_RELID);
    END IF;
    -- the writes of the idem_* functions, in one test each: a new attempt 1
    -- processing (or an inbox record); a write of a processing attempt that
    -- keeps its attempt, fingerprint, scope, key, id and created_at
    IF TG_OP = 'INSERT' THEN
        IF NEW.attempt = 1 AND NEW.state = 'processing' THEN
            RETURN NEW;
        END IF;
    ELSIF OLD.state = 'processing' AND NEW.attempt = OLD.attempt
          AND NEW.fingerprint = OLD.fingerprint AND NEW.role IS NOT DISTINCT FROM OLD.role
          AND NEW.key = OLD.key AND NEW.operation = OLD.operation AND NEW.caller = OLD.caller
          AND NEW.tenant = OLD.tenant AND NEW.id = OLD.id AND NEW.created_at = OLD.created_at
          AND NEW.state IS NOT NULL THEN
        RETURN NEW;
    END IF;
    IF NEW.state IS NULL OR NEW.attempt IS NULL THEN
        RETURN NEW;                 -- the NOT NULL constraints report it
    END IF;

    IF TG_OP = 'INSERT' THEN
        IF (NEW.attempt <> 1
            OR (NEW.state <> 'processing'
                AND NOT (NEW.state = 'succeeded' AND NEW.response_status IS NULL
                         AND NEW.attempt_token IS NULL AND NEW.locked_until IS NULL)))
           AND pg_catalog.current_query() !~* E'^\\s*copy\\s' THEN
            RAISE EXCEPTION 'invalid new idempotency record'
                USING ERRCODE = 'check_violation',
                      DETAIL = pg_catalog.format('A record is created in state "processing" at attempt 1 (or "succeeded" without a response, by idem_inbox), not in state "%s" at attempt %s.',
                                                 NEW.state, NEW.attempt),
                      HINT = 'Create records with idem_claim() or idem_inbox().';
        END IF;
        RETURN NEW;
    END IF;

    -- the scope and key, in the order of the C edition's checks
    IF NEW.role IS DISTINCT FROM OLD.role THEN
        detail := 'role';
    ELSIF NOT (NEW.tenant IS NOT NULL AND NEW.tenant = OLD.tenant) THEN
        detail := 'tenant';
    ELSIF NOT (NEW.caller IS NOT NULL AND NEW.caller = OLD.caller) THEN
        detail := 'caller';
    ELSIF NOT (NEW.operation IS NOT NULL AND NEW.operation = OLD.operation) THEN
        detail := 'operation';
    ELSIF NOT (NEW.key IS NOT NULL AND NEW.key = OLD.key) THEN
        detail := 'key';
    END IF;
    IF detail IS NOT NULL THEN
        RAISE EXCEPTION 'the scope and key of an idempotency record cannot change'
            USING ERRCODE = 'check_violation',
                  DETAIL = pg_catalog.format('Column "%s" was changed.', detail);
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'the id and created_at of an idempotency record cannot change'
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.fingerprint IS NULL THEN
        RETURN NEW;                 -- the NOT NULL constraint reports it
    END IF;

    from_state := OLD.state;
    to_state := NEW.state;
    expired := OLD.expires_at <= pg_catalog.clock_timestamp();
    finished_from := from_state IN ('succeeded', 'failed', 'retryable');
    IF finished_from AND expired THEN
        -- a reuse, which may copy the record to the archive first
        archive := pg_catalog.to_regclass(pg_catalog.format('%I.idem_records_archive', TG_TABLE_SCHEMA));
        IF archive IS NOT NULL THEN
            PERFORM idem__refuse_write_during_rewrite(archive);
        END IF;
    END IF;

    -- an expired record reused by idem_inbox: done at once, attempt 1
    IF to_state = 'succeeded' AND finished_from AND expired AND NEW.attempt = 1
       AND NEW.response_status IS NULL AND NEW.attempt_token IS NULL
       AND NEW.locked_until IS NULL THEN
        RETURN NEW;
    END IF;

    IF from_state = to_state AND from_state <> 'processing' THEN
        -- keeping a finished or unknown state is not a transition
        IF NEW.attempt <> OLD.attempt THEN
            detail := 'The attempt number changes only when a new attempt starts.';
        ELSIF NEW.fingerprint <> OLD.fingerprint THEN
            detail := 'The fingerprint changes only when an expired record is reused.';
        END IF;
    ELSIF NOT (from_state = 'processing'
               OR (finished_from AND to_state = 'processing')
               OR (from_state = 'unknown' AND to_state IN ('succeeded', 'failed', 'retryable'))) THEN
        detail := pg_catalog.format('A record in state "%s" cannot move to state "%s".',
                                    from_state, to_state);
    ELSIF to_state = 'processing' AND from_state <> 'processing' AND expired AND finished_from THEN
        -- an expired record reused for a new command, or a retryable one
        -- that just expired getting its new attempt
        IF NEW.attempt <> 1
           AND (from_state <> 'retryable' OR NEW.fingerprint <> OLD.fingerprint
                OR NEW.attempt::bigint <> OLD.attempt::bigint + 1) THEN
            detail := 'A reused record starts again at attempt 1.';
        END IF;
    ELSIF NEW.fingerprint <> OLD.fingerprint THEN
        detail := 'The fingerprint changes only when an expired record is reused.';
    ELSIF to_state = 'processing' AND from_state = 'processing' THEN
        IF NEW.attempt <> OLD.attempt THEN
            IF NEW.attempt::bigint <> OLD.attempt::bigint + 1 THEN
                detail := pg_catalog.format('A takeover starts attempt %s.', OLD.attempt::bigint + 1);
            ELSIF OLD.locked_until IS NOT NULL
                  AND OLD.locked_until > pg_catalog.clock_timestamp() THEN
                detail := pg_catalog.format('The lease of attempt %s has not ended.', OLD.attempt);
            END IF;
        END IF;
    ELSIF to_state = 'processing' THEN
        IF from_state <> 'retryable' THEN
            detail := pg_catalog.format('A "%s" record can be claimed again only after it expires.',
                                        from_state);
        ELSIF NEW.attempt::bigint <> OLD.attempt::bigint + 1 THEN
            detail := pg_catalog.format('A new attempt is attempt %s.', OLD.attempt::bigint + 1);
        END IF;
    ELSIF NEW.attempt <> OLD.attempt THEN
        detail := 'The attempt number changes only when a new attempt starts.';
    END IF;

    IF detail IS NOT NULL THEN
        RAISE EXCEPTION 'invalid idempotency record transition from "%" to "%"', from_state, to_state
            USING ERRCODE = 'check_violation',
                  DETAIL = detail,
                  HINT = 'Change records through the idem_* functions.';
    END IF;
    RETURN NEW;
END
$guard$;

CREATE OR REPLACE TRIGGER idem_records_guard
    BEFORE INSERT OR UPDATE ON idem_records
    FOR EACH ROW EXECUTE FUNCTION idem_records_guard();
