--
-- Privileges, as the C extension sets them: nobody but the owner reads or
-- writes the tables; nobody may call a function that reads or writes
-- records until granted EXECUTE (sql_edition/README.md lists the GRANT
-- lines); the pure functions (idem_canonical, idem_fingerprint,
-- idem_derive_key) and the edition's helpers stay callable by everyone.
-- The helpers either act with the caller's own privileges or, when they
-- are SECURITY DEFINER, check the calling role themselves.
--
REVOKE ALL ON TABLE idem_records, idem_records_archive, idem_stats, idem_sql_edition
    FROM PUBLIC;
REVOKE ALL ON SEQUENCE idem_records_id_seq FROM PUBLIC;

DO $grants$
DECLARE
    schema_oid constant oid := (SELECT c.relnamespace FROM pg_catalog.pg_class AS c
                                 WHERE c.oid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass);
    fresh constant boolean :=
        pg_catalog.current_setting('idempotency_sql.previous_version', true)
            OPERATOR(pg_catalog.=) '';
    -- the functions of the C extension that read or write records
    guarded constant text[] := ARRAY[
        'idem_claim', 'idem_claim_text', 'idem_claim_many', 'idem_inbox',
        'idem_complete', 'idem_fail', 'idem_heartbeat', 'idem_checkpoint',
        'idem_replay', 'idem_resolve', 'idem_list', 'idem_expire_leases',
        'idem_cleanup', 'idem_records_without_role', 'idem_records_guard',
        'idem_maintenance'];
    -- SQL functions kept inlinable: a SET clause would stop the planner
    -- from inlining them, so their bodies name the schema themselves.
    -- The claims' private helpers (idem__*, not SECURITY DEFINER) are not
    -- pinned either: they run inside the pinned definer functions, under
    -- their search_path, and a SET clause on each would switch search_path
    -- (and look it up again) twice per call, several times per claim.
    inlined constant text[] := ARRAY[
        'idem_claim(text,text,jsonb,text,text,interval,interval,interval,text,text)',
        'idem_claim_text(text,text,text,text)',
        'idem_inbox(text,text,jsonb,interval)',
        'idem_replay(text,text,text,text)',
        'idem_complete(text,integer,jsonb,jsonb,text,bytea)',
        'idem_fail(text,integer,jsonb,jsonb,boolean,bytea)',
        'idem_heartbeat(text,interval)',
        'idem_checkpoint(text,text)',
        'idem_resolve(bigint,text,integer,jsonb,jsonb,bytea)',
        'idem__setting_integer(text,integer,integer,integer,text)',
        'idem__setting_enum(text,text,text[])',
        'idem__setting_boolean(text,boolean)',
        'idem__no_request()',
        'idem__request_fingerprint(jsonb)',
        'idem__request_text_hash(bytea,jsonb)',
        'idem__key_lock_id(regrole,text,text,text,text)',
        'idem__new_secret()',
        'idem__token_format(bigint,integer,bytea)',
        'idem__max_key_length()',
        'idem__is_operator(regrole)',
        'idem__answer_busy()',
        'idem__plain_scope(text,text,text)',
        'idem__plain_role(regrole,regprocedure)',
        'idem__answer(text,bigint,idem_state,integer,text,integer,jsonb,jsonb,text,bytea,timestamp with time zone,timestamp with time zone)'];
    -- Private helpers pinned all the same: the maintenance passes', which
    -- idem_maintenance() calls (a procedure that commits, so with no
    -- search_path of its own) and which run with the caller's privileges.
    pinned_helpers constant text[] := ARRAY[
        'idem__pass_batch', 'idem__pass_skip', 'idem__pass_sql', 'idem__error_concerns_rows',
        'idem__positive_argument', 'idem__key_hash_prefix', 'idem__redact_key'];
    f record;
BEGIN
    -- A function made by this run has the default privileges (PUBLIC may
    -- execute it).  One an earlier run made keeps what its owner granted
    -- since, including to PUBLIC.
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS signature, p.prokind
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
           AND p.proname OPERATOR(pg_catalog.=) ANY (guarded)
           AND (fresh OR p.proacl IS NULL)
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC',
                                  CASE f.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                                  f.signature);
    END LOOP;

    -- Every function of the edition runs with search_path pinned: built-in
    -- functions and operators first, so that nothing created in the
    -- install schema can stand in for them; then the edition's objects;
    -- temporary objects last, so that none can stand in for a table.  Not
    -- procedures: one that commits can have no SET clause.
    FOR f IN
        SELECT p.oid::pg_catalog.regprocedure AS signature
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) schema_oid
           AND p.proname OPERATOR(pg_catalog.~~) E'idem\\_%'
           AND p.prokind OPERATOR(pg_catalog.=) 'f'
           AND NOT (p.oid::pg_catalog.regprocedure::text OPERATOR(pg_catalog.=) ANY (inlined))
           AND NOT (p.proname OPERATOR(pg_catalog.~~) E'idem\\_\\_%' AND NOT p.prosecdef
                    AND NOT (p.proname OPERATOR(pg_catalog.=) ANY (pinned_helpers)))
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f.signature, schema_oid::pg_catalog.regnamespace::text);
    END LOOP;
END
$grants$;
