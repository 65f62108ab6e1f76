--
-- idempotency, SQL edition 1.3: psql installer.
--
-- Run by a role that may create in the database (no superuser needed):
--   psql -v ON_ERROR_STOP=1 -f sql_edition/idempotency_sql.sql
--   psql -v ON_ERROR_STOP=1 -v schema=idempotency -f sql_edition/idempotency_sql.sql
-- Without -v schema it installs into current_schema().  One transaction:
-- a failed install leaves nothing.  Run again, or run a later version's
-- installer, to update in place: every record is kept.  See
-- sql_edition/README.md.
--
-- Written by sql_edition/build.sh from sql_edition/src/; do not edit.
--
\set ON_ERROR_STOP on
\set QUIET on
\if :{?schema}
\else
\set schema ''
\endif
BEGIN;
SET LOCAL client_min_messages = warning;
SELECT pg_catalog.set_config('idempotency_sql.schema', :'schema', true) IS NULL AS no_schema \gset
\unset no_schema
\unset schema
-- >>> the SQL of sql_edition/src/, as pg_tle receives it
-- src/00_header.sql
--
-- idempotency, SQL edition: the same contract as the C extension (contract
-- version 1.3) in SQL and PL/pgSQL, for servers that load no library of
-- ours.  This text is run as it is by the psql installer and by pg_tle's
-- CREATE EXTENSION: no psql meta-command and no transaction control below.
--
-- Every object is created unqualified, so in the first schema of
-- search_path, which the block below sets to the install schema for the
-- rest of the transaction (pg_tle: the extension's schema).  Function
-- bodies find the objects through the search_path that 90_grants.sql pins.
--
-- The block also decides what kind of install this is, from the version
-- recorded in idem_sql_edition:
--   none      a fresh install;
--   earlier   an update in place: later pieces add what is new and keep
--             every record;
--   the same  a run again: nothing changes, every record is kept;
--   later     refused: this installer does not downgrade.
-- The version found before this run is left in the transaction-local
-- setting idempotency_sql.previous_version ('' on a fresh install) for the
-- pieces that change what an earlier version made.
--
DO $header$
DECLARE
    this_version constant text := '1.3';
    wanted text := nullif(
        pg_catalog.current_setting('idempotency_sql.schema', true), '');
    target text;
    target_oid oid;
    found_version text;
    owner_extension text;
BEGIN
    IF wanted IS NOT NULL THEN
        SELECT n.oid INTO target_oid
          FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) wanted;
        IF target_oid IS NULL THEN
            IF NOT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') THEN
                RAISE EXCEPTION 'cannot install the idempotency SQL edition: schema "%" does not exist and role "%" may not create it',
                                wanted, current_user
                    USING ERRCODE = '42501',
                          HINT = 'Create the schema as a role that may (CREATE SCHEMA ... AUTHORIZATION ...), or grant CREATE on the database.';
            END IF;
            EXECUTE pg_catalog.format('CREATE SCHEMA %I', wanted);
        END IF;
        target := wanted;
    ELSE
        target := pg_catalog.current_schema();
        IF target IS NULL THEN
            RAISE EXCEPTION 'cannot install the idempotency SQL edition: no schema of search_path exists'
                USING ERRCODE = '3F000',
                      HINT = 'Name the schema: psql -v schema=NAME -v ON_ERROR_STOP=1 -f idempotency_sql.sql';
        END IF;
    END IF;

    IF NOT pg_catalog.has_schema_privilege(target, 'CREATE') THEN
        RAISE EXCEPTION 'cannot install the idempotency SQL edition: role "%" may not create objects in schema "%"',
                        current_user, target
            USING ERRCODE = '42501',
                  HINT = 'Name a schema the role may create in (psql -v schema=NAME; it is created when the role may create schemas), or GRANT CREATE ON SCHEMA to the role. From PostgreSQL 15 only the database owner may create in schema public.';
    END IF;

    PERFORM pg_catalog.set_config('search_path',
                                  pg_catalog.format('%I, pg_catalog, pg_temp', target), true);

    -- the C extension's table in the same schema: never install over it
    SELECT e.extname INTO owner_extension
      FROM pg_catalog.pg_class AS c
      JOIN pg_catalog.pg_depend AS d
        ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
       AND d.objid OPERATOR(pg_catalog.=) c.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'
      JOIN pg_catalog.pg_extension AS e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
     WHERE c.relname OPERATOR(pg_catalog.=) 'idem_records'
       AND c.relnamespace OPERATOR(pg_catalog.=) target::pg_catalog.regnamespace;
    IF owner_extension IS NOT NULL
       AND owner_extension OPERATOR(pg_catalog.<>) 'idempotency_sql' THEN
        RAISE EXCEPTION 'cannot install the idempotency SQL edition in schema "%": extension "%" owns its idem_records',
                        target, owner_extension
            USING ERRCODE = '55000',
                  HINT = 'Install it in another schema (psql -v schema=NAME), or see docs/editions.md for moving records between the editions.';
    END IF;

    IF pg_catalog.to_regclass(pg_catalog.format('%I.idem_sql_edition', target)) IS NULL THEN
        IF pg_catalog.to_regclass(pg_catalog.format('%I.idem_records', target)) IS NOT NULL THEN
            RAISE EXCEPTION 'cannot install the idempotency SQL edition in schema "%": it has a table idem_records that the SQL edition did not make',
                            target
                USING ERRCODE = '55000',
                      HINT = 'Install it in another schema (psql -v schema=NAME).';
        END IF;
        CREATE TABLE idem_sql_edition (
            version      text NOT NULL,
            installed_at timestamptz NOT NULL
        );
        -- one row: the version installed last
        CREATE UNIQUE INDEX idem_sql_edition_one_row ON idem_sql_edition ((true));
        COMMENT ON TABLE idem_sql_edition IS
            'The version of the idempotency SQL edition installed in this schema, and when.';
    ELSE
        SELECT v.version INTO found_version FROM idem_sql_edition AS v;
        IF found_version IS NOT NULL
           AND pg_catalog.string_to_array(found_version, '.')::integer[]
               OPERATOR(pg_catalog.>) pg_catalog.string_to_array(this_version, '.')::integer[] THEN
            RAISE EXCEPTION 'idempotency SQL edition % is installed in schema "%": this installer (%) does not downgrade it',
                            found_version, target, this_version
                USING ERRCODE = '55000',
                      HINT = pg_catalog.format('Run the installer of version %s or later.', found_version);
        END IF;
    END IF;

    PERFORM pg_catalog.set_config('idempotency_sql.previous_version',
                                  coalesce(found_version, ''), true);

    DELETE FROM idem_sql_edition;
    INSERT INTO idem_sql_edition (version, installed_at)
    VALUES (this_version, pg_catalog.statement_timestamp());
END
$header$;

-- src/10_schema.sql
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

-- src/12_settings.sql
--
-- The idempotency.* settings, read where the SQL edition needs them.
--
-- Without the C library nobody defines them: they are placeholders, which
-- any role may SET to any text, and which current_setting(name, true)
-- reads as NULL (never set) or '' (reset).  Both mean the C extension's
-- default.  A value that does not parse is refused where it is read, with
-- the message and SQLSTATE (22023) that the C extension gives at SET.
--

-- Each reader is an inlinable SQL function that answers the default when
-- the setting was never set (the common case: no function call, no
-- parsing), and calls the parser otherwise.

