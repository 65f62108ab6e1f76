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
