--
-- Types, records and archive: the objects of a fresh install of the C
-- extension 1.3, column for column (names, order, types, collations,
-- defaults), with its constraints and indexes, so that a database moving
-- between the editions keeps its records as they are (docs/editions.md).
-- sql_edition/test/schema_compare.sh checks that against the C extension.
--
-- A run over an installed edition keeps every object and record: the
-- types and constraints are made only when missing, tables and indexes
-- with IF NOT EXISTS.
--
DO $types$
BEGIN
    IF pg_catalog.to_regtype(pg_catalog.format('%I.idem_state', pg_catalog.current_schema())) IS NULL THEN
        CREATE TYPE idem_state AS ENUM
            ('processing', 'succeeded', 'failed', 'retryable', 'unknown');
    END IF;
    -- What happens to a processing record whose lease ends without an outcome.
    IF pg_catalog.to_regtype(pg_catalog.format('%I.idem_lease_policy', pg_catalog.current_schema())) IS NULL THEN
        CREATE TYPE idem_lease_policy AS ENUM ('unknown', 'retry');
    END IF;
    -- The answer of idem_claim and idem_replay.
    IF pg_catalog.to_regtype(pg_catalog.format('%I.idem_decision', pg_catalog.current_schema())) IS NULL THEN
        CREATE TYPE idem_decision AS (
            outcome        text,        -- proceed | replay | in_progress | mismatch | unknown | expired
            token          text,        -- fencing token of the attempt; proceed only
            record_id      bigint,
            state          idem_state,
            attempt        integer,
            recovery_point text,        -- where a new attempt resumes
            http_status    integer,     -- stored status on replay; 409, 422, 409 otherwise
            headers        jsonb,       -- stored headers on replay
            body           jsonb,       -- stored body on replay
            error_code     text,
            retry_after    integer,     -- seconds; in_progress only
            resource_id    text,        -- stored resource id on replay
            raw_body       bytea        -- stored raw body on replay
        );
    END IF;
END
$types$;

--
-- One row per (role, tenant, caller, operation, key).  role is the role
-- that called (its identity, as regrole: a rename keeps it), filled in by
-- the functions, never from an argument.  Scope and key columns use the
-- "C" collation: keys are opaque bytes, compared byte for byte.
--
CREATE TABLE IF NOT EXISTS idem_records (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role               regrole DEFAULT pg_catalog.to_regrole(pg_catalog.quote_ident(current_user)),
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
    former_role        text COLLATE "C",
    request_text_hash  bytea,
    CONSTRAINT idem_records_fingerprint_length CHECK (octet_length(fingerprint) = 32),
    CONSTRAINT idem_records_attempt_positive CHECK (attempt >= 1),
    CONSTRAINT idem_records_status_range CHECK (response_status BETWEEN 100 AND 599)
);

-- The C extension added these two to a populated 1.0 table NOT VALID; a
-- fresh install of it keeps them so, and so does this one (CREATE TABLE
-- would mark them validated).
DO $constraints$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                    WHERE c.conrelid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass
                      AND c.conname OPERATOR(pg_catalog.=) 'idem_records_headers_shape') THEN
        ALTER TABLE idem_records
            ADD CONSTRAINT idem_records_headers_shape
                CHECK (jsonb_typeof(response_headers) IN ('object', 'array')) NOT VALID;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_constraint AS c
                    WHERE c.conrelid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass
                      AND c.conname OPERATOR(pg_catalog.=) 'idem_records_sealed_alone') THEN
        ALTER TABLE idem_records
            ADD CONSTRAINT idem_records_sealed_alone
                CHECK (response_sealed IS NULL
                       OR (response_headers IS NULL AND response_body IS NULL
                           AND response_raw_body IS NULL)) NOT VALID;
    END IF;
END
$constraints$;

-- A table an earlier install of this version made has no
-- request_text_hash: added last, as the C extension's 1.3 adds it.  What
-- it holds: idem__request_text_hash (45_claim.sql).
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS request_text_hash bytea;

-- Key first: role, tenant, caller and operation are the same for most
-- records, the key decides at once.
CREATE UNIQUE INDEX IF NOT EXISTS idem_records_scope_key
    ON idem_records (key, operation, caller, tenant, role);