-- An integer setting, in its base unit (unit: NULL, 's', 'ms', 'B' or
-- 'kB'), parsed as PostgreSQL parses an integer setting: a number (a
-- fraction is rounded), optionally followed by a unit of the same kind.
CREATE OR REPLACE FUNCTION idem__setting_integer_parse(
    name      text,
    boot      integer,
    min_value integer,
    max_value integer,
    unit      text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw text := nullif(current_setting(name, true), '');
    parts text[];
    number numeric;
    factor numeric;
    result numeric;
    time_units constant text[] := ARRAY['us', 'ms', 's', 'min', 'h', 'd'];
    time_ms constant numeric[] := ARRAY[0.001, 1, 1000, 60000, 3600000, 86400000];
    memory_units constant text[] := ARRAY['B', 'kB', 'MB', 'GB', 'TB'];
    memory_b constant numeric[] := ARRAY[1, 1024, 1048576, 1073741824, 1099511627776];
    hint text;
BEGIN
    IF raw IS NULL THEN
        RETURN boot;
    END IF;
    parts := regexp_match(raw, E'^\\s*([-+]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\\s*([A-Za-z]*)\\s*$');
    IF unit IN ('us', 'ms', 's', 'min', 'h', 'd') THEN
        hint := 'Valid units for this parameter are "us", "ms", "s", "min", "h", and "d".';
    ELSIF unit IS NOT NULL THEN
        hint := 'Valid units for this parameter are "B", "kB", "MB", "GB", and "TB".';
    END IF;
    IF parts IS NULL OR (parts[2] <> '' AND unit IS NULL) THEN
        IF hint IS NULL THEN
            RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
                USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023', HINT = hint;
    END IF;
    -- beyond what a double holds (or too long to read as one): what
    -- PostgreSQL's strtod() refuses, without a hint
    IF pg_catalog.length(parts[1]) > 400
       OR pg_catalog.length(pg_catalog.ltrim(coalesce((regexp_match(parts[1], '[eE][-+]?([0-9]+)$'))[1], ''), '0')) > 4 THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023';
    END IF;
    number := parts[1]::numeric;
    IF number <> 0 AND (abs(number) > 1.7976931348623157e308 OR abs(number) < 2.2250738585072014e-308) THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023';
    END IF;
    IF parts[2] = '' THEN
        factor := 1;
    ELSIF unit = ANY (time_units) AND parts[2] = ANY (time_units) THEN
        factor := time_ms[array_position(time_units, parts[2])]
                  / time_ms[array_position(time_units, unit)];
    ELSIF unit = ANY (memory_units) AND parts[2] = ANY (memory_units) THEN
        factor := memory_b[array_position(memory_units, parts[2])]
                  / memory_b[array_position(memory_units, unit)];
    ELSE
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023', HINT = hint;
    END IF;
    -- rounded half to even, in double precision, as PostgreSQL rounds a
    -- setting's value
    result := round(number::double precision * factor::double precision)::numeric;
    IF result < -2147483648 OR result > 2147483647 THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023', HINT = 'Value exceeds integer range.';
    END IF;
    IF result < min_value OR result > max_value THEN
        RAISE EXCEPTION '% is outside the valid range for parameter "%" (% .. %)',
                        result || coalesce(' ' || unit, ''), name, min_value, max_value
            USING ERRCODE = '22023';
    END IF;
    RETURN result::integer;
END
$$;

-- An enum setting: one of allowed, compared without regard to case as
-- PostgreSQL does; returns the allowed spelling.
CREATE OR REPLACE FUNCTION idem__setting_enum_parse(name text, boot text, allowed text[])
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw text := nullif(current_setting(name, true), '');
    value text;
BEGIN
    IF raw IS NULL THEN
        RETURN boot;
    END IF;
    SELECT a INTO value FROM unnest(allowed) AS a WHERE lower(a) = lower(raw);
    IF value IS NULL THEN
        RAISE EXCEPTION 'invalid value for parameter "%": "%"', name, raw
            USING ERRCODE = '22023',
                  HINT = 'Available values: ' || array_to_string(allowed, ', ') || '.';
    END IF;
    RETURN value;
END
$$;

-- A Boolean setting: what boolean input accepts, as PostgreSQL's setting.
CREATE OR REPLACE FUNCTION idem__setting_boolean_parse(name text, boot boolean)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    raw text := nullif(current_setting(name, true), '');
BEGIN
    IF raw IS NULL THEN
        RETURN boot;
    END IF;
    RETURN raw::boolean;
EXCEPTION WHEN invalid_text_representation THEN
    RAISE EXCEPTION 'parameter "%" requires a Boolean value', name
        USING ERRCODE = '22023';
END
$$;

CREATE OR REPLACE FUNCTION idem__setting_integer(
    name      text,
    boot      integer,
    min_value integer,
    max_value integer,
    unit      text DEFAULT NULL)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN NULLIF(pg_catalog.current_setting(name, true), '') IS NULL THEN boot
            ELSE idem__setting_integer_parse(name, boot, min_value, max_value, unit) END;

CREATE OR REPLACE FUNCTION idem__setting_enum(name text, boot text, allowed text[])
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN NULLIF(pg_catalog.current_setting(name, true), '') IS NULL THEN boot
            ELSE idem__setting_enum_parse(name, boot, allowed) END;

-- The spellings PostgreSQL itself shows (on, off) and the usual others
-- are read here; the parser, whose exception handler is a subtransaction,
-- is called only for the rest.
CREATE OR REPLACE FUNCTION idem__setting_boolean(name text, boot boolean)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN NULLIF(pg_catalog.current_setting(name, true), '') IS NULL THEN boot
            WHEN pg_catalog.lower(pg_catalog.current_setting(name, true)) IN ('on', 'true', 'yes', '1') THEN true
            WHEN pg_catalog.lower(pg_catalog.current_setting(name, true)) IN ('off', 'false', 'no', '0') THEN false
            ELSE idem__setting_boolean_parse(name, boot) END;

-- src/15_guard.sql
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

-- src/16_table.sql
--
-- The table as the functions need it.  Its owner may change idem_records,
-- and a change the functions cannot serve is refused before anything is
-- read or written, with the C edition's SQLSTATE and message
-- (src/catalog.c): the table, the types and their labels under their
-- names; the columns of the edition with the types it created and
-- collation "C" for the scope; the scope's unique index under its name,
-- unique on exactly the five columns of the scope in collation "C",
-- immediate, without expression or predicate, and valid; id an identity
-- column with a unique index on it alone.  Then what only the SQL edition
-- needs, since its functions run as their owner, not as the table's: the
-- functions' owner may read and write the table, and no row level
-- security applies to it.
--
-- The C edition keeps what it looked up until an invalidation of the
-- table says it changed.  The SQL edition has no memory of its own that
-- invalidations reach, but the plans of PostgreSQL's plan cache are one:
-- idem__table_checked() is an expression whose plan holds the table and
-- its scope index as constants, made at planning time by
-- idem__checked_relation(), which checks the table before it answers.  A
-- plan holding a relation is planned again when that relation changes
-- (any ALTER TABLE, an index made or dropped on it, its owner, its row
-- level security, the index renamed, rebuilt or marked not valid), so
-- the check runs when the session first plans the expression and after
-- each such change, and the expression costs two look-ups of a relation
-- by its OID otherwise.  (idem__checked_relation() is declared IMMUTABLE
-- so that the planner evaluates it, once, while it plans; were it ever
-- evaluated at each call instead, each call would check the table: slower,
-- never less safe.)  Each definer function's plan of the expression runs
-- the check once: idem__table_fits(), two statements that the session
-- plans once for all of them; only a table that fails it is explained by
-- idem__check_table(), whose many statements are planned then.  A label
-- renamed changes no relation: it is found by the check of a session that
-- plans anew, and until then the plans keep the label's OID, the record's
-- value, as the C edition keeps it.
--

-- Whether the current role (the functions' owner, inside them) holds every
-- privilege the functions use on the table: each asked on its own, since
-- has_table_privilege with a list is true when any one of them is held.
CREATE OR REPLACE FUNCTION idem__may_write_records(tbl regclass)
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.has_table_privilege(tbl, 'SELECT') AND pg_catalog.has_table_privilege(tbl, 'INSERT')
       AND pg_catalog.has_table_privilege(tbl, 'UPDATE') AND pg_catalog.has_table_privilege(tbl, 'DELETE');

-- The error that says what is wrong with the table, if anything: the
-- C edition's checks in its order, then the SQL edition's own.
CREATE OR REPLACE FUNCTION idem__check_table()
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    nsp oid := (SELECT p.pronamespace FROM pg_catalog.pg_proc AS p
                 WHERE p.oid OPERATOR(pg_catalog.=) 'idem__check_table()'::pg_catalog.regprocedure);
    nspname text := (SELECT n.nspname FROM pg_catalog.pg_namespace AS n
                      WHERE n.oid OPERATOR(pg_catalog.=) nsp);
    tbl oid;
    idx oid;
    state_type oid;
    policy_type oid;
    label text;
    c record;
    i record;
    owner_name text;
    fits boolean;
    usable boolean;
BEGIN
    SELECT r.oid INTO tbl FROM pg_catalog.pg_class AS r
     WHERE r.relname OPERATOR(pg_catalog.=) 'idem_records'
       AND r.relnamespace OPERATOR(pg_catalog.=) nsp;
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'table "idem_records" of extension "idempotency" does not exist'
            USING ERRCODE = 'undefined_table',
                  DETAIL = pg_catalog.format('The extension looks for it in schema "%s", under that name.',
                                             nspname),
                  HINT = 'If it was renamed, rename it back.';
    END IF;

    SELECT t.oid INTO state_type FROM pg_catalog.pg_type AS t
     WHERE t.typname OPERATOR(pg_catalog.=) 'idem_state' AND t.typnamespace OPERATOR(pg_catalog.=) nsp;
    SELECT t.oid INTO policy_type FROM pg_catalog.pg_type AS t
     WHERE t.typname OPERATOR(pg_catalog.=) 'idem_lease_policy' AND t.typnamespace OPERATOR(pg_catalog.=) nsp;
    IF state_type IS NULL OR policy_type IS NULL THEN
        RAISE EXCEPTION 'type "%" of extension "idempotency" does not exist',
                        CASE WHEN state_type IS NULL THEN 'idem_state' ELSE 'idem_lease_policy' END
            USING ERRCODE = 'undefined_object',
                  DETAIL = pg_catalog.format('The extension looks for it in schema "%s", under that name.',
                                             nspname),
                  HINT = 'If it was renamed, rename it back.';
    END IF;
    SELECT w.type_name, w.label INTO c
      FROM (VALUES ('idem_state', state_type, 'processing', 1), ('idem_state', state_type, 'succeeded', 2),
                   ('idem_state', state_type, 'failed', 3), ('idem_state', state_type, 'retryable', 4),
                   ('idem_state', state_type, 'unknown', 5),
                   ('idem_lease_policy', policy_type, 'unknown', 6),
                   ('idem_lease_policy', policy_type, 'retry', 7)) AS w (type_name, type_oid, label, n)
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_enum AS e
                        WHERE e.enumtypid OPERATOR(pg_catalog.=) w.type_oid
                          AND e.enumlabel OPERATOR(pg_catalog.=) w.label)
     ORDER BY w.n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'type "%" of extension "idempotency" has no label "%"', c.type_name, c.label
            USING ERRCODE = 'undefined_object',
                  HINT = 'If the label was renamed, rename it back.';
    END IF;

    -- a label the edition does not know (one renamed away, its name given
    -- to a new label) held by a record: the record's state is no state the
    -- functions know (a table scan, only while such a label exists)
    IF EXISTS (SELECT FROM pg_catalog.pg_enum AS e
                WHERE (e.enumtypid OPERATOR(pg_catalog.=) state_type
                       AND e.enumlabel OPERATOR(pg_catalog.<>) ALL ('{processing,succeeded,failed,retryable,unknown}'::text[]))
                   OR (e.enumtypid OPERATOR(pg_catalog.=) policy_type
                       AND e.enumlabel OPERATOR(pg_catalog.<>) ALL ('{unknown,retry}'::text[]))) THEN
        EXECUTE pg_catalog.format(
            'SELECT (SELECT t.typname::text FROM pg_catalog.pg_type AS t
                        WHERE t.oid OPERATOR(pg_catalog.=) e.enumtypid) AS type_name, e.oid
               FROM %I.idem_records AS r
               JOIN pg_catalog.pg_enum AS e
                 ON e.enumtypid OPERATOR(pg_catalog.=) $1
                AND e.enumlabel OPERATOR(pg_catalog.=) r.state::text
                AND e.enumlabel OPERATOR(pg_catalog.<>) ALL (''{processing,succeeded,failed,retryable,unknown}''::text[])
             UNION ALL
             SELECT (SELECT t.typname::text FROM pg_catalog.pg_type AS t
                        WHERE t.oid OPERATOR(pg_catalog.=) e.enumtypid), e.oid
               FROM %I.idem_records AS r
               JOIN pg_catalog.pg_enum AS e
                 ON e.enumtypid OPERATOR(pg_catalog.=) $2
                AND e.enumlabel OPERATOR(pg_catalog.=) r.on_lease_expiry::text
                AND e.enumlabel OPERATOR(pg_catalog.<>) ALL (''{unknown,retry}''::text[])
             LIMIT 1', nspname, nspname)
           INTO c USING state_type, policy_type;
        IF c.oid IS NOT NULL THEN
            RAISE EXCEPTION 'a record of extension "idempotency" holds a label of type "%" the extension does not know',
                            c.type_name
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = pg_catalog.format('The label''s OID is %s.', c.oid),
                      HINT = 'Labels of the extension''s types must keep their names; rename them back.';
        END IF;
    END IF;

    -- the columns the edition created, with their types; the scope's text
    -- columns in collation "C" (the first column in the table's order that
    -- is wrong is named)
    SELECT a.attname::text AS name, a.atttypid, a.attcollation, w.wants
      INTO c
      FROM pg_catalog.pg_attribute AS a
      LEFT JOIN (VALUES ('id', 'pg_catalog.int8'::pg_catalog.regtype::oid),
                        ('role', 'pg_catalog.regrole'::pg_catalog.regtype::oid),
                        ('tenant', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('caller', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('operation', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('key', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('fingerprint', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('state', state_type),
                        ('attempt', 'pg_catalog.int4'::pg_catalog.regtype::oid),
                        ('attempt_token', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('recovery_point', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('locked_until', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('on_lease_expiry', policy_type),
                        ('ttl', 'pg_catalog.interval'::pg_catalog.regtype::oid),
                        ('response_status', 'pg_catalog.int4'::pg_catalog.regtype::oid),
                        ('response_headers', 'pg_catalog.jsonb'::pg_catalog.regtype::oid),
                        ('response_body', 'pg_catalog.jsonb'::pg_catalog.regtype::oid),
                        ('resource_id', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('created_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('claimed_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('updated_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('completed_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('expires_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('response_raw_body', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('response_sealed', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('former_role', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('request_text_hash', 'pg_catalog.bytea'::pg_catalog.regtype::oid))
                AS w (name, wants) ON w.name OPERATOR(pg_catalog.=) a.attname::text
     WHERE a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attnum OPERATOR(pg_catalog.>) 0
       AND NOT a.attisdropped
       AND (a.atttypid OPERATOR(pg_catalog.<>) w.wants
            OR (a.attname::text OPERATOR(pg_catalog.=) ANY ('{tenant,caller,operation,key}'::text[])
                AND a.atttypid OPERATOR(pg_catalog.=) 'pg_catalog.text'::pg_catalog.regtype::oid
                AND a.attcollation OPERATOR(pg_catalog.<>) 'pg_catalog."C"'::pg_catalog.regcollation::oid))
     ORDER BY a.attnum LIMIT 1;
    IF FOUND AND c.atttypid OPERATOR(pg_catalog.=) c.wants THEN
        RAISE EXCEPTION 'column "%" of table "idem_records" has collation %, not "C"',
                        c.name, c.attcollation::pg_catalog.regcollation
            USING ERRCODE = 'collation_mismatch',
                  DETAIL = 'The idempotency extension finds a key by its bytes, as collation "C" orders and compares them.',
                  HINT = 'Change it back with ALTER TABLE ... ALTER COLUMN ... TYPE text COLLATE "C".';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'column "%" of table "idem_records" has type %, not %',
                        c.name, pg_catalog.format_type(c.atttypid, NULL), pg_catalog.format_type(c.wants, NULL)
            USING ERRCODE = 'datatype_mismatch',
                  DETAIL = pg_catalog.format('The idempotency extension reads and writes it as %s.',
                                             pg_catalog.format_type(c.wants, NULL)),
                  HINT = 'Change its type back with ALTER TABLE ... ALTER COLUMN ... TYPE.';
    END IF;

    -- the scope's unique index, by its name
    SELECT r.oid, r.relkind INTO i FROM pg_catalog.pg_class AS r
     WHERE r.relname OPERATOR(pg_catalog.=) 'idem_records_scope_key'
       AND r.relnamespace OPERATOR(pg_catalog.=) nsp;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'index "idem_records_scope_key" of extension "idempotency" does not exist'
            USING ERRCODE = 'undefined_object',
                  HINT = 'If it was renamed, rename it back.';
    END IF;
    idx := i.oid;
    SELECT x.indrelid OPERATOR(pg_catalog.=) tbl AND x.indisunique AND x.indimmediate
           AND x.indnkeyatts OPERATOR(pg_catalog.=) 5 AND x.indexprs IS NULL AND x.indpred IS NULL
           AND (SELECT pg_catalog.count(DISTINCT a.attname) FILTER (
                       WHERE a.attname::text OPERATOR(pg_catalog.=) ANY ('{role,tenant,caller,operation,key}'::text[])
                         AND k.coll OPERATOR(pg_catalog.=) CASE WHEN a.attname::text OPERATOR(pg_catalog.=) 'role'
                                                                THEN 0::oid
                                                                ELSE 'pg_catalog."C"'::pg_catalog.regcollation::oid END)
                  FROM ROWS FROM (pg_catalog.unnest(x.indkey::pg_catalog.int2[]),
                                  pg_catalog.unnest(x.indcollation::pg_catalog.oid[]))
                       WITH ORDINALITY AS k (attnum, coll, n)
                  JOIN pg_catalog.pg_attribute AS a
                    ON a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attnum OPERATOR(pg_catalog.=) k.attnum
                 WHERE k.n OPERATOR(pg_catalog.<=) 5) OPERATOR(pg_catalog.=) 5,
           x.indisvalid AND x.indisready AND x.indislive
      INTO fits, usable
      FROM pg_catalog.pg_index AS x
     WHERE x.indexrelid OPERATOR(pg_catalog.=) idx;
    IF coalesce(fits, false) AND NOT usable THEN
        RAISE EXCEPTION 'index "idem_records_scope_key" of extension "idempotency" is not valid'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A claim cannot find every record of a key through an index that is still being built or whose build failed.',
                  HINT = 'Wait for CREATE INDEX CONCURRENTLY to finish, or rebuild it with REINDEX INDEX idem_records_scope_key.';
    ELSIF NOT coalesce(fits, false) THEN
        RAISE EXCEPTION 'index "idem_records_scope_key" of extension "idempotency" is not the unique index of the scope and key'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'It must be unique on the columns role, tenant, caller, operation and key, in collation "C", without expressions or a predicate, and not deferrable.',
                  HINT = 'Recreate it as the extension''s installation script does.';
    END IF;

    -- id: an identity column, with a valid, immediate B-tree index unique
    -- on it alone, of the default operator class
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute AS a
                    WHERE a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) 'id'
                      AND NOT a.attisdropped AND a.attidentity OPERATOR(pg_catalog.<>) '') THEN
        RAISE EXCEPTION 'column "id" of table "idem_records" is not an identity column'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The idempotency extension gives a new record the next value of the identity of its id.',
                  HINT = 'Make it one again with ALTER TABLE idem_records ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH n), n past the greatest id.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS x
                     JOIN pg_catalog.pg_class AS r ON r.oid OPERATOR(pg_catalog.=) x.indexrelid
                     JOIN pg_catalog.pg_attribute AS a
                       ON a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) 'id'
                      AND NOT a.attisdropped
                    WHERE x.indrelid OPERATOR(pg_catalog.=) tbl AND x.indisunique AND x.indimmediate
                      AND x.indisvalid AND x.indisready AND x.indislive
                      AND x.indnkeyatts OPERATOR(pg_catalog.=) 1
                      AND x.indkey[0] OPERATOR(pg_catalog.=) a.attnum
                      AND r.relam OPERATOR(pg_catalog.=) (SELECT m.oid FROM pg_catalog.pg_am AS m
                                                           WHERE m.amname OPERATOR(pg_catalog.=) 'btree')
                      AND x.indexprs IS NULL AND x.indpred IS NULL
                      AND x.indclass[0] OPERATOR(pg_catalog.=) (
                          SELECT o.oid FROM pg_catalog.pg_opclass AS o
                           WHERE o.opcmethod OPERATOR(pg_catalog.=) r.relam AND o.opcdefault
                             AND o.opcintype OPERATOR(pg_catalog.=) a.atttypid)) THEN
        RAISE EXCEPTION 'table "idem_records" has no unique index on its column "id" alone'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The idempotency extension finds a record by its id through a valid, immediate B-tree index unique on id, without an expression or a predicate.',
                  HINT = 'Create one with CREATE UNIQUE INDEX ON idem_records (id), or make (id) the primary key again.';
    END IF;

    -- The SQL edition's functions act as their owner (this function runs
    -- inside them): the table is theirs to read and write, and no row
    -- level security hides or refuses a row from them.
    IF NOT idem__may_write_records(tbl)
       OR NOT pg_catalog.has_sequence_privilege(
                  pg_catalog.pg_get_serial_sequence(pg_catalog.format('%I.idem_records', nspname), 'id'),
                  'USAGE') THEN
        SELECT pg_catalog.pg_get_userbyid(r.relowner) INTO owner_name
          FROM pg_catalog.pg_class AS r WHERE r.oid OPERATOR(pg_catalog.=) tbl;
        IF owner_name OPERATOR(pg_catalog.<>) current_user THEN
            RAISE EXCEPTION 'the idempotency functions'' owner "%" may not read and write table "idem_records"', current_user
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = pg_catalog.format('The table is owned by "%s". The functions of the SQL edition run as their own owner, not as the table''s.', owner_name),
                      HINT = pg_catalog.format('Give the table back: ALTER TABLE %I.idem_records OWNER TO %I.',
                                               nspname, current_user);
        END IF;
        RAISE EXCEPTION 'the idempotency functions'' owner "%" may not read and write table "idem_records"', current_user
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'The functions of the SQL edition read, insert, update and delete its rows and take ids from its sequence as their owner, who owns the table but lacks a privilege on it.',
                  HINT = pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.idem_records TO %I; GRANT USAGE ON SEQUENCE %s TO %I.',
                                           nspname, current_user,
                                           pg_catalog.pg_get_serial_sequence(pg_catalog.format('%I.idem_records', nspname), 'id'),
                                           current_user);
    END IF;
    IF pg_catalog.row_security_active(tbl) THEN
        RAISE EXCEPTION 'row level security applies to table "idem_records" for the idempotency functions'' owner "%"', current_user
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'The functions of the SQL edition run as their own owner, to whom the table''s policies apply: they would hide records from a claim or refuse its writes.',
                  HINT = 'Keep idem_records owned by the functions'' owner, without FORCE ROW LEVEL SECURITY: the functions keep roles apart themselves.';
    END IF;
END
$$;

-- Whether the table plainly passes the check: what a session plans once
-- (statements without parameters, on one catalog each, keep one plan for
-- the session, shared by every function that checks) and then runs in a
-- fraction of a millisecond.  A table that does not pass, or a label the
-- edition does not know, is for idem__check_table() to explain; its many
-- statements are planned only then.  Built-in OIDs as the C edition names
-- them: collation "C" (950) and the B-tree operator class of bigint
-- (3124, which only a B-tree index has).
CREATE OR REPLACE FUNCTION idem__table_fits()
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tbl constant regclass := pg_catalog.to_regclass('idem_records');
BEGIN
    -- (a table of the session's in pg_temp, which the pinned search_path
    -- lists last, found when the edition's is renamed or dropped, is none)
    IF tbl IS NULL OR pg_catalog.to_regclass('idem_records_scope_key') IS NULL
       OR (SELECT r.relnamespace FROM pg_catalog.pg_class AS r WHERE r.oid OPERATOR(pg_catalog.=) tbl)
          OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()
       OR pg_catalog.to_regtype('idem_state') IS NULL
       OR pg_catalog.to_regtype('idem_lease_policy') IS NULL
       OR NOT idem__may_write_records(tbl)
       OR pg_catalog.row_security_active(tbl) THEN
        RETURN false;
    END IF;
    -- the labels, and no other (by their names: a label added in this
    -- transaction may not be used as a value yet); every column of the
    -- edition, of its type; the scope's texts in "C"; id an identity
    IF (SELECT pg_catalog.string_agg(l.label, ',' ORDER BY l.label COLLATE "C")
          FROM (SELECT CASE WHEN e.enumtypid OPERATOR(pg_catalog.=) pg_catalog.to_regtype('idem_state')
                            THEN 'state:' ELSE 'policy:' END OPERATOR(pg_catalog.||) e.enumlabel::text AS label
                  FROM pg_catalog.pg_enum AS e
                 WHERE e.enumtypid OPERATOR(pg_catalog.=) pg_catalog.to_regtype('idem_state')
                    OR e.enumtypid OPERATOR(pg_catalog.=) pg_catalog.to_regtype('idem_lease_policy')) AS l)
       OPERATOR(pg_catalog.<>) 'policy:retry,policy:unknown,state:failed,state:processing,state:retryable,state:succeeded,state:unknown'
       OR (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records')
           AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
           AND a.atttypid OPERATOR(pg_catalog.=) CASE a.attname::text
                   WHEN 'id' THEN 'pg_catalog.int8'::pg_catalog.regtype::oid
                   WHEN 'role' THEN 'pg_catalog.regrole'::pg_catalog.regtype::oid
                   WHEN 'state' THEN pg_catalog.to_regtype('idem_state')::oid
                   WHEN 'on_lease_expiry' THEN pg_catalog.to_regtype('idem_lease_policy')::oid
                   WHEN 'attempt' THEN 'pg_catalog.int4'::pg_catalog.regtype::oid
                   WHEN 'response_status' THEN 'pg_catalog.int4'::pg_catalog.regtype::oid
                   WHEN 'ttl' THEN 'pg_catalog.interval'::pg_catalog.regtype::oid
                   WHEN 'response_headers' THEN 'pg_catalog.jsonb'::pg_catalog.regtype::oid
                   WHEN 'response_body' THEN 'pg_catalog.jsonb'::pg_catalog.regtype::oid
                   ELSE CASE WHEN a.attname::text OPERATOR(pg_catalog.=) ANY (
                                      '{fingerprint,attempt_token,response_raw_body,response_sealed,request_text_hash}'::text[])
                             THEN 'pg_catalog.bytea'::pg_catalog.regtype::oid
                             WHEN a.attname::text OPERATOR(pg_catalog.=) ANY (
                                      '{locked_until,created_at,claimed_at,updated_at,completed_at,expires_at}'::text[])
                             THEN 'pg_catalog.timestamptz'::pg_catalog.regtype::oid
                             WHEN a.attname::text OPERATOR(pg_catalog.=) ANY (
                                      '{tenant,caller,operation,key,recovery_point,resource_id,former_role}'::text[])
                             THEN 'pg_catalog.text'::pg_catalog.regtype::oid END END
           AND (a.attcollation OPERATOR(pg_catalog.=) 950
                OR a.attname::text OPERATOR(pg_catalog.<>) ALL ('{tenant,caller,operation,key}'::text[]))
           AND (a.attidentity OPERATOR(pg_catalog.<>) '' OR a.attname OPERATOR(pg_catalog.<>) 'id'))
       OPERATOR(pg_catalog.<>) 27 THEN
        RETURN false;
    END IF;
    -- the scope's unique index, each of its five columns named once, text
    -- in "C"; a unique index on id alone
    RETURN (SELECT i.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records')
                   AND i.indisunique AND i.indimmediate AND i.indisvalid AND i.indisready
                   AND i.indislive AND i.indnkeyatts OPERATOR(pg_catalog.=) 5
                   AND i.indexprs IS NULL AND i.indpred IS NULL
                   AND (SELECT pg_catalog.count(DISTINCT a.attname)
                          FROM pg_catalog.pg_attribute AS a
                         WHERE a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                           AND a.attnum OPERATOR(pg_catalog.=) ANY (i.indkey::pg_catalog.int2[])
                           AND a.attname::text OPERATOR(pg_catalog.=) ANY ('{role,tenant,caller,operation,key}'::text[]))
                       OPERATOR(pg_catalog.=) 5
                   AND pg_catalog.array_to_string(i.indcollation::pg_catalog.oid[], ',') OPERATOR(pg_catalog.=) (
                       SELECT pg_catalog.string_agg(CASE WHEN a.attname OPERATOR(pg_catalog.=) 'role' THEN '0'
                                                         ELSE '950' END, ',' ORDER BY u.n)
                         FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS u (attnum, n)
                         JOIN pg_catalog.pg_attribute AS a
                           ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                          AND a.attnum OPERATOR(pg_catalog.=) u.attnum)
              FROM pg_catalog.pg_index AS i
             WHERE i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records_scope_key'))
       AND EXISTS (SELECT FROM pg_catalog.pg_index AS i
                    WHERE i.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records')
                      AND i.indisunique AND i.indimmediate AND i.indisvalid AND i.indisready
                      AND i.indislive AND i.indnkeyatts OPERATOR(pg_catalog.=) 1
                      AND i.indexprs IS NULL AND i.indpred IS NULL
                      AND i.indclass[0] OPERATOR(pg_catalog.=) 3124
                      AND i.indkey[0] OPERATOR(pg_catalog.=) (
                          SELECT a.attnum FROM pg_catalog.pg_attribute AS a
                           WHERE a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                             AND a.attname OPERATOR(pg_catalog.=) 'id'));
END
$$;

-- The table, or its scope index (scope_index), once the table passed the
-- check: the table's call checks it, the scope index's only looks the
-- index up by the name the check found it under (both are folded while
-- the one expression is planned, which fails if the check does).  See the
-- top of this file for why it is IMMUTABLE.
CREATE OR REPLACE FUNCTION idem__checked_relation(scope_index boolean)
RETURNS regclass
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT scope_index AND NOT coalesce(idem__table_fits(), false) THEN
        PERFORM idem__check_table();
    END IF;
    RETURN pg_catalog.to_regclass(CASE WHEN scope_index THEN 'idem_records_scope_key' ELSE 'idem_records' END);
END
$$;

-- True, once the table passed the check since it last changed.  Inlined
-- into the definer functions' first test.
CREATE OR REPLACE FUNCTION idem__table_checked()
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.pg_relation_filenode(idem__checked_relation(false)) IS DISTINCT FROM 0
   AND pg_catalog.pg_relation_filenode(idem__checked_relation(true)) IS DISTINCT FROM 0;

--
-- A statement that rewrites a table (ALTER TABLE ... ALTER COLUMN TYPE, a
-- volatile default, CLUSTER, VACUUM FULL) copies its rows to new storage
-- and discards the old: a record written or changed meanwhile, from an
-- expression the statement evaluates, goes to the old storage and is lost
-- with it (the key would answer proceed again, a record be deleted with
-- its archived copy lost).  The C edition refuses every write of its own
-- while a DDL statement runs in a transaction that holds the table
-- exclusively, which it learns from a hook SQL does not have.  While the
-- rows are copied, the new storage is a relation of the table's schema
-- named pg_temp_ and the table's OID, visible to the rewriting
-- transaction alone: the guard trigger (every INSERT and UPDATE of
-- idem_records) and each batch of the maintenance passes (their DELETEs
-- and the archive's INSERTs) look it up (one look-up of a name) and
-- refuse the write.  A write made before the copy begins (from a
-- table_rewrite event trigger, say) is copied with the rest, and kept.
--
CREATE OR REPLACE FUNCTION idem__refuse_write_during_rewrite(rel regclass)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('%I.%I',
           (SELECT n.nspname FROM pg_catalog.pg_class AS c
              JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
             WHERE c.oid OPERATOR(pg_catalog.=) rel),
           'pg_temp_' || rel::oid::text)) IS NOT NULL THEN
        RAISE EXCEPTION 'cannot write an idempotency record in a DDL statement while this transaction holds table "%" exclusively',
                        (SELECT c.relname FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) rel)
            USING ERRCODE = 'object_in_use',
                  DETAIL = 'The statement may be rewriting the table, and the record would be lost with its old storage.',
                  HINT = 'Claim, complete and clean up keys outside DDL statements, or once the transaction that altered the table has committed.';
    END IF;
END
$$;

-- src/20_canonical.sql
--
-- Canonical JSON and the request fingerprint (docs/fingerprint.md), and
-- idem_derive_key: the C edition's src/canonical.c and src/derive.c in SQL
-- and PL/pgSQL, giving the same bytes for every jsonb.
--
-- The canonical text is assembled from what jsonb already prints right:
-- a string scalar's text output (to_json of a text, or a jsonb string
-- cast to text) escapes exactly what RFC 8785 escapes, in the same way
-- (\" \\ \b \f \n \r \t, \u00xx in lower-case hex, nothing else), and
-- true, false and null print as themselves.  What has to be rebuilt is
-- the rest: whitespace, member order and numbers.
--
-- The fingerprint runs on every claim, and a query run from PL/pgSQL
-- costs more to start and end than a request costs to write.  So the
-- common document (idem__plain: no escape, no character from U+E000 on,
-- under 2 KB of jsonb_pretty text) is written from its jsonb_pretty text
-- by string functions in statements that are simple expressions, with one
-- call per container that holds containers and no query at all.  Any
-- other document is written from the jsonb: a query per object, which
-- sorts its names mapped to UTF-16 order, arrays element by element;
-- below idem__max_recursion levels the walk goes on with an explicit
-- stack, so that the deepest document jsonb accepts never overflows the
-- server's stack.
--
-- The small LANGUAGE sql helpers below are written to be inlined into the
-- statements that call them (one SELECT of an expression, not STRICT since
-- their CASE is not, no more volatile than their body, no SET clause): a
-- search_path pinned on them would stop the inlining and cost a function
-- call, and a plan, each time.  They call only pg_catalog functions.
--

-- Nesting handled by recursion before the explicit stack takes over: far
-- deeper than requests are, far shallower than the server's stack allows.
CREATE OR REPLACE FUNCTION idem__max_recursion() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 32 $$;

-- A member name as a key that sorts, byte for byte (COLLATE "C"), in the
-- order of its UTF-16 code units.  Code point order (which "C" gives) is
-- UTF-16 order except between characters outside the BMP (surrogates
-- D800-DFFF in UTF-16) and characters U+E000-U+FFFF, which UTF-16 puts
-- after them: each of the latter gets the prefix U+E001 and each astral
-- character U+E000, which keeps every other order.  Only names with a
-- character beyond ASCII need it.
CREATE OR REPLACE FUNCTION idem__utf16_key(name text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN octet_length(name) = length(name) THEN name
            ELSE regexp_replace(regexp_replace(name,
                     E'([\\uE000-\\uFFFF])', chr(57345) || E'\\1', 'g'),
                     E'([\\U00010000-\\U0010FFFF])', chr(57344) || E'\\1', 'g')
       END
$$;

-- A number whose plain text (numeric_out: no exponent, the scale's
-- trailing zeros) is not already in ECMAScript form: zero of any scale,
-- trailing zeros after the point, integers of 22 digits or more, values
-- below 1e-6.  With the value written as s * 10^(n-k), s of k digits
-- without trailing zeros: k <= n <= 21 digits then zeros; 0 < n <= 21 a
-- point inside; -6 < n <= 0 "0." then zeros; otherwise d.ddde+-(n-1).
CREATE OR REPLACE FUNCTION idem__number_rewrite(plain text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    negative boolean := left(plain, 1) = '-';
    unsigned text := ltrim(plain, '-');
    point integer := strpos(unsigned, '.');
    whole text;
    fraction text;
    digits text;
    zeros integer;
BEGIN
    IF plain IN ('NaN', 'Infinity', '-Infinity') THEN
        RAISE EXCEPTION 'cannot canonicalize a jsonb number that is NaN or infinite'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'JSON has no NaN or infinite numbers.';
    END IF;
    IF point = 0 THEN
        whole := unsigned;
        fraction := '';
    ELSE
        whole := left(unsigned, point - 1);
        fraction := rtrim(substr(unsigned, point + 1), '0');
    END IF;

    IF whole <> '0' THEN
        -- n is the length of the whole part, which has no leading zero
        IF length(whole) <= 21 THEN
            RETURN CASE WHEN negative THEN '-' ELSE '' END || whole
                   || CASE WHEN fraction = '' THEN '' ELSE '.' || fraction END;
        END IF;
        digits := rtrim(whole || fraction, '0');
        RETURN CASE WHEN negative THEN '-' ELSE '' END || left(digits, 1)
               || CASE WHEN length(digits) > 1 THEN '.' || substr(digits, 2) ELSE '' END
               || 'e+' || (length(whole) - 1)::text;
    END IF;

    IF fraction = '' THEN
        RETURN '0';             -- zero, whatever its sign or scale
    END IF;
    digits := ltrim(fraction, '0');
    zeros := length(fraction) - length(digits);     -- n = -zeros
    IF zeros < 6 THEN
        RETURN CASE WHEN negative THEN '-' ELSE '' END || '0.' || fraction;
    END IF;
    RETURN CASE WHEN negative THEN '-' ELSE '' END || left(digits, 1)
           || CASE WHEN length(digits) > 1 THEN '.' || substr(digits, 2) ELSE '' END
           || 'e-' || (zeros + 1)::text;
END;
$$;

-- The canonical text of a number, from its plain text.  Most numbers of
-- requests are already in ECMAScript form (integers below 1e21, decimals
-- without trailing zeros): they are recognised here without a call.
CREATE OR REPLACE FUNCTION idem__number(plain text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE
    WHEN strpos(plain, '.') = 0 THEN
        CASE WHEN length(plain) <= 21 THEN plain ELSE idem__number_rewrite(plain) END
    WHEN strpos(plain, '.') <= 22 AND right(plain, 1) <> '0'
         AND plain NOT LIKE '0.000000%' AND plain NOT LIKE '-0.000000%' THEN plain
    ELSE idem__number_rewrite(plain)
END
$$;

-- The canonical text of a container depth levels down, for any document:
-- a small nested container by the string path when it is plain by itself
-- (idem__plain), else an object's members sorted by a query and an array
-- written element by element.
CREATE OR REPLACE FUNCTION idem__container(doc jsonb, depth integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    parts text[] := '{}';
    plain bytea;
    i integer;
BEGIN
    IF depth >= idem__max_recursion() THEN
        RETURN idem__container_deep(doc);
    END IF;
    -- a small container of a large document may be plain
    IF depth > 0 AND pg_column_size(doc) <= 1000 THEN
        plain := idem__plain(doc);
        IF plain IS NOT NULL THEN
            RETURN convert_from(plain, getdatabaseencoding());
        END IF;
    END IF;
    IF jsonb_typeof(doc) = 'object' THEN
        RETURN idem__object_by_query(doc, depth);
    END IF;
    -- a long array in one query, which reads a stored value once, where
    -- doc -> i would read it whole for each element
    IF jsonb_array_length(doc) > 8 THEN
        RETURN '[' || (SELECT string_agg(idem__value(e.value, depth + 1), ',' ORDER BY e.n)
                         FROM jsonb_array_elements(doc) WITH ORDINALITY AS e(value, n)) || ']';
    END IF;
    FOR i IN 0 .. jsonb_array_length(doc) - 1 LOOP
        parts := parts || idem__value(doc -> i, depth + 1);
    END LOOP;
    RETURN '[' || array_to_string(parts, ',') || ']';
END;
$$;

-- The canonical text, in the database encoding, of a container of depth
-- depth (bracket: the byte of its opening bracket) whose members or
-- elements are written in body as idem__pretty leaves them: one a line,
-- containers already replaced by their canonical text (idem__pretty).
-- STABLE as getdatabaseencoding is, so that it is inlined.
CREATE OR REPLACE FUNCTION idem__pretty_join(body bytea, depth integer, bracket integer) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT convert_to(CASE
    WHEN bracket = 91 THEN
        '[' || replace(convert_from(body, getdatabaseencoding()), E',\n' || repeat(' ', 4 * depth + 4), ',') || ']'
    WHEN length(body) = 0 THEN '{}'
    ELSE '{"' || replace(array_to_string(tsvector_to_array(array_to_tsvector(
                     string_to_array(convert_from(substring(body FROM 2), getdatabaseencoding()),
                                     E',\n' || repeat(' ', 4 * depth + 4) || '"'))), ',"'),
                         chr(1), '":') || '}'
END, getdatabaseencoding())
$$;

-- The canonical text of a container of a plain document (idem__plain),
-- in the database encoding, from the container's text as jsonb_pretty
-- writes it, in which "": "" has become U+0001 and numbers have lost the
-- trailing zeros of their fraction; depth is the container's depth in the
-- document, which gives its indentation.
--
-- In such a text a line is a container's bracket or one member or element
-- (strings hold no line break, which would be escaped), and a quote can
-- only open or close a string.  So a bracket followed by a line break
-- opens a container, the first one found opens a container of the next
-- depth, and the line of that depth's indentation and closing bracket
-- closes it: each is replaced by its canonical text, which has no line
-- break.  Then the members or elements are the pieces between a comma, a
-- line break and the indentation, and in an object a quote; each name is
-- already written as RFC 8785 writes it.  An object's pieces, name U+0001
-- value, are sorted by array_to_tsvector, which sorts strings byte by
-- byte with a shorter one first on a common prefix: code point order of
-- the names (U+0001 is below every byte of a name, and no two names are
-- equal).  The text is searched as bytes: positions in text of more than
-- one byte per character cost a walk from its start.
CREATE OR REPLACE FUNCTION idem__pretty(pretty bytea, depth integer) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    indent bytea := E'\\x0a'::bytea || decode(repeat('20', 4 * depth + 4), 'hex');
    body bytea;
    nested bytea;
    open integer;
    other integer;
    close integer;
BEGIN
    -- between the opening line's break and indentation and the closing line's
    body := substring(pretty FROM 4 * depth + 7 FOR greatest(length(pretty) - 8 * depth - 8, 0));
    LOOP
        open := position(E'\\x7b0a'::bytea IN body);                     -- {\n
        other := position(E'\\x5b0a'::bytea IN body);                    -- [\n
        IF open = 0 OR (other > 0 AND other < open) THEN
            open := other;
        END IF;
        EXIT WHEN open = 0;
        close := open + length(indent)
                 + position(indent || CASE get_byte(body, open - 1) WHEN 123 THEN E'\\x7d'::bytea ELSE E'\\x5d'::bytea END
                            IN substring(body FROM open));
        nested := substring(body FROM open FOR close - open);
        -- a container without containers is written here, without a call
        IF position(E'\\x7b0a'::bytea IN substring(nested FROM 2)) = 0
           AND position(E'\\x5b0a'::bytea IN substring(nested FROM 2)) = 0 THEN
            nested := idem__pretty_join(substring(nested FROM 4 * depth + 11
                                                  FOR greatest(length(nested) - 8 * depth - 16, 0)),
                                        depth + 1, get_byte(nested, 0));
        ELSE
            nested := idem__pretty(nested, depth + 1);
        END IF;
        body := substring(body FROM 1 FOR open - 1) || nested || substring(body FROM close);
    END LOOP;
    RETURN idem__pretty_join(body, depth, get_byte(pretty, 0));
END;
$$;

-- The canonical text of an object depth levels down, its members sorted
-- by a query on their names mapped to UTF-16 order.
CREATE OR REPLACE FUNCTION idem__object_by_query(doc jsonb, depth integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN '{' || coalesce((
        SELECT string_agg(to_json(e.key)::text || ':' || idem__value(e.value, depth + 1), ','
                          ORDER BY idem__utf16_key(e.key) COLLATE "C")
          FROM jsonb_each(doc) AS e), '') || '}';
END;
$$;

-- The canonical text of a container, walked with an explicit stack: the
-- containers open on the way down, the names of each open object in
-- canonical order, and the next member or element of each.
CREATE OR REPLACE FUNCTION idem__container_deep(doc jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    parts text[] := '{}';
    containers jsonb[] := '{}';
    names jsonb[] := '{}';
    next_member integer[] := '{}';
    sizes integer[] := '{}';
    top integer := 0;
    child jsonb := doc;         -- the container to open next
    name text;
    i integer;
BEGIN
    LOOP
        IF child IS NOT NULL THEN
            top := top + 1;
            containers[top] := child;
            next_member[top] := 0;
            IF jsonb_typeof(child) = 'object' THEN
                names[top] := (SELECT coalesce(jsonb_agg(k ORDER BY idem__utf16_key(k) COLLATE "C"), '[]')
                                 FROM jsonb_object_keys(child) AS k);
                sizes[top] := jsonb_array_length(names[top]);
                parts := parts || '{'::text;
            ELSE
                names[top] := NULL;
                sizes[top] := jsonb_array_length(child);
                parts := parts || '['::text;
            END IF;
            child := NULL;
        END IF;

        i := next_member[top];
        IF i = sizes[top] THEN
            parts := parts || CASE WHEN names[top] IS NULL THEN ']' ELSE '}' END;
            top := top - 1;
            EXIT WHEN top = 0;
            CONTINUE;
        END IF;
        next_member[top] := i + 1;
        IF i > 0 THEN
            parts := parts || ','::text;
        END IF;

        IF names[top] IS NULL THEN
            child := containers[top] -> i;
        ELSE
            name := names[top] ->> i;
            parts := parts || (to_json(name)::text || ':');
            child := containers[top] -> name;
        END IF;
        IF jsonb_typeof(child) NOT IN ('object', 'array') THEN
            parts := parts || idem__value(child, 0);
            child := NULL;
        END IF;
    END LOOP;
    RETURN array_to_string(parts, '');
END;
$$;

-- The canonical text of a value found depth levels down (created after the
-- functions it calls, since the body of a SQL function is checked).
CREATE OR REPLACE FUNCTION idem__value(member jsonb, depth integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE jsonb_typeof(member)
    WHEN 'object' THEN idem__container(member, depth)
    WHEN 'array' THEN idem__container(member, depth)
    WHEN 'number' THEN idem__number(member::text)
    ELSE member::text           -- strings, true, false, null
END
$$;

-- The text jsonb_pretty writes for a plain document, else NULL, with its
-- numbers in ECMAScript form and "": "" (the end of each name) as U+0001.
-- A plain document has no backslash in its text (so no escape: no quote,
-- backslash or control character in any name or string), no character
-- from U+E000 on (so code point order is UTF-16 order), no number that
-- needs an exponent (from 1e21 on, or below 1e-6) and is short enough for
-- every piece that is sorted to fit in a lexeme (2047 bytes).  Most
-- requests are.
CREATE OR REPLACE FUNCTION idem__plain_pretty(doc jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    pretty text;
    chunks text[];
    ending text;
    i integer;
BEGIN
    -- indentation grows with depth: a deep document's text would be huge
    IF pg_catalog.pg_column_size(doc) > 6000 THEN
        RETURN NULL;
    END IF;
    pretty := pg_catalog.jsonb_pretty(doc);
    -- "": "" is taken for the end of a name: a name or string that begins
    -- with ": " would look the same after its opening quote, which always
    -- follows a space.  A number below 1e-6 is written 0.000000...
    IF pg_catalog.octet_length(pretty) > 2000 OR pg_catalog.strpos(pretty, E'\\') > 0
       OR pg_catalog.strpos(pretty, ' ": ') > 0 OR pg_catalog.strpos(pretty, '0.000000') > 0 THEN
        RETURN NULL;
    END IF;
    -- .abs() of anything but a number is an error, which a filter takes
    -- for false: this finds the numbers from 1e21 on, either sign (a
    -- regular expression for 22 digits costs more)
    IF pg_catalog.jsonb_path_exists(doc, 'lax $.** ? (@.abs() >= 1e21)') THEN
        RETURN NULL;
    END IF;
    IF pg_catalog.octet_length(pretty) <> pg_catalog.length(pretty)
       AND pretty ~ E'[\\uE000-\\U0010FFFF]' THEN
        RETURN NULL;
    END IF;
    -- A number ends a line, and only a number ends one with a digit: the
    -- text is cut after each number ending in 0, before its line break
    -- (and comma), which leaves the number's last 0 out.  The number is
    -- what follows the last space of a piece; when it has a point, its
    -- fraction loses its trailing zeros, and the point when nothing is
    -- left after it.
    IF pg_catalog.strpos(pretty, '.') > 0 THEN
        FOREACH ending IN ARRAY ARRAY[E'0,\n', E'0\n'] LOOP
            CONTINUE WHEN pg_catalog.strpos(pretty, ending) = 0;
            chunks := pg_catalog.string_to_array(pretty, ending);
            FOR i IN 1 .. pg_catalog.cardinality(chunks) - 1 LOOP
                IF pg_catalog.strpos(pg_catalog.split_part(chunks[i], ' ', -1), '.') > 0 THEN
                    chunks[i] := pg_catalog.rtrim(pg_catalog.rtrim(chunks[i], '0'), '.')
                                 || pg_catalog.ltrim(ending, '0');
                ELSE
                    chunks[i] := chunks[i] || ending;
                END IF;
            END LOOP;
            pretty := pg_catalog.array_to_string(chunks, '');
        END LOOP;
    END IF;
    RETURN pg_catalog.replace(pretty, '": ', pg_catalog.chr(1));
END;
$$;

-- The canonical text of a container, in the database encoding, when the
-- document is plain (idem__plain_pretty), else NULL: written by string
-- functions, one call per container that holds containers.
CREATE OR REPLACE FUNCTION idem__plain(doc jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN idem__pretty(pg_catalog.convert_to(idem__plain_pretty(doc), pg_catalog.getdatabaseencoding()), 0);
END;
$$;

-- The canonical text of any value, in the database encoding.  An object
-- of a plain document whose members hold scalars, containers of scalars
-- and arrays of objects of scalars (most requests) is written here, in
-- one call, from its idem__plain_pretty text:
--
-- A line of that text is a bracket or a member or element (strings hold
-- no line break), a quote only opens or closes a string, and indentation
-- is four spaces a level.  So a line break and four spaces, then a
-- closing bracket, ends a container of a member, and the pieces between
-- these are each the members before such a container and the container
-- up to its opening bracket, a line break and eight spaces, then its
-- members or elements, one a line at eight spaces.  The members of the
-- document are what lies between a comma, a line break, four spaces and
-- a quote.  Members are sorted by array_to_tsvector, which sorts strings
-- byte by byte with a shorter one first on a common prefix: code point
-- order of the names (U+0001 ends each name, below every byte of a name,
-- and no two names are equal).  Other documents go to idem__pretty, which
-- takes any plain container, or to idem__container, which takes any.
CREATE OR REPLACE FUNCTION idem__canonical_bytes(doc jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    pretty text;
    body text;
    chunks text[];
    parts text[];
    elements text[];
    flat boolean := true;
    i integer;
    j integer;
BEGIN
    IF pg_catalog.jsonb_typeof(doc) NOT IN ('object', 'array') THEN
        RETURN pg_catalog.convert_to(idem__value(doc, 0), pg_catalog.getdatabaseencoding());
    END IF;
    pretty := idem__plain_pretty(doc);
    IF pretty IS NULL THEN
        RETURN pg_catalog.convert_to(idem__container(doc, 0), pg_catalog.getdatabaseencoding());
    END IF;
    IF pg_catalog.jsonb_typeof(doc) <> 'object' OR pretty = E'{\n}' THEN
        RETURN idem__pretty(pg_catalog.convert_to(pretty, pg_catalog.getdatabaseencoding()), 0);
    END IF;
    -- the members, without the first one's opening quote
    body := pg_catalog.replace(pg_catalog.replace(pretty, E'{\n    "', ''), E'\n}', '');
    chunks := pg_catalog.string_to_array(
        CASE WHEN pg_catalog.strpos(body, E'[\n') = 0 THEN body
             ELSE pg_catalog.replace(body, E'\n    ]', E'\n    }') END,
        E'\n    }');
    -- each piece but the last ends with a container, opened by the only
    -- bracket that ends a line in the piece when the container holds no
    -- container (any bracket that does is followed by eight spaces or
    -- more); its members or elements follow eight spaces
    FOR i IN 1 .. pg_catalog.cardinality(chunks) - 1 LOOP
        parts := pg_catalog.string_to_array(chunks[i], E'{\n        ');
        IF pg_catalog.cardinality(parts) = 2 AND pg_catalog.strpos(chunks[i], E'[\n') = 0 THEN
            chunks[i] := parts[1] || '{' || pg_catalog.array_to_string(pg_catalog.tsvector_to_array(
                             pg_catalog.array_to_tsvector(pg_catalog.string_to_array(parts[2], E',\n        '))),
                             ',') || '}';
            CONTINUE;
        END IF;
        -- an array of objects that hold no container, members at twelve
        -- spaces: nothing else of it is on a line of its own
        parts := pg_catalog.string_to_array(chunks[i], E'[\n        {\n            ');
        IF pg_catalog.cardinality(parts) = 2
           AND pg_catalog.strpos(pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(parts[2],
                   E'\n        },\n        {\n            ', ''), E',\n            "', ''), E'\n        }', ''),
                   E'\n') = 0 THEN
            elements := pg_catalog.string_to_array(
                pg_catalog.replace(parts[2], E'\n        },\n        {\n            ', E'\n        }'),
                E'\n        }');
            FOR j IN 1 .. pg_catalog.cardinality(elements) - 1 LOOP
                elements[j] := '{' || pg_catalog.array_to_string(pg_catalog.tsvector_to_array(
                                   pg_catalog.array_to_tsvector(pg_catalog.string_to_array(
                                       elements[j], E',\n            '))), ',') || '}';
            END LOOP;
            chunks[i] := parts[1] || '[' || pg_catalog.array_to_string(elements[1:pg_catalog.cardinality(elements) - 1], ',') || ']';
            CONTINUE;
        END IF;
        parts := CASE WHEN pg_catalog.strpos(chunks[i], E'{\n') = 0 THEN pg_catalog.string_to_array(chunks[i], E'[\n        ') END;
        IF coalesce(pg_catalog.cardinality(parts), 0) <> 2 THEN
            flat := false;
            EXIT;
        END IF;
        chunks[i] := parts[1] || '[' || pg_catalog.replace(parts[2], E',\n        ', ',') || ']';
    END LOOP;
    IF NOT flat THEN
        RETURN idem__pretty(pg_catalog.convert_to(pretty, pg_catalog.getdatabaseencoding()), 0);
    END IF;
    RETURN pg_catalog.convert_to(pg_catalog.replace(
        '{"' || pg_catalog.array_to_string(pg_catalog.tsvector_to_array(pg_catalog.array_to_tsvector(
                    pg_catalog.string_to_array(pg_catalog.array_to_string(chunks, ''), E',\n    "'))), ',"')
        || '}', pg_catalog.chr(1), '":'), pg_catalog.getdatabaseencoding());
END;
$$;

-- The request fingerprint, for the edition's own functions: without a
-- search_path of its own (which would be set and reset at each call) and
-- inlined into the statement that calls it.
CREATE OR REPLACE FUNCTION idem__fingerprint(doc jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT pg_catalog.sha256(idem__canonical_bytes(doc))
$$;

-- RFC 8785 canonical JSON text of a value, with numbers kept exact.
CREATE OR REPLACE FUNCTION idem_canonical(value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN convert_from(idem__canonical_bytes(value), getdatabaseencoding());
END;
$$;

COMMENT ON FUNCTION idem_canonical(jsonb) IS
    'RFC 8785 canonical JSON text of a jsonb value, with numbers kept exact';

-- SHA-256 of the canonical text: the request fingerprint of idem_claim.
-- The bytes hashed are the text's in the database encoding, as the C
-- edition hashes them (UTF-8 in the databases that hold non-ASCII text).
CREATE OR REPLACE FUNCTION idem_fingerprint(value jsonb) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN idem__fingerprint(value);
END;
$$;

COMMENT ON FUNCTION idem_fingerprint(jsonb) IS
    'SHA-256 of idem_canonical(value) in UTF-8: the request fingerprint';

-- A deterministic key for a downstream call or an outbox event, derived
-- from the command's idempotency key and a step name: the SHA-256 of a
-- domain string (with its terminating NUL byte, as the C edition hashes
-- it) and of key and step, each prefixed by its length in 4 bytes, so that
-- ("ab", "c") and ("a", "bc") differ; its first 16 bytes as a UUID of
-- version 8.  Not STRICT: a NULL key must not quietly give a NULL key.
CREATE OR REPLACE FUNCTION idem_derive_key(key text, step text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    setting text := nullif(btrim(current_setting('idempotency.max_key_length', true)), '');
    max_length integer := 255;
    key_bytes bytea;
    step_bytes bytea;
    digest bytea;
    bad text;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'key must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF step IS NULL THEN
        RAISE EXCEPTION 'step must not be null' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF setting IS NOT NULL THEN
        IF setting !~ '^[+-]?[0-9]{1,9}$' THEN
            RAISE EXCEPTION 'invalid value for parameter "idempotency.max_key_length": "%"', setting
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        max_length := setting::integer;
        IF max_length NOT BETWEEN 1 AND 8192 THEN
            RAISE EXCEPTION '% is outside the valid range for parameter "idempotency.max_key_length" (1 .. 8192)',
                max_length USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    key_bytes := convert_to(key, getdatabaseencoding());
    IF length(key_bytes) = 0 THEN
        RAISE EXCEPTION 'idempotency key must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(key_bytes) > max_length THEN
        RAISE EXCEPTION 'idempotency key is too long'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('The key is %s bytes long; the limit is %s.', length(key_bytes), max_length),
                  HINT = 'Raise idempotency.max_key_length to accept longer keys.';
    END IF;
    -- the first byte outside printable ASCII begins the first such character
    bad := substring(key FROM E'[^\\x20-\\x7e]');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'idempotency key must be printable ASCII'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('Byte %s of the key is 0x%s.', strpos(key, bad),
                                  lpad(to_hex(get_byte(convert_to(bad, getdatabaseencoding()), 0)), 2, '0'));
    END IF;

    step_bytes := convert_to(step, getdatabaseencoding());
    IF length(step_bytes) = 0 THEN
        RAISE EXCEPTION 'step must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(step_bytes) > max_length THEN
        RAISE EXCEPTION 'step is too long'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('It is %s bytes long; the limit is %s.', length(step_bytes), max_length);
    END IF;
    bad := substring(step FROM E'[\\x01-\\x1f\\x7f]');
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'step must not contain control characters'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('Byte %s is 0x%s.', octet_length(left(step, strpos(step, bad) - 1)) + 1,
                                  lpad(to_hex(ascii(bad)), 2, '0'));
    END IF;

    digest := sha256(E'\\x6964656d706f74656e6379206465726976655f6b657920763100'::bytea
                     || int4send(length(key_bytes)) || key_bytes
                     || int4send(length(step_bytes)) || step_bytes);
    digest := set_byte(digest, 6, (get_byte(digest, 6) & 15) | 128);      -- version 8
    digest := set_byte(digest, 8, (get_byte(digest, 8) & 63) | 128);      -- variant 10
    RETURN encode(substring(digest FROM 1 FOR 16), 'hex')::uuid::text;
END;
$$;

-- src/30_validate.sql
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

-- src/35_identity.sql
--
-- Who a call acts for.
--
-- The application role gets EXECUTE on the public functions and nothing
-- else: the functions that read or write records are SECURITY DEFINER,
-- owned by the installing role.  The role a call acts for, the C edition's
-- current_user at the call, is taken by the public function itself, a thin
-- LANGUAGE sql wrapper that PostgreSQL inlines into the caller's query, and
-- passed to the definer function, which accepts it only if the session's
-- user may act as that role (SET ROLE could give it no more) and that role
-- may execute the public function it came through.  So a direct call of a
-- definer function can claim nothing that the public function would not
-- give, and a role that was not granted EXECUTE gets nothing.
--
-- A public function called from inside another SECURITY DEFINER function
-- acts for that function's owner, as in the C edition; it is refused here
-- when the session's user could not become that owner.
--

-- Whether a session of member may act as role: what SET ROLE would allow
-- (membership on 15; membership with the SET option from 16).
CREATE OR REPLACE FUNCTION idem__may_become(member name, role regrole)
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.pg_has_role(member, role,
                              CASE WHEN pg_catalog.current_setting('server_version_num')::integer >= 160000
                                   THEN 'SET' ELSE 'MEMBER' END);

-- The role a call acts for, checked: session_user may become it, and it may
-- execute the public function the call came through.
CREATE OR REPLACE FUNCTION idem__acting_role(role regrole, via regprocedure)
RETURNS regrole
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (the table first, as in idem__plain_role: 16_table.sql)
    IF NOT idem__table_checked() THEN
        RETURN NULL;
    END IF;
    IF role IS NULL THEN
        -- current_user named no role: a rename of the calling role committed
        -- between the lookup of its name and the lookup of that name (the C
        -- edition takes the role's identity itself, which SQL cannot)
        RAISE EXCEPTION 'could not identify the calling role'
            USING ERRCODE = 'serialization_failure',
                  DETAIL = 'The role was renamed while the call ran.',
                  HINT = 'Retry the call: nothing was written.';
    END IF;
    IF NOT idem__may_become(session_user, role) THEN
        RAISE EXCEPTION 'permission denied to act as role "%"', role
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('Session user "%s" cannot become that role.', session_user),
                  HINT = 'Call the idem_* functions as the role itself, or SET ROLE to it first.';
    END IF;
    IF NOT pg_catalog.has_function_privilege(role, via, 'EXECUTE') THEN
        RAISE EXCEPTION 'permission denied for function %', pg_catalog.split_part(via::text, '(', 1)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN role;
END
$$;

-- The caller a scope stores: the empty string for the role itself (a NULL
-- caller), which no call can name; a caller that names the calling role is
-- refused, since after a rename the same text would name another caller.
CREATE OR REPLACE FUNCTION idem__scope_caller(role regrole, caller text)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF caller IS NULL THEN
        RETURN '';
    END IF;
    PERFORM idem__check_name(caller, 'caller', false);
    IF caller = pg_catalog.pg_get_userbyid(role) THEN
        RAISE EXCEPTION 'caller must not name the calling role'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A role''s own records are its default scope; a caller names someone calling within the role.',
                  HINT = 'Pass no caller (or NULL) for the role itself.';
    END IF;
    RETURN caller;
END
$$;

-- Whether a role may act on every role's records: the owner of
-- idem_records, a role with its privileges, or a superuser.
CREATE OR REPLACE FUNCTION idem__is_operator(role regrole)
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.pg_has_role(role,
                              (SELECT c.relowner FROM pg_catalog.pg_class AS c
                                WHERE c.oid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass),
                              'USAGE');

-- src/40_token.sql
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

-- src/45_claim.sql
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

-- src/50_attempt.sql
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

-- src/60_maintenance.sql
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

-- src/90_grants.sql
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

-- <<< the SQL of sql_edition/src/
COMMIT;
