--
-- Maintenance: the C extension's two passes over idem_records (lease
-- expiry; cleanup, which deletes, and purge, which makes tombstones), as
-- idem_expire_leases() and idem_cleanup() with the C signatures and
-- answers, and idem_maintenance(), the procedure that pg_cron CALLs in
-- place of the background worker.  See docs/worker.md for what each pass
-- does; what differs is said in sql_edition/README.md.
--
-- Each batch is one statement that picks at most N rows in index order
-- with FOR UPDATE SKIP LOCKED and changes them: a row that a claim holds is
-- skipped, never waited for, and a row that a claim reused meanwhile is
-- rechecked against the conditions before it is picked.  A batch that
-- fails on a row is redone row by row, each row in a subtransaction of its
-- own; a row that fails, or that a trigger keeps unchanged, is skipped with
-- a WARNING naming its id and its key's hash prefix (never the key), and
-- left out of the rest of the run, so that it never holds the others back.
--
-- These run with the caller's privileges, as the C functions do: the role
-- that runs them needs UPDATE and DELETE on idem_records (and INSERT and
-- SELECT on idem_records_archive to archive).
--

-- The key's name in messages: the first 8 hex digits of its SHA-256, as
-- the application computes it too.
CREATE OR REPLACE FUNCTION idem__key_hash_prefix(key text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT left(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 8) $$;

-- message with every occurrence of the key, as it is or written as
-- quote_literal, an identifier, a row's field or a JSON string writes it,
-- replaced by "<key PREFIX>": a trigger or a constraint of the owner's may
-- quote the key in its error.  Longest form first: a shorter one may be
-- part of a longer one.
CREATE OR REPLACE FUNCTION idem__redact_key(message text, key text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    form text;
    result text := message;
BEGIN
    IF key = '' THEN
        RETURN message;
    END IF;
    FOR form IN
        SELECT f.form
          FROM (SELECT DISTINCT ON (v.form) v.form, v.n
                  FROM unnest(ARRAY[
                           key,
                           replace(replace(key, E'\\', E'\\\\'), '''', ''''''),   -- quote_literal
                           replace(key, '''', ''''''),                       -- a literal
                           replace(replace(key, E'\\', E'\\\\'), '"', '""'),      -- a row's field
                           replace(key, '"', '""'),                          -- an identifier
                           replace(replace(key, E'\\', E'\\\\'), '"', E'\\"')       -- an array element, JSON
                       ]) WITH ORDINALITY AS v(form, n)
                 ORDER BY v.form, v.n) AS f
         ORDER BY length(f.form) DESC, f.n
    LOOP
        result := replace(result, form, '<key ' || idem__key_hash_prefix(key) || '>');
    END LOOP;
    RETURN result;
END
$$;

-- The statements of a pass, taking ($1 timestamptz cutoff, $2 integer
-- limit, $3 bigint[] ids, $4 timestamptz cleanup cutoff, which only purge
-- reads):
--   batch: change at most $2 rows, leaving out the ids $3;
--   pick:  lock and return the ids the batch would change;
--   one:   change the rows whose ids are $3 (picked and locked already).
-- batch and one answer two arrays: the ids changed, and the ids written as
-- due as before (a BEFORE UPDATE trigger returned OLD), which count as
-- kept.  ARRAY(...) makes the locking sub-select run once, whatever the
-- plan; the outer statement then finds its rows by primary key.  With
-- archive, the same statement first copies each record to the archive,
-- unless the archive holds its command already (same id and claimed_at).
CREATE OR REPLACE FUNCTION idem__pass_sql(pass text, kind text, archive boolean)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    -- idem_records_unpurged's predicate, word for word, so that the
    -- planner uses the index
    holds constant text :=
        '(%1$s.response_headers IS NOT NULL OR %1$s.response_body IS NOT NULL'
        ' OR %1$s.response_raw_body IS NOT NULL OR %1$s.response_sealed IS NOT NULL'
        ' OR %1$s.resource_id IS NOT NULL)';
    columns constant text :=
        'id, role, tenant, caller, operation, key, fingerprint, state,'
        ' attempt, attempt_token, recovery_point, locked_until,'
        ' on_lease_expiry, ttl, response_status, response_headers,'
        ' response_body, resource_id, created_at, claimed_at, updated_at,'
        ' completed_at, expires_at, response_raw_body, response_sealed, former_role,'
        ' request_text_hash';
    action text;
    selection text;
    one_ids text := '$3';
    kept text;
    ids text;
    copy text := '';
BEGIN
    IF pass = 'lease expiry' THEN
        action := 'UPDATE idem_records AS r'
               || '   SET state = CASE WHEN r.on_lease_expiry = ''retry'''
               || '                    THEN ''retryable''::idem_state'
               || '                    ELSE ''unknown''::idem_state END,'
               || '       updated_at = $1, expires_at = $1 + r.ttl'
               || ' WHERE r.id = ANY ';
        selection := 'SELECT l.id FROM idem_records AS l'
               || ' WHERE l.state = ''processing'''
               || '   AND l.locked_until < $1'
               || '   AND l.id <> ALL ($3)'
               || ' ORDER BY l.locked_until LIMIT $2 FOR UPDATE SKIP LOCKED';
        kept := 'r.state = ''processing''';
        archive := false;
    ELSIF pass = 'cleanup' THEN
        action := 'DELETE FROM idem_records AS r WHERE r.id = ANY ';
        selection := 'SELECT c.id FROM idem_records AS c'
               || ' WHERE c.state = ANY (''{succeeded,failed,retryable}''::idem_state[])'
               || '   AND c.expires_at < $1'
               || '   AND c.id <> ALL ($3)'
               || ' ORDER BY c.expires_at LIMIT $2 FOR UPDATE SKIP LOCKED';
        kept := 'false';
    ELSIF pass = 'purge' THEN
        -- updated_at stays: a tombstone keeps the record's timestamps
        action := 'UPDATE idem_records AS r'
               || '   SET response_headers = NULL, response_body = NULL,'
               || '       response_raw_body = NULL, response_sealed = NULL,'
               || '       resource_id = NULL'
               || ' WHERE r.id = ANY ';
        -- records past the cleanup cutoff are left to cleanup: rewriting
        -- them just before they are deleted would be lost work
        selection := 'SELECT p.id FROM idem_records AS p'
               || ' WHERE p.state = ANY (''{succeeded,failed,retryable}''::idem_state[])'
               || '   AND ' || format(holds, 'p')
               || '   AND p.expires_at < $1'
               || '   AND p.expires_at >= $4'
               || '   AND p.id <> ALL ($3)'
               || ' ORDER BY p.expires_at LIMIT $2 FOR UPDATE SKIP LOCKED';
        -- also purges a record whose deletion cleanup skipped, and never
        -- rewrites a tombstone
        one_ids := 'ARRAY(SELECT o.id FROM idem_records AS o'
               || ' WHERE o.id = ANY ($3) AND ' || format(holds, 'o') || ')';
        kept := format(holds, 'r');
    ELSE
        RAISE EXCEPTION 'unknown maintenance pass "%"', pass;
    END IF;

    IF kind = 'pick' THEN
        RETURN 'SELECT ARRAY(' || selection || ')';
    END IF;
    ids := CASE kind WHEN 'batch' THEN 'ARRAY(' || selection || ')' ELSE one_ids END;
    IF archive THEN
        copy := 'ids AS (SELECT ' || ids || ' AS a),'
             || ' archived AS (INSERT INTO idem_records_archive (' || columns || ', archived_at)'
             || '  SELECT ' || columns || ', clock_timestamp() FROM idem_records AS o'
             || '   WHERE o.id = ANY ((SELECT a FROM ids)::int8[])'
             || '     AND NOT EXISTS (SELECT FROM idem_records_archive AS x'
             || '                      WHERE x.id = o.id AND x.claimed_at = o.claimed_at)),';
        ids := '(SELECT a FROM ids)::int8[]';
    END IF;
    RETURN 'WITH ' || copy
        || ' done AS (' || action || '(' || ids || ') RETURNING r.id, ' || kept || ' AS kept)'
        || ' SELECT coalesce(array_agg(id) FILTER (WHERE NOT kept), ''{}''),'
        || '        coalesce(array_agg(id) FILTER (WHERE kept), ''{}'') FROM done';
END
$$;

-- Whether an error may come from the rows a statement touched (bad data, a
-- constraint, a trigger), so that doing the rows one by one can tell the
-- bad ones from the good.  A cancel, a timeout, a deadlock, a missing
-- privilege or object, a lack of resources are no row's fault: they end
-- the pass as they are.
CREATE OR REPLACE FUNCTION idem__error_concerns_rows(sqlstate text)
RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT left(sqlstate, 2) NOT IN ('08', '40', '42', '53', '54', '55', '57', '58', 'XX')
$$;

-- Report a record a pass could not change (err_message NULL: its statement
-- left it unchanged without an error), after cleanup made it a tombstone
-- if it can (so that it does not keep its response while its deletion is
-- tried again).  Returns how many records became tombstones (0 or 1).
CREATE OR REPLACE FUNCTION idem__pass_skip(
    pass text, record_id bigint, err_state text, err_message text,
    archive boolean, tombstones boolean)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    record_key text;
    message text;
    purged_ids bigint[] := '{}';
    kept_ids bigint[] := '{}';
    tombstone boolean := false;
BEGIN
    IF pass = 'cleanup' AND tombstones THEN
        BEGIN
            EXECUTE idem__pass_sql('purge', 'one', archive)
               INTO purged_ids, kept_ids
              USING NULL::timestamptz, 1, ARRAY[record_id], NULL::timestamptz;
            tombstone := cardinality(kept_ids) = 0;
        EXCEPTION WHEN OTHERS THEN
            IF NOT idem__error_concerns_rows(SQLSTATE) THEN
                RAISE;
            END IF;
        END;
    END IF;

    SELECT r.key INTO record_key FROM idem_records AS r WHERE r.id = record_id;
    message := CASE
        WHEN err_message IS NULL
            THEN 'its statement left it unchanged (a trigger may have kept it)'
        WHEN record_key IS NOT NULL THEN idem__redact_key(err_message, record_key)
        ELSE err_message END;
    RAISE WARNING 'idempotency % skipped record % (key hash %): %',
                  pass, record_id, coalesce(idem__key_hash_prefix(record_key), '-'), message
        USING ERRCODE = coalesce(err_state, '01000'),
              DETAIL = CASE WHEN tombstone
                  THEN 'The record is kept as a tombstone, its response purged, and its deletion tried again by the next pass; the other records are processed.'
                  ELSE 'The record is left as it is and tried again by the next pass; the other records are processed.' END;
    RETURN cardinality(purged_ids);
END
$$;

--
-- One batch of a pass ('lease expiry', 'cleanup' or 'purge'): change at
-- most batch_limit rows, leaving out the records the run skipped so far
-- (skipped, which comes back with the records this batch skipped added).
-- changed: rows changed; purged: records cleanup could not delete and made
-- tombstones; more: whether the batch found batch_limit rows to work on
-- (changed or skipped), so that another batch may find more.  The settings
-- are read at every batch.
--
CREATE OR REPLACE FUNCTION idem__pass_batch(
    pass        text,
    batch_limit integer,
    INOUT skipped bigint[],
    OUT changed bigint,
    OUT purged  bigint,
    OUT more    boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    grace constant integer := idem__setting_integer('idempotency.cleanup_grace',
                                                   600, 0, 2147483647, 's');
    tombstone_ttl constant integer := idem__setting_integer('idempotency.tombstone_ttl',
                                                           604800, 0, 2147483647, 's');
    archive constant boolean := pass <> 'lease expiry'
        AND idem__setting_enum('idempotency.cleanup_action', 'delete',
                              ARRAY['delete', 'archive']) = 'archive';
    clock timestamptz;
    cutoff timestamptz;
    cleanup_cutoff timestamptz;
    done_ids bigint[];
    kept_ids bigint[];
    picked bigint[];
    one_ids bigint[];
    one_kept bigint[];
    batch_failed boolean := false;
    found integer;
    lim integer;
    id bigint;
BEGIN
    skipped := coalesce(skipped, '{}');
    changed := 0;
    purged := 0;
    more := false;
    IF pass = 'purge' AND tombstone_ttl = 0 THEN
        RETURN;                 -- no tombstones kept: cleanup deletes at grace
    END IF;
    -- no write while a statement copies either table to new storage
    -- (16_table.sql); the archive looked up in the schema of idem_records
    -- alone, as idem__archive_present does
    PERFORM idem__refuse_write_during_rewrite('idem_records'::regclass);
    IF archive AND idem__archive_present() THEN
        PERFORM idem__refuse_write_during_rewrite('idem_records_archive'::regclass);
    END IF;
    IF archive AND NOT idem__archive_present() THEN
        RAISE EXCEPTION 'idempotency % cannot archive: relation "%.idem_records_archive" does not exist',
                        pass, (SELECT n.nspname FROM pg_class AS c
                                 JOIN pg_namespace AS n ON n.oid = c.relnamespace
                                WHERE c.oid = 'idem_records'::regclass)
            USING ERRCODE = '42P01',
                  DETAIL = 'idempotency.cleanup_action is "archive": no record is purged or deleted without its copy.',
                  HINT = 'Give the table back its name, or set idempotency.cleanup_action to "delete".';
    END IF;

    -- the clock, not the transaction start: a lease ends when the clock says
    clock := clock_timestamp();
    cleanup_cutoff := clock - (grace::bigint + tombstone_ttl) * interval '1 second';
    cutoff := CASE pass WHEN 'lease expiry' THEN clock
                        WHEN 'cleanup' THEN cleanup_cutoff
                        ELSE clock - grace * interval '1 second' END;

    BEGIN
        EXECUTE idem__pass_sql(pass, 'batch', archive)
           INTO done_ids, kept_ids
          USING cutoff, batch_limit, skipped, cleanup_cutoff;
    EXCEPTION WHEN OTHERS THEN
        IF NOT idem__error_concerns_rows(SQLSTATE) THEN
            RAISE;
        END IF;
        batch_failed := true;
    END;

    IF batch_failed THEN
        -- a row of the batch failed: find it, and do the others
        done_ids := NULL;
        lim := batch_limit;
    ELSE
        found := cardinality(done_ids) + cardinality(kept_ids);
        changed := cardinality(done_ids);
        FOREACH id IN ARRAY kept_ids LOOP
            purged := purged + idem__pass_skip(pass, id, NULL, NULL, archive, tombstone_ttl > 0);
            skipped := skipped || id;
        END LOOP;
        IF found >= batch_limit THEN
            more := true;
            RETURN;
        END IF;
        -- fewer rows than the limit: the end of the work, rows a trigger
        -- kept by returning NULL (the next batch would pick them first
        -- again), or rows that became due after the batch's snapshot
        lim := batch_limit - found;
    END IF;

    -- lock the rows again and change them one by one; the locks are taken
    -- here, so they stay ours whatever happens to the subtransactions
    EXECUTE idem__pass_sql(pass, 'pick', archive)
       INTO picked
      USING cutoff, lim, skipped, cleanup_cutoff;
    FOREACH id IN ARRAY picked LOOP
        IF done_ids IS NOT NULL AND id = ANY (done_ids) THEN
            -- changed by the batch and due again (an AFTER trigger undid it)
            purged := purged + idem__pass_skip(pass, id, NULL, NULL, archive, tombstone_ttl > 0);
            skipped := skipped || id;
            changed := changed - 1;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE idem__pass_sql(pass, 'one', archive)
               INTO one_ids, one_kept
              USING cutoff, lim, ARRAY[id], cleanup_cutoff;
            changed := changed + cardinality(one_ids);
            IF cardinality(one_ids) = 0 THEN
                purged := purged + idem__pass_skip(pass, id, NULL, NULL, archive, tombstone_ttl > 0);
                skipped := skipped || id;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            IF NOT idem__error_concerns_rows(SQLSTATE) THEN
                RAISE;
            END IF;
            purged := purged + idem__pass_skip(pass, id, SQLSTATE, SQLERRM, archive, tombstone_ttl > 0);
            skipped := skipped || id;
        END;
    END LOOP;
    more := CASE WHEN batch_failed THEN cardinality(picked) >= batch_limit
                 ELSE cardinality(picked) > 0 END;
END
$$;

-- An optional positive argument: the setting when NULL.
CREATE OR REPLACE FUNCTION idem__positive_argument(value integer, name text, setting integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        RETURN setting;
    END IF;
    IF value <= 0 THEN
        RAISE EXCEPTION '% must be positive', name
            USING ERRCODE = '22023',
                  DETAIL = format('The value given was %s.', value),
                  HINT = 'Pass NULL or leave it out to use the server setting.';
    END IF;
    RETURN value;
END
$$;

--
-- The lease pass, once, in the caller's transaction: at most max_rows
-- leases (idempotency.cleanup_batch_size when NULL) move to unknown or
-- retryable as their policy says.  Records that cannot be changed are
-- skipped with a WARNING and do not count against max_rows.
--
CREATE OR REPLACE FUNCTION idem_expire_leases(max_rows integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    wanted constant integer := idem__positive_argument(max_rows, 'max_rows',
        idem__setting_integer('idempotency.cleanup_batch_size', 200, 1, 1000000));
    skipped bigint[] := '{}';
    batch record;
    expired bigint := 0;
    more boolean := true;
BEGIN
    WHILE more AND expired < wanted LOOP
        SELECT * INTO batch FROM idem__pass_batch('lease expiry', (wanted - expired)::integer, skipped);
        skipped := batch.skipped;
        expired := expired + batch.changed;
        more := batch.more;
    END LOOP;
    RETURN expired;
END
$$;

COMMENT ON FUNCTION idem_expire_leases(integer) IS
    'Move at most max_rows processing records whose lease ended to unknown or retryable; returns how many.';

--
-- Cleanup in the caller's transaction: up to max_batches DELETE statements
-- of batch_size rows each (the settings when NULL), stopping at the first
-- batch that finds fewer rows, then as many purge statements in the same
-- way.  A function cannot commit: every changed row stays locked until the
-- caller's transaction ends, so max_batches bounds how much one call locks.
-- idem_maintenance() commits between batches.  Returns how many records
-- were deleted or made tombstones.
--
CREATE OR REPLACE FUNCTION idem_cleanup(batch_size integer DEFAULT NULL,
                                        max_batches integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    size constant integer := idem__positive_argument(batch_size, 'batch_size',
        idem__setting_integer('idempotency.cleanup_batch_size', 200, 1, 1000000));
    batches constant integer := idem__positive_argument(max_batches, 'max_batches',
        idem__setting_integer('idempotency.cleanup_max_batches', 500, 1, 2147483647));
    pass text;
    skipped bigint[];
    batch record;
    result bigint := 0;
    more boolean;
    i integer;
BEGIN
    FOREACH pass IN ARRAY ARRAY['cleanup', 'purge'] LOOP
        skipped := '{}';
        more := true;
        i := 0;
        WHILE i < batches AND more LOOP
            SELECT * INTO batch FROM idem__pass_batch(pass, size, skipped);
            skipped := batch.skipped;
            result := result + batch.changed + batch.purged;
            more := batch.more;
            i := i + 1;
        END LOOP;
    END LOOP;
    RETURN result;
END
$$;

COMMENT ON FUNCTION idem_cleanup(integer, integer) IS
    'Delete expired succeeded, failed and retryable records, batch_size rows per statement, at most max_batches statements; returns how many.';

--
-- What the C extension's background worker does in a cycle, for pg_cron to
-- CALL (sql_edition/README.md): the lease pass, cleanup and purge, each in
-- batches of idempotency.cleanup_batch_size rows, at most
-- idempotency.cleanup_max_batches batches per pass, each batch committed
-- on its own, with idempotency.cleanup_delay between two cleanup or purge
-- batches.  An error in one pass is reported as a WARNING and the next
-- pass runs.  Must be CALLed outside a transaction block, as pg_cron does;
-- inside one, the first COMMIT fails.
--
-- A procedure that commits can have no SET clause, so its search_path is
-- not pinned: it names the install schema in its body, written here.
--
DO $procedure$
BEGIN
    EXECUTE format($body$
CREATE OR REPLACE PROCEDURE %1$I.idem_maintenance()
LANGUAGE plpgsql
AS $proc$
DECLARE
    size integer;
    max_batches integer;
    delay integer;
    pass text;
    skipped bigint[];
    batch record;
    batches integer;
    total bigint;
    failed boolean;
BEGIN
    size := %1$I.idem__setting_integer('idempotency.cleanup_batch_size', 200, 1, 1000000);
    max_batches := %1$I.idem__setting_integer('idempotency.cleanup_max_batches', 500, 1, 2147483647);
    delay := %1$I.idem__setting_integer('idempotency.cleanup_delay', 50, 0, 10000, 'ms');
    FOREACH pass IN ARRAY ARRAY['lease expiry', 'cleanup', 'purge'] LOOP
        skipped := '{}';
        batches := 0;
        total := 0;
        LOOP
            failed := false;
            BEGIN
                SELECT * INTO batch FROM %1$I.idem__pass_batch(pass, size, skipped);
            EXCEPTION WHEN OTHERS THEN
                RAISE WARNING 'idempotency maintenance for database "%%" failed a pass: %%',
                              current_database(), SQLERRM
                    USING ERRCODE = SQLSTATE;
                failed := true;
            END;
            COMMIT;
            EXIT WHEN failed;
            skipped := batch.skipped;
            batches := batches + 1;
            total := total + batch.changed;
            EXIT WHEN NOT batch.more;
            IF batches >= max_batches THEN
                IF pass <> 'lease expiry' THEN
                    RAISE LOG 'idempotency maintenance for database "%%" reached idempotency.cleanup_max_batches: %% expired records %% in %% batches, the rest waits for the next run',
                              current_database(), total,
                              CASE pass WHEN 'purge' THEN 'purged' ELSE 'deleted' END, batches;
                END IF;
                EXIT;
            END IF;
            IF pass <> 'lease expiry' AND delay > 0 THEN
                PERFORM pg_catalog.pg_sleep(delay / 1000.0);
            END IF;
        END LOOP;
        IF pass = 'lease expiry' AND total > 0 THEN
            RAISE LOG 'idempotency maintenance for database "%%" expired %% leases',
                      current_database(), total;
        END IF;
    END LOOP;
END
$proc$
$body$, (SELECT n.nspname FROM pg_catalog.pg_class AS c
           JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
          WHERE c.oid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass));
END
$procedure$;

COMMENT ON PROCEDURE idem_maintenance() IS
    'The background worker''s cycle for pg_cron: expire leases, delete and purge expired records, committing every batch.';

--
-- idem_list: the calling role's own records in a state, for reconciliation
-- jobs that run as the application's role, which has no privilege on the
-- table.  The invoker function passes the calling role to the definer one,
-- which answers only for a role the session could SET ROLE to and that may
-- execute idem_list: never more than SET ROLE would give.
--
CREATE OR REPLACE FUNCTION idem__list_for(
    caller_role      regrole,
    wanted_state     text,
    wanted_operation text,
    wanted_age       interval,
    wanted_rows      integer)
RETURNS TABLE (
    record_id      bigint,
    tenant         text,
    caller         text,
    operation      text,
    key            text,
    state          text,
    attempt        integer,
    recovery_point text,
    resource_id    text,
    claimed_age    interval,
    updated_age    interval)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
AS $$
#variable_conflict use_column
DECLARE
    list_state idem_state;
    clock timestamptz := clock_timestamp();
    cutoff timestamptz;
    key_limit integer;
    bytes bytea;
    i integer;
    days bigint;
BEGIN
    PERFORM idem__acting_role(caller_role, 'idem_list(text, text, interval, integer)');
    IF $2 IS NULL THEN
        RAISE EXCEPTION 'state must not be null' USING ERRCODE = '22004';
    END IF;
    IF $5 IS NULL THEN
        RAISE EXCEPTION 'max_rows must not be null' USING ERRCODE = '22004';
    END IF;
    IF $2 NOT IN ('processing', 'succeeded', 'failed', 'retryable', 'unknown') THEN
        RAISE EXCEPTION 'invalid state "%" for idem_list',
                        CASE WHEN length($2) > 32 THEN left($2, 32) || '...' ELSE $2 END
            USING ERRCODE = '22023',
                  HINT = 'A state is "processing", "succeeded", "failed", "retryable" or "unknown".';
    END IF;
    list_state := $2::idem_state;
    IF $3 IS NOT NULL THEN
        bytes := convert_to($3, 'UTF8');
        key_limit := idem__setting_integer('idempotency.max_key_length', 255, 1, 8192);
        IF length(bytes) = 0 THEN
            RAISE EXCEPTION 'operation must not be empty' USING ERRCODE = '22023';
        END IF;
        IF length(bytes) > key_limit THEN
            RAISE EXCEPTION 'operation is too long'
                USING ERRCODE = '22023',
                      DETAIL = format('It is %s bytes long; the limit is %s.', length(bytes), key_limit);
        END IF;
        FOR i IN 0 .. length(bytes) - 1 LOOP
            IF get_byte(bytes, i) < 32 OR get_byte(bytes, i) = 127 THEN
                RAISE EXCEPTION 'operation must not contain control characters'
                    USING ERRCODE = '22023',
                          DETAIL = format('Byte %s is 0x%s.', i + 1, lpad(to_hex(get_byte(bytes, i)), 2, '0'));
            END IF;
        END LOOP;
    END IF;
    IF $5 < 1 OR $5 > 100000 THEN
        RAISE EXCEPTION 'max_rows must be between 1 and 100000'
            USING ERRCODE = '22023', DETAIL = format('The value given was %s.', $5);
    END IF;
    IF $4 IS NOT NULL THEN
        IF extract(month FROM $4) < 0 OR extract(year FROM $4) < 0
           OR extract(day FROM $4) < 0
           OR $4 - date_trunc('day', $4) < interval '0' THEN
            RAISE EXCEPTION 'older_than must be zero or positive'
                USING ERRCODE = '22023',
                      DETAIL = format('The value given is %s; no part of it (months, days, time) may be negative.', $4);
        END IF;
        days := (extract(year FROM $4)::bigint * 12 + extract(month FROM $4)::bigint) * 30
                + extract(day FROM $4)::bigint;
        IF days > 365250 OR days * 86400 + extract(epoch FROM $4 - date_trunc('day', $4)) > 365250::bigint * 86400 THEN
            RAISE EXCEPTION 'older_than is out of range'
                USING ERRCODE = '22023',
                      DETAIL = format('The value given is %s; the longest accepted is 365250 days.', $4);
        END IF;
        -- a month counts 30 days and a day 24 hours, as in the C extension
        cutoff := clock - (days * 86400 + extract(epoch FROM $4 - date_trunc('day', $4)))
                          * interval '1 second';
    END IF;

    RETURN QUERY
    SELECT r.id, r.tenant::text, r.caller::text, r.operation::text, r.key::text,
           r.state::text, r.attempt, r.recovery_point, r.resource_id,
           clock - r.claimed_at, clock - r.updated_at
      FROM idem_records AS r
     WHERE r.role = caller_role
       AND r.state = list_state
       AND ($3 IS NULL OR r.operation = $3)
       AND (cutoff IS NULL OR r.updated_at <= cutoff)
     ORDER BY r.updated_at, r.id
     LIMIT $5;
END
$$;

CREATE OR REPLACE FUNCTION idem_list(
    state      text,
    operation  text DEFAULT NULL,
    older_than interval DEFAULT NULL,
    max_rows   integer DEFAULT 100)
RETURNS TABLE (
    record_id      bigint,
    tenant         text,
    caller         text,
    operation      text,
    key            text,
    state          text,
    attempt        integer,
    recovery_point text,
    resource_id    text,
    claimed_age    interval,
    updated_age    interval)
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$
SELECT * FROM idem__list_for(pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)), $1, $2, $3, $4)
$$;

COMMENT ON FUNCTION idem_list(text, text, interval, integer) IS
    'The calling role''s own idempotency records in a state, oldest change first';

--
-- The records no role can reach any more: those of a role dropped since
-- they were made (its number stands in role_oid), and, in a table moved
-- from the C extension, those whose name matched no role when it was
-- updated to 1.3 (former_role).  They stay until they expire and cleanup
-- deletes them; the owner may delete them sooner.  It reads the table with
-- the caller's privileges: only its owner may.
--
CREATE OR REPLACE FUNCTION idem_records_without_role(
    OUT id          bigint,
    OUT role_oid    oid,
    OUT former_role text,
    OUT tenant      text,
    OUT caller      text,
    OUT operation   text,
    OUT key         text,
    OUT state       idem_state,
    OUT created_at  timestamptz,
    OUT expires_at  timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE
AS $$
SELECT r.id, r.role::oid, r.former_role, r.tenant, r.caller,
       r.operation, r.key, r.state, r.created_at, r.expires_at
  FROM idem_records AS r
 WHERE r.role IS NULL
    OR NOT EXISTS (SELECT FROM pg_roles AS a WHERE a.oid = r.role::oid)
 ORDER BY r.id
$$;

COMMENT ON FUNCTION idem_records_without_role() IS
    'Idempotency records that belong to no existing role: a name no role had at the 1.3 update (former_role), or a role dropped since (role_oid)';

--
-- An earlier install of this version named the private helpers of the
-- settings, the maintenance passes and idem_list idem_* as if they were
-- part of the API, which they are not (the C extension has none of them):
-- this run made them under their idem__* names and drops the old ones,
-- with the claims' helpers of the arguments they had before the records
-- kept request_text_hash.
-- Nothing else may use them: a DROP that something still needs fails the
-- install, which leaves everything as it was.
--
DROP FUNCTION IF EXISTS
    idem_setting_integer(text, integer, integer, integer, text),
    idem_setting_enum(text, text, text[]),
    idem_setting_boolean(text, boolean),
    idem_pass_sql(text, text, boolean),
    idem_pass_skip(text, bigint, text, text, boolean, boolean),
    idem_pass_batch(text, integer, bigint[]),
    idem_list_for(regrole, text, text, interval, integer),
    idem_key_hash_prefix(text),
    idem_redact_key(text, text),
    idem_error_concerns_rows(text),
    idem_positive_argument(integer, text, integer),
    idem__claim_key(regrole, text, text, text, text, bytea, interval, bigint, bigint,
                    idem_lease_policy, boolean, boolean),
    idem__claim_plain(regrole, text, text, text, bytea),
    idem__insert_new(regrole, text, text, text, text, bytea, interval, bigint, timestamptz,
                     idem_lease_policy, boolean, timestamptz);
