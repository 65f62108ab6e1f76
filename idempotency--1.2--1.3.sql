/* idempotency--1.2--1.3.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit

--
-- Version 1.3.  The scripts of 1.0, 1.1 and 1.2 are never changed: a new
-- install runs them and then this script, and an installed 1.2 reaches 1.3
-- through this script alone (sql/upgrade.sql checks that both end with the
-- same objects and that every record is kept).  Calls written for 1.2 keep
-- working unchanged.
--

--
-- A record belongs to a role, not to a name.  Until 1.2 the column role
-- held current_user's name: a renamed role lost its records (a retry of a
-- completed payment proceeded again), and a new role given a dropped
-- role's name found the dropped role's. From 1.3 it holds the role's
-- identity, as regrole: it shows the role's name, pg_dump writes the name
-- and a restore finds the role by it, pg_upgrade keeps role OIDs.
--
-- The caller of a record that its role made without naming another caller
-- was that role's name too; it is the empty string now, which no call can
-- pass (a caller must not be empty).  The functions' caller defaults to
-- NULL, the role itself, instead of current_user; a caller that names the
-- calling role is refused (22023), since after a rename the same text would
-- name another caller (src/security.c, idem_scope_caller).
--
-- A record whose name matches no role when this script runs is kept,
-- matched by no role (role NULL), its name in former_role, and listed to
-- the owner in idem_records_without_role until it expires and cleanup
-- deletes it like any other.
--
-- Nothing is read or written between the statements: each ALTER TABLE
-- rewrites the table once, its USING expressions reading the rows as they
-- were before it, and the guard trigger does not fire on a rewrite.
--
DO $convert$
DECLARE
    t text;
BEGIN
    -- the archive keeps records as they are: the same conversion, so that
    -- a copy keeps its role however it is renamed
    FOREACH t IN ARRAY ARRAY['idem_records', 'idem_records_archive'] LOOP
        EXECUTE format('ALTER TABLE %I ADD COLUMN former_role text COLLATE "C"', t);
        EXECUTE format($sql$
            ALTER TABLE %I
                ALTER COLUMN former_role TYPE text COLLATE "C"
                    USING (CASE WHEN pg_catalog.to_regrole(pg_catalog.quote_ident(role)) IS NULL
                                THEN role END),
                ALTER COLUMN caller TYPE text COLLATE "C"
                    USING (CASE WHEN caller OPERATOR(pg_catalog.=) role
                                 AND pg_catalog.to_regrole(pg_catalog.quote_ident(role)) IS NOT NULL
                                THEN '' ELSE caller END),
                ALTER COLUMN role DROP DEFAULT,
                ALTER COLUMN role DROP NOT NULL,
                ALTER COLUMN role TYPE regrole
                    USING pg_catalog.to_regrole(pg_catalog.quote_ident(role))
            $sql$, t);
    END LOOP;
END
$convert$;
ALTER TABLE idem_records
    ALTER COLUMN role SET DEFAULT pg_catalog.to_regrole(pg_catalog.quote_ident(current_user));

COMMENT ON COLUMN idem_records.role IS
    'The role whose record this is (its identity; a rename keeps it). NULL: a name that matched no role when 1.3 was installed, kept in former_role.';
COMMENT ON COLUMN idem_records.caller IS
    'Who called within the role: empty when the role called for itself.';
COMMENT ON COLUMN idem_records.former_role IS
    'The name the role column held before 1.3, for a record whose name matched no role then; NULL otherwise.';

--
-- A column the extension does not use: the SQL edition (sql_edition/), a
-- build of the same functions for servers that load no library, keeps in
-- it what lets a retry skip computing its request's fingerprint.  It is
-- here so that both editions have the same table and records move between
-- them as data (docs/editions.md); the archive's copy of a record has it
-- too.  Added without a default: no rewrite.
--
ALTER TABLE idem_records ADD COLUMN request_text_hash bytea;
ALTER TABLE idem_records_archive ADD COLUMN request_text_hash bytea;
COMMENT ON COLUMN idem_records.request_text_hash IS
    'SQL edition: SHA-256 of fingerprint and of the text of the request it was computed from; NULL when not known. The C extension does not use it.';

--
-- caller DEFAULT NULL: the role itself.  CREATE OR REPLACE keeps each
-- function's privileges and pg_init_privs.
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
    AS 'MODULE_PATHNAME', 'idem_claim'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

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
    AS 'MODULE_PATHNAME', 'idem_claim_many'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

CREATE OR REPLACE FUNCTION idem_replay(
    operation text,
    key       text,
    tenant    text DEFAULT '',
    caller    text DEFAULT NULL)
    RETURNS SETOF idem_decision
    AS 'MODULE_PATHNAME', 'idem_replay'
    LANGUAGE C STABLE PARALLEL RESTRICTED ROWS 1;

--
-- pg_dump writes a record's role by its name, and the restore finds the
-- role of that name, whatever its OID there.  A dropped role has no name:
-- its number would be written, and a restore would give the records to
-- whichever role has that number in the restoring cluster.  Records of a
-- dropped role are not dumped: no role can reach them (they are listed by
-- idem_records_without_role() until cleanup deletes them).  Records of no
-- role (role NULL, former_role set) are dumped.
--
SELECT pg_catalog.pg_extension_config_dump('idem_records',
    'WHERE role IS NULL OR EXISTS (SELECT FROM pg_catalog.pg_roles AS a'
    || ' WHERE a.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');
SELECT pg_catalog.pg_extension_config_dump('idem_records_archive',
    'WHERE role IS NULL OR EXISTS (SELECT FROM pg_catalog.pg_roles AS a'
    || ' WHERE a.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)');

--
-- The records no role can reach any more: those whose name matched no role
-- when 1.3 was installed, and those of a role dropped since (its number
-- stands in role_oid).  They stay until they expire and cleanup deletes
-- them; the owner may delete them sooner (DELETE FROM idem_records WHERE
-- id IN (SELECT id FROM idem_records_without_role())).  A function, not a
-- view, so that the owner may still change the table's columns.  It reads
-- the table with the caller's privileges: only its owner may.
--
CREATE FUNCTION idem_records_without_role(
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
SELECT r.id, r.role::pg_catalog.oid, r.former_role, r.tenant, r.caller,
       r.operation, r.key, r.state, r.created_at, r.expires_at
  FROM @extschema@.idem_records AS r
 WHERE r.role IS NULL
    OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS a
                    WHERE a.oid OPERATOR(pg_catalog.=) r.role::pg_catalog.oid)
 ORDER BY r.id
$$;

COMMENT ON FUNCTION idem_records_without_role() IS
    'Idempotency records that belong to no existing role: a name no role had at the 1.3 update (former_role), or a role dropped since (role_oid)';
REVOKE ALL ON FUNCTION idem_records_without_role() FROM PUBLIC;