-- The two maintenance passes: leases to expire, finished records to purge
-- and delete.  idem_records_unpurged's predicate is repeated word for word
-- in the purge statement (60_maintenance.sql).
CREATE INDEX IF NOT EXISTS idem_records_lease
    ON idem_records (locked_until) WHERE state = 'processing';
CREATE INDEX IF NOT EXISTS idem_records_expiry
    ON idem_records (expires_at) WHERE state IN ('succeeded', 'failed', 'retryable');
CREATE INDEX IF NOT EXISTS idem_records_unpurged
    ON idem_records (expires_at)
 WHERE state IN ('succeeded', 'failed', 'retryable')
   AND (response_headers IS NOT NULL OR response_body IS NOT NULL
        OR response_raw_body IS NOT NULL OR response_sealed IS NOT NULL
        OR resource_id IS NOT NULL);

COMMENT ON TABLE idem_records IS
    'Idempotency records: one per (role, tenant, caller, operation, key). Change only through the idem_* functions.';
COMMENT ON COLUMN idem_records.role IS
    'The role whose record this is (its identity; a rename keeps it). NULL: a name that matched no role when 1.3 was installed, kept in former_role.';
COMMENT ON COLUMN idem_records.caller IS
    'Who called within the role: empty when the role called for itself.';
COMMENT ON COLUMN idem_records.former_role IS
    'The name the role column held before 1.3, for a record whose name matched no role then; NULL otherwise.';
COMMENT ON COLUMN idem_records.request_text_hash IS
    'SQL edition: SHA-256 of fingerprint and of the text of the request it was computed from; NULL when not known. The C extension does not use it.';

--
-- Full copies made by cleanup with idempotency.cleanup_action = archive:
-- the columns of idem_records without defaults, identity or constraints (a
-- reused record is archived again under the same id), plus archived_at.
-- The edition never deletes from it: its owner prunes it.
--
CREATE TABLE IF NOT EXISTS idem_records_archive (
    id                 bigint NOT NULL,
    role               regrole,
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
    archived_at        timestamptz NOT NULL,
    former_role        text COLLATE "C",
    request_text_hash  bytea
);

-- The copy looks up (id, claimed_at); pruning goes by archived_at.
-- (request_text_hash added, as to idem_records, where an earlier install
-- made the table)
ALTER TABLE idem_records_archive ADD COLUMN IF NOT EXISTS request_text_hash bytea;

CREATE INDEX IF NOT EXISTS idem_records_archive_record
    ON idem_records_archive (id, claimed_at);
CREATE INDEX IF NOT EXISTS idem_records_archive_archived_at
    ON idem_records_archive (archived_at);

COMMENT ON TABLE idem_records_archive IS
    'Full copies of idempotency records made by cleanup with idempotency.cleanup_action = archive. Never deleted by the extension.';

--
-- Installed through pg_tle, the tables belong to an extension, and pg_dump
-- dumps an extension's table rows only when marked so; with the C
-- extension's filter: records of a dropped role are not dumped (a restore
-- would give them to whichever role has that number there).  The psql
-- installer's tables are plain tables, dumped as they are.
--
DO $dump$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_depend AS d
                 JOIN pg_catalog.pg_extension AS e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                  AND d.objid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass
                  AND d.deptype OPERATOR(pg_catalog.=) 'e') THEN
        PERFORM pg_catalog.pg_extension_config_dump('idem_records',
            'WHERE role IS NULL OR EXISTS (SELECT FROM pg_catalog.pg_roles AS a'
            || ' WHERE a.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
        PERFORM pg_catalog.pg_extension_config_dump('idem_records_id_seq', '');
        PERFORM pg_catalog.pg_extension_config_dump('idem_records_archive',
            'WHERE role IS NULL OR EXISTS (SELECT FROM pg_catalog.pg_roles AS a'
            || ' WHERE a.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
    END IF;
END
$dump$;

--
-- Counts per operation and state, for dashboards and alerts: the C
-- extension's view, word for word.  cleanup_overdue counts finished
-- records past the time cleanup should have deleted them (expires_at +
-- cleanup_grace + tombstone_ttl).  Only columns that records always keep
-- are named, so that the owner can still drop or replace the response
-- columns.
--
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
