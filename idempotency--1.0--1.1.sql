/* idempotency--1.0--1.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

--
-- Version 1.1.  idempotency--1.0.sql is never changed: a new install runs
-- it and then this script, and an installed 1.0 reaches 1.1 through this
-- script alone, so both end with the same objects (sql/upgrade.sql checks
-- that, and that every record survives the update).  Calls written for 1.0
-- keep working unchanged.
--

--
-- Exact responses: a raw body of any content type, byte for byte, and
-- headers as a list of [name, value] pairs (order and repeats kept), besides
-- 1.0's jsonb body and header object.  With idempotency.encryption_key set,
-- headers, body and raw body are stored encrypted in response_sealed
-- instead (src/response_seal.c).
--
-- Every 1.0 row already satisfies the new constraints (the old one was
-- stricter, and the new columns are empty), so they are added NOT VALID:
-- validating would only scan the whole table while ALTER EXTENSION holds
-- its lock.
--
ALTER TABLE idem_records
    ADD COLUMN response_raw_body bytea,
    ADD COLUMN response_sealed bytea,
    DROP CONSTRAINT idem_records_headers_object,
    ADD CONSTRAINT idem_records_headers_shape
        CHECK (jsonb_typeof(response_headers) IN ('object', 'array')) NOT VALID,
    ADD CONSTRAINT idem_records_sealed_alone
        CHECK (response_sealed IS NULL
               OR (response_headers IS NULL AND response_body IS NULL
                   AND response_raw_body IS NULL)) NOT VALID;

ALTER TYPE idem_decision ADD ATTRIBUTE raw_body bytea;

--
-- idem_complete, idem_fail and idem_resolve gain raw_body.  A function's
-- arguments cannot change in place, so each is dropped and created again,
-- and the EXECUTE privileges granted on the 1.0 function are granted on the
-- new one.  Those grants are the user's, not the extension's: pg_init_privs
-- is set back to what a fresh install records, so that pg_dump keeps
-- dumping them.
--
DO $update$
DECLARE
    f record;
    old_acl aclitem[];
    old_comment text;
    fresh_init_privs aclitem[];
    grant_item record;
BEGIN
    FOR f IN
        SELECT * FROM (VALUES
            ('idem_complete(text, integer, jsonb, jsonb, text)'::regprocedure,
             $def$CREATE FUNCTION idem_complete(
                token       text,
                http_status integer,
                body        jsonb DEFAULT NULL,
                headers     jsonb DEFAULT NULL,
                resource_id text DEFAULT NULL,
                raw_body    bytea DEFAULT NULL)
                RETURNS void
                AS 'MODULE_PATHNAME', 'idem_complete'
                LANGUAGE C VOLATILE PARALLEL UNSAFE$def$,
             'idem_complete(text, integer, jsonb, jsonb, text, bytea)'),
            ('idem_fail(text, integer, jsonb, jsonb, boolean)'::regprocedure,
             $def$CREATE FUNCTION idem_fail(
                token       text,
                http_status integer,
                body        jsonb DEFAULT NULL,
                headers     jsonb DEFAULT NULL,
                retryable   boolean DEFAULT false,
                raw_body    bytea DEFAULT NULL)
                RETURNS void
                AS 'MODULE_PATHNAME', 'idem_fail'
                LANGUAGE C VOLATILE PARALLEL UNSAFE$def$,
             'idem_fail(text, integer, jsonb, jsonb, boolean, bytea)'),
            ('idem_resolve(bigint, text, integer, jsonb, jsonb)'::regprocedure,
             $def$CREATE FUNCTION idem_resolve(
                record_id   bigint,
                state       text,
                http_status integer,
                body        jsonb DEFAULT NULL,
                headers     jsonb DEFAULT NULL,
                raw_body    bytea DEFAULT NULL)
                RETURNS void
                AS 'MODULE_PATHNAME', 'idem_resolve'
                LANGUAGE C VOLATILE PARALLEL UNSAFE$def$,
             'idem_resolve(bigint, text, integer, jsonb, jsonb, bytea)')
        ) AS v(old_function, definition, new_signature)
    LOOP
        SELECT proacl, obj_description(oid, 'pg_proc')
          INTO old_acl, old_comment
          FROM pg_catalog.pg_proc WHERE oid = f.old_function;
        EXECUTE format('DROP FUNCTION %s', f.old_function);
        EXECUTE f.definition;
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.new_signature);
        IF old_comment IS NOT NULL THEN
            EXECUTE format('COMMENT ON FUNCTION %s IS %L', f.new_signature, old_comment);
        END IF;
        SELECT initprivs INTO fresh_init_privs
          FROM pg_catalog.pg_init_privs
         WHERE objoid = f.new_signature::regprocedure
           AND classoid = 'pg_catalog.pg_proc'::regclass;

        FOR grant_item IN
            SELECT a.grantee, a.is_grantable
              FROM pg_catalog.aclexplode(old_acl) AS a
              JOIN pg_catalog.pg_proc p ON p.oid = f.new_signature::regprocedure
             WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s',
                           f.new_signature,
                           CASE WHEN grant_item.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_catalog.pg_get_userbyid(grant_item.grantee)) END,
                           CASE WHEN grant_item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;

        UPDATE pg_catalog.pg_init_privs SET initprivs = fresh_init_privs
         WHERE objoid = f.new_signature::regprocedure
           AND classoid = 'pg_catalog.pg_proc'::regclass;
    END LOOP;
END
$update$;

--
-- The unique index of the scope and key, key first.  Role, tenant, caller
-- and operation are the same for most records, so every B-tree comparison
-- on the way down 1.0's index walked four equal texts (each at a variable
-- offset) before the one that decides; the key decides at once, in every
-- claim, replay and completion.  Same columns, same uniqueness: only the
-- order changes (src/catalog.c reads it, and serves 1.0's order until the
-- update).  The index is built again, under the lock ALTER EXTENSION
-- holds, in one transaction: no moment without it.
--
DROP INDEX idem_records_scope_key;
CREATE UNIQUE INDEX idem_records_scope_key
    ON idem_records (key, operation, caller, tenant, role);

--
-- Expiry you can publish.  Past expires_at plus idempotency.cleanup_grace,
-- cleanup purges a finished record's stored response and keeps the rest as
-- a tombstone until expires_at plus idempotency.tombstone_ttl; a claim of
-- an expired record or a tombstone answers expired unless it passes
-- on_expired => 'proceed' (src/decision.c, src/maintenance.c).
--
-- The purge pass picks the records that still hold a response through
-- this index, so that it never walks the tombstones it already made.  Its
-- predicate is repeated word for word in the pass's statement.
--
CREATE INDEX idem_records_unpurged
    ON idem_records (expires_at)
 WHERE state IN ('succeeded', 'failed', 'retryable')
   AND (response_headers IS NOT NULL OR response_body IS NOT NULL
        OR response_raw_body IS NOT NULL OR response_sealed IS NOT NULL
        OR resource_id IS NOT NULL);

--
-- idem_claim gains on_expired, replaced as idem_complete above was: the
-- EXECUTE privileges granted on the 1.0 function are granted on the new
-- one, and pg_init_privs is set back to what a fresh install records.
--
DO $update$
DECLARE
    old_acl aclitem[];
    fresh_init_privs aclitem[];
    grant_item record;
    new_claim regprocedure;
BEGIN
    SELECT proacl INTO old_acl FROM pg_catalog.pg_proc
     WHERE oid = 'idem_claim(text, text, jsonb, text, text, interval, interval, interval, text)'::regprocedure;
    DROP FUNCTION idem_claim(text, text, jsonb, text, text, interval, interval, interval, text);
    CREATE FUNCTION idem_claim(
        operation       text,
        key             text,
        request         jsonb DEFAULT NULL,
        tenant          text DEFAULT '',
        caller          text DEFAULT current_user,
        ttl             interval DEFAULT NULL,
        lease           interval DEFAULT NULL,
        wait            interval DEFAULT NULL,
        on_lease_expiry text DEFAULT 'unknown',
        on_expired      text DEFAULT 'reject')
        RETURNS idem_decision
        AS 'MODULE_PATHNAME', 'idem_claim'
        LANGUAGE C VOLATILE PARALLEL UNSAFE;
    new_claim := 'idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text)'::regprocedure;
    REVOKE ALL ON FUNCTION idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text) FROM PUBLIC;
    SELECT initprivs INTO fresh_init_privs FROM pg_catalog.pg_init_privs
     WHERE objoid = new_claim AND classoid = 'pg_catalog.pg_proc'::regclass;
    FOR grant_item IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.aclexplode(old_acl) AS a
          JOIN pg_catalog.pg_proc p ON p.oid = new_claim
         WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', new_claim,
                       CASE WHEN grant_item.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_catalog.pg_get_userbyid(grant_item.grantee)) END,
                       CASE WHEN grant_item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    UPDATE pg_catalog.pg_init_privs SET initprivs = fresh_init_privs
     WHERE objoid = new_claim AND classoid = 'pg_catalog.pg_proc'::regclass;
END
$update$;

-- PostgreSQL 17 and later also record the roles named in pg_init_privs in
-- pg_shdepend: the grants made again above, no longer initial privileges,
-- leave those entries too, or DROP ROLE of a grantee would be refused
-- ("initial privileges for function ...").  15 and 16 record none.
DELETE FROM pg_catalog.pg_shdepend d
 WHERE d.dbid = (SELECT oid FROM pg_catalog.pg_database
                  WHERE datname = pg_catalog.current_database())
   AND d.classid = 'pg_catalog.pg_proc'::regclass
   AND d.deptype = 'i'
   AND d.objid IN (SELECT e.objid FROM pg_catalog.pg_depend e
                    WHERE e.classid = 'pg_catalog.pg_proc'::regclass
                      AND e.refclassid = 'pg_catalog.pg_extension'::regclass
                      AND e.refobjid = (SELECT oid FROM pg_catalog.pg_extension
                                         WHERE extname = 'idempotency')
                      AND e.deptype = 'e')
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_init_privs i,
                               pg_catalog.aclexplode(i.initprivs) a
                    WHERE i.objoid = d.objid AND i.classoid = d.classid
                      AND d.refobjid IN (a.grantee, a.grantor));

COMMENT ON FUNCTION idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text) IS
    'Claim an idempotency key: proceed, replay, in_progress, mismatch, unknown or expired';

--
-- idempotency.cleanup_action = 'archive': before cleanup purges a record's
-- response or deletes it, it copies the full record here, once per command
-- (src/maintenance.c).  The extension never deletes from this table: its
-- owner prunes it (docs/worker.md, "Archive").  Same columns as
-- idem_records in 1.1, without its defaults, identity or constraints (a
-- reused record is archived again under the same id), plus archived_at.
-- pg_dump dumps its rows like those of idem_records; nobody but the owner
-- may read it, whatever EXECUTE they were granted.
--
CREATE TABLE idem_records_archive (
    id                 bigint NOT NULL,
    role               text COLLATE "C" NOT NULL,
    tenant             text COLLATE "C" NOT NULL,
    caller             text COLLATE "C" NOT NULL,
    operation          text COLLATE "C" NOT NULL,
    key                text COLLATE "C" NOT NULL,
    fingerprint        bytea NOT NULL,
    state              idem_state NOT NULL,
    attempt            integer NOT NULL,
    attempt_token      bytea,
    recovery_point     text,
    locked_until       timestamptz,
    on_lease_expiry    idem_lease_policy NOT NULL,
    ttl                interval NOT NULL,
    response_status    integer,
    response_headers   jsonb,
    response_body      jsonb,
    resource_id        text,
    created_at         timestamptz NOT NULL,
    claimed_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    completed_at       timestamptz,
    expires_at         timestamptz NOT NULL,
    response_raw_body  bytea,
    response_sealed    bytea,
    archived_at        timestamptz NOT NULL
);

-- The copy looks up (id, claimed_at); pruning goes by archived_at.
CREATE INDEX idem_records_archive_record ON idem_records_archive (id, claimed_at);
CREATE INDEX idem_records_archive_archived_at ON idem_records_archive (archived_at);

COMMENT ON TABLE idem_records_archive IS
    'Full copies of idempotency records made by cleanup with idempotency.cleanup_action = archive. Never deleted by the extension.';

SELECT pg_catalog.pg_extension_config_dump('idem_records_archive', '');
REVOKE ALL ON idem_records_archive FROM PUBLIC;

--
-- idempotency.max_new_keys_per_second: a claim that would create a record
-- beyond its role's rate answers rate_limited and writes nothing
-- (src/rate_limit.c).  The limit lives in shared memory: no object changes
-- besides the claim's description.
--
COMMENT ON FUNCTION idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text) IS
    'Claim an idempotency key: proceed, replay, in_progress, mismatch, unknown, expired or rate_limited';

-- Operations: counters of what happened, per database, role and operation,
-- in shared memory (src/stat_operations.c; docs/monitoring.md), and
-- idem_list() for reconciliation jobs that run as the application's role
-- (src/list.c).  idem_stat_operations() shows a role its own rows, or every
-- row with the privileges of pg_read_all_stats; without the library in
-- shared_preload_libraries it returns no rows.  Nothing is granted to
-- PUBLIC: docs/monitoring.md lists the grants of a monitoring role.
--
CREATE FUNCTION idem_stat_operations(
    OUT dbid                     oid,
    OUT userid                   oid,
    OUT operation                text,
    OUT proceed                  bigint,
    OUT replay                   bigint,
    OUT in_progress              bigint,
    OUT mismatch                 bigint,
    OUT unknown                  bigint,
    OUT expired                  bigint,
    OUT rate_limited             bigint,
    OUT completions              bigint,
    OUT failures                 bigint,
    OUT retryable_failures       bigint,
    OUT stale_tokens             bigint,
    OUT leases_expired_unknown   bigint,
    OUT leases_expired_retryable bigint,
    OUT records_purged           bigint,
    OUT records_deleted          bigint,
    OUT total_claim_time         double precision,
    OUT stats_since              timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_stat_operations'
    LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW idem_stat_operations AS
SELECT s.dbid, d.datname AS database, s.userid, r.rolname AS role,
       s.operation, s.proceed, s.replay, s.in_progress, s.mismatch,
       s.unknown, s.expired, s.rate_limited, s.completions, s.failures,
       s.retryable_failures, s.stale_tokens, s.leases_expired_unknown,
       s.leases_expired_retryable, s.records_purged, s.records_deleted,
       s.total_claim_time, s.stats_since
  FROM idem_stat_operations() AS s
  LEFT JOIN pg_catalog.pg_database AS d ON d.oid = s.dbid
  LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = s.userid;

CREATE FUNCTION idem_stat_operations_info(
    OUT evictions   bigint,
    OUT stats_reset timestamptz)
    RETURNS SETOF record
    AS 'MODULE_PATHNAME', 'idem_stat_operations_info'
    LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW idem_stat_operations_info AS
SELECT * FROM idem_stat_operations_info();

CREATE FUNCTION idem_stat_reset()
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_stat_reset'
    LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION idem_list(
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
    AS 'MODULE_PATHNAME', 'idem_list'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- idem_stats gains cleanup_overdue: finished records past the time
-- cleanup should have deleted them (expires_at + cleanup_grace +
-- tombstone_ttl), which the tombstones kept on purpose do not inflate.  The
-- settings are read where they are defined or set, else their defaults.
-- Only columns of 1.0 that records always keep are named, so that the
-- owner can still drop or replace the response columns.
CREATE OR REPLACE VIEW idem_stats AS
WITH settings AS (
    SELECT coalesce(nullif(pg_catalog.current_setting('idempotency.cleanup_grace', true), ''),
                    '10min')::interval AS grace,
           coalesce(nullif(pg_catalog.current_setting('idempotency.tombstone_ttl', true), ''),
                    '7d')::interval AS tombstone_ttl)
SELECT operation,
       state,
       count(*) AS records,
       max(clock_timestamp() - claimed_at)
           FILTER (WHERE state = 'processing') AS oldest_processing_age,
       count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'retryable')
                          AND expires_at < clock_timestamp()) AS expired_awaiting_cleanup,
       count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'retryable')
                          AND expires_at < clock_timestamp() - s.grace - s.tombstone_ttl)
           AS cleanup_overdue
  FROM idem_records, settings AS s
 GROUP BY operation, state;

COMMENT ON VIEW idem_stat_operations IS
    'What happened per database, role and operation: claim outcomes, completions, failures, maintenance work';
COMMENT ON FUNCTION idem_list(text, text, interval, integer) IS
    'The calling role''s own idempotency records in a state, oldest change first';

REVOKE ALL ON FUNCTION idem_stat_operations() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_stat_operations_info() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_stat_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_list(text, text, interval, integer) FROM PUBLIC;
REVOKE ALL ON idem_stat_operations FROM PUBLIC;
REVOKE ALL ON idem_stat_operations_info FROM PUBLIC;

-- Batches and consumers (src/claim.c, src/key_lock.c).
--
-- idem_inbox: a message consumer's inbox.  Each message id is a record of
-- the calling role with operation = consumer, inserted succeeded at once
-- without token, lease or response, in the consumer's own transaction, so
-- ttl, tombstones and cleanup are those of every record (docs/inbox.md).
--
CREATE FUNCTION idem_inbox(
    consumer   text,
    message_id text,
    message    jsonb DEFAULT NULL,
    ttl        interval DEFAULT NULL)
    RETURNS text
    AS 'MODULE_PATHNAME', 'idem_inbox'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_inbox(text, text, jsonb, interval) IS
    'Record a consumed message id: proceed, duplicate, in_progress or mismatch';

REVOKE ALL ON FUNCTION idem_inbox(text, text, jsonb, interval) FROM PUBLIC;

--
-- idem_claim_many: one claim per key, answered in input order with its key
-- and idem_decision's columns, in the caller's transaction.  wait bounds
-- the whole call; a key repeated within the call is claimed again without
-- waiting (in_progress when its first position proceeded).  See
-- docs/api.md.
--
CREATE FUNCTION idem_claim_many(
    operation       text,
    keys            text[],
    requests        jsonb[] DEFAULT NULL,
    tenant          text DEFAULT '',
    caller          text DEFAULT current_user,
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
    AS 'MODULE_PATHNAME', 'idem_claim_many'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

COMMENT ON FUNCTION idem_claim_many(text, text[], jsonb[], text, text, interval, interval, interval, text, text) IS
    'Claim many idempotency keys at once: one decision per key, in input order';

REVOKE ALL ON FUNCTION
    idem_claim_many(text, text[], jsonb[], text, text, interval, interval, interval, text, text)
    FROM PUBLIC;
