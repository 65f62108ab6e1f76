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
    former_role        text COLLATE "C"
);

-- The copy looks up (id, claimed_at); pruning goes by archived_at.
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

-- An integer setting, in its base unit (unit: NULL, 's', 'ms', 'B' or
-- 'kB'), parsed as PostgreSQL parses an integer setting: a number (a
-- fraction is rounded), optionally followed by a unit of the same kind.
CREATE OR REPLACE FUNCTION idem_setting_integer(
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
    parts := regexp_match(raw, '^\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$');
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
    number := parts[1]::numeric;
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
    result := round(number * factor);
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
CREATE OR REPLACE FUNCTION idem_setting_enum(name text, boot text, allowed text[])
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
CREATE OR REPLACE FUNCTION idem_setting_boolean(name text, boot boolean)
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
CREATE OR REPLACE FUNCTION idem_key_hash_prefix(key text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT left(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 8) $$;

-- message with every occurrence of the key, as it is or written as
-- quote_literal, an identifier, a row's field or a JSON string writes it,
-- replaced by "<key PREFIX>": a trigger or a constraint of the owner's may
-- quote the key in its error.  Longest form first: a shorter one may be
-- part of a longer one.
CREATE OR REPLACE FUNCTION idem_redact_key(message text, key text)
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
                           replace(replace(key, '\', '\\'), '''', ''''''),   -- quote_literal
                           replace(key, '''', ''''''),                       -- a literal
                           replace(replace(key, '\', '\\'), '"', '""'),      -- a row's field
                           replace(key, '"', '""'),                          -- an identifier
                           replace(replace(key, '\', '\\'), '"', '\"')       -- an array element, JSON
                       ]) WITH ORDINALITY AS v(form, n)
                 ORDER BY v.form, v.n) AS f
         ORDER BY length(f.form) DESC, f.n
    LOOP
        result := replace(result, form, '<key ' || idem_key_hash_prefix(key) || '>');
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
CREATE OR REPLACE FUNCTION idem_pass_sql(pass text, kind text, archive boolean)
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
        ' completed_at, expires_at, response_raw_body, response_sealed, former_role';
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
CREATE OR REPLACE FUNCTION idem_error_concerns_rows(sqlstate text)
RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT left(sqlstate, 2) NOT IN ('08', '40', '42', '53', '54', '55', '57', '58', 'XX')
$$;

-- Report a record a pass could not change (err_message NULL: its statement
-- left it unchanged without an error), after cleanup made it a tombstone
-- if it can (so that it does not keep its response while its deletion is
-- tried again).  Returns how many records became tombstones (0 or 1).
CREATE OR REPLACE FUNCTION idem_pass_skip(
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
            EXECUTE idem_pass_sql('purge', 'one', archive)
               INTO purged_ids, kept_ids
              USING NULL::timestamptz, 1, ARRAY[record_id], NULL::timestamptz;
            tombstone := cardinality(kept_ids) = 0;
        EXCEPTION WHEN OTHERS THEN
            IF NOT idem_error_concerns_rows(SQLSTATE) THEN
                RAISE;
            END IF;
        END;
    END IF;

    SELECT r.key INTO record_key FROM idem_records AS r WHERE r.id = record_id;
    message := CASE
        WHEN err_message IS NULL
            THEN 'its statement left it unchanged (a trigger may have kept it)'
        WHEN record_key IS NOT NULL THEN idem_redact_key(err_message, record_key)
        ELSE err_message END;
    RAISE WARNING 'idempotency % skipped record % (key hash %): %',
                  pass, record_id, coalesce(idem_key_hash_prefix(record_key), '-'), message
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
CREATE OR REPLACE FUNCTION idem_pass_batch(
    pass        text,
    batch_limit integer,
    INOUT skipped bigint[],
    OUT changed bigint,
    OUT purged  bigint,
    OUT more    boolean)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    grace constant integer := idem_setting_integer('idempotency.cleanup_grace',
                                                   600, 0, 2147483647, 's');
    tombstone_ttl constant integer := idem_setting_integer('idempotency.tombstone_ttl',
                                                           604800, 0, 2147483647, 's');
    archive constant boolean := pass <> 'lease expiry'
        AND idem_setting_enum('idempotency.cleanup_action', 'delete',
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
    IF archive AND to_regclass('idem_records_archive') IS NULL THEN
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
        EXECUTE idem_pass_sql(pass, 'batch', archive)
           INTO done_ids, kept_ids
          USING cutoff, batch_limit, skipped, cleanup_cutoff;
    EXCEPTION WHEN OTHERS THEN
        IF NOT idem_error_concerns_rows(SQLSTATE) THEN
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
            purged := purged + idem_pass_skip(pass, id, NULL, NULL, archive, tombstone_ttl > 0);
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
    EXECUTE idem_pass_sql(pass, 'pick', archive)
       INTO picked
      USING cutoff, lim, skipped, cleanup_cutoff;
    FOREACH id IN ARRAY picked LOOP
        IF done_ids IS NOT NULL AND id = ANY (done_ids) THEN
            -- changed by the batch and due again (an AFTER trigger undid it)
            purged := purged + idem_pass_skip(pass, id, NULL, NULL, archive, tombstone_ttl > 0);
            skipped := skipped || id;
            changed := changed - 1;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE idem_pass_sql(pass, 'one', archive)
               INTO one_ids, one_kept
              USING cutoff, lim, ARRAY[id], cleanup_cutoff;
            changed := changed + cardinality(one_ids);
            IF cardinality(one_ids) = 0 THEN
                purged := purged + idem_pass_skip(pass, id, NULL, NULL, archive, tombstone_ttl > 0);
                skipped := skipped || id;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            IF NOT idem_error_concerns_rows(SQLSTATE) THEN
                RAISE;
            END IF;
            purged := purged + idem_pass_skip(pass, id, SQLSTATE, SQLERRM, archive, tombstone_ttl > 0);
            skipped := skipped || id;
        END;
    END LOOP;
    more := CASE WHEN batch_failed THEN cardinality(picked) >= batch_limit
                 ELSE cardinality(picked) > 0 END;
END
$$;

-- An optional positive argument: the setting when NULL.
CREATE OR REPLACE FUNCTION idem_positive_argument(value integer, name text, setting integer)
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
    wanted constant integer := idem_positive_argument(max_rows, 'max_rows',
        idem_setting_integer('idempotency.cleanup_batch_size', 200, 1, 1000000));
    skipped bigint[] := '{}';
    batch record;
    expired bigint := 0;
    more boolean := true;
BEGIN
    WHILE more AND expired < wanted LOOP
        SELECT * INTO batch FROM idem_pass_batch('lease expiry', (wanted - expired)::integer, skipped);
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
    size constant integer := idem_positive_argument(batch_size, 'batch_size',
        idem_setting_integer('idempotency.cleanup_batch_size', 200, 1, 1000000));
    batches constant integer := idem_positive_argument(max_batches, 'max_batches',
        idem_setting_integer('idempotency.cleanup_max_batches', 500, 1, 2147483647));
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
            SELECT * INTO batch FROM idem_pass_batch(pass, size, skipped);
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
    size := %1$I.idem_setting_integer('idempotency.cleanup_batch_size', 200, 1, 1000000);
    max_batches := %1$I.idem_setting_integer('idempotency.cleanup_max_batches', 500, 1, 2147483647);
    delay := %1$I.idem_setting_integer('idempotency.cleanup_delay', 50, 0, 10000, 'ms');
    FOREACH pass IN ARRAY ARRAY['lease expiry', 'cleanup', 'purge'] LOOP
        skipped := '{}';
        batches := 0;
        total := 0;
        LOOP
            failed := false;
            BEGIN
                SELECT * INTO batch FROM %1$I.idem_pass_batch(pass, size, skipped);
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
CREATE OR REPLACE FUNCTION idem_list_for(
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
    IF caller_role IS NULL
       OR NOT pg_has_role(session_user, caller_role,
                          CASE WHEN current_setting('server_version_num')::integer >= 160000
                               THEN 'SET' ELSE 'MEMBER' END)
       OR NOT has_function_privilege(caller_role,
                                     'idem_list(text, text, interval, integer)', 'EXECUTE') THEN
        RAISE EXCEPTION 'permission denied for function idem_list'
            USING ERRCODE = '42501',
                  HINT = 'Call idem_list() as the role whose records it lists.';
    END IF;
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
        key_limit := idem_setting_integer('idempotency.max_key_length', 255, 1, 8192);
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
        IF days > 365250 OR days * 86400 + extract(epoch FROM $4 - date_trunc('day', $4)) > 365250 * 86400 THEN
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
SELECT * FROM idem_list_for(quote_ident(current_user)::regrole, $1, $2, $3, $4)
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
    -- from inlining them, so their bodies name the schema themselves
    inlined constant text[] := ARRAY[]::text[];
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
           AND p.proname OPERATOR(pg_catalog.~~) 'idem\_%'
           AND p.prokind OPERATOR(pg_catalog.=) 'f'
           AND NOT (p.oid::pg_catalog.regprocedure::text OPERATOR(pg_catalog.=) ANY (inlined))
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f.signature, schema_oid::pg_catalog.regnamespace::text);
    END LOOP;
END
$grants$;

-- <<< the SQL of sql_edition/src/
COMMIT;
