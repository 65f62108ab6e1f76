# test/editions/canonical_schemas.sh, sourced after scripts/lib.sh once a
# cluster is started: the C edition in schema c and the SQL edition's
# canonical functions (sql_edition/src/20_canonical.sql, which need nothing
# else of the edition) in schema sqled, in database postgres, with their
# search_path pinned as the edition's installer (90_grants.sql) pins it:
# the public functions, not the idem__ helpers, which run under their
# caller's search_path (and LANGUAGE sql ones are inlined).
install_canonical_schemas() {
    local bindir
    bindir=$("$PG_CONFIG" --bindir)
    log "the C edition in schema c, the SQL edition's canonical functions in schema sqled"
    as_postgres "$bindir/psql" -U postgres -X -q -v ON_ERROR_STOP=1 \
        -c "CREATE SCHEMA c; CREATE EXTENSION idempotency SCHEMA c; CREATE SCHEMA sqled;"
    as_postgres env PGOPTIONS="-c search_path=sqled" "$bindir/psql" -U postgres -X -q \
        -v ON_ERROR_STOP=1 -f "$IDEM_TMP/src/sql_edition/src/20_canonical.sql"
    as_postgres "$bindir/psql" -U postgres -X -q -v ON_ERROR_STOP=1 <<'SQL'
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
              WHERE p.pronamespace = 'sqled'::regnamespace AND l.lanname <> 'sql'
                AND p.proname NOT LIKE 'idem\_\_%' LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, sqled, pg_temp', f);
    END LOOP;
END;
$$;
SQL
}
