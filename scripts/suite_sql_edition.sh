# scripts/suite_sql_edition.sh: the suite "sql_edition" of scripts/test.sh
# (sourced by it, after scripts/lib.sh).
#
# The SQL edition (sql_edition/) where no library of ours can be loaded: a
# cluster of the distribution's own PostgreSQL made from the files of its
# Debian packages alone (postgresql-N, postgresql-client-N and
# postgresql-N-cron, as dpkg lists them: nothing that `make install` put
# next to them), with pg_cron preloaded.  There:
#   - CREATE EXTENSION idempotency and LOAD 'idempotency' fail;
#   - a role that is no superuser, with CREATE on the database appdb,
#     installs the edition with the command of sql_edition/README.md, as
#     written;
#   - the pg_tle installer carries exactly the psql installer's SQL, which
#     uses only trusted languages and installs without a superuser;
#   - the shared tests of sql/ (pg_regress) and specs/ (pg_isolation_regress)
#     that sql_edition/test/shared_tests names run against it, the edition's
#     own setup file in place of sql/setup.sql;
#   - the invariant checker (test/invariants/check_invariants.py), the
#     maintenance passes run by its clients instead of the worker;
#   - examples/schema.sql as it is, run by the installing role, on the
#     edition in a schema of its own and in public;
#   - the client libraries' tests (Python, Node.js) and the Python example
#     service end to end;
#   - the job of sql_edition/README.md, scheduled with pg_cron by the
#     installing role, expires a lease and deletes an expired record,
#     polled for with a bound;
#   - the edition's own checks (sql_edition/test/*.sh);
#   - on the first version, both editions' canonical form and fingerprint
#     against an independent RFC 8785 implementation (test/jcs-differential).
# The cluster is stopped whatever happens (cleanup, scripts/lib.sh).

# sqled_major: the major version of $PG_CONFIG.
sqled_major() {
    "$PG_CONFIG" --version | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p'
}

# sqled_result NAME OK: one test of the count.
sqled_result() {
    if [ "$2" = 1 ]; then
        echo "sql_edition: $1 ... ok"
        passed=$((passed + 1))
    else
        echo "sql_edition: $1 ... FAILED"
        failed=$((failed + 1))
        sqled_failed=1
    fi
}

# sqled_copy_packages DIR: the files of the distribution's PostgreSQL
# packages (server, client, pg_cron) under DIR, as dpkg lists them: the
# server finds its share/ and lib/ folders relative to its bin/.
sqled_copy_packages() {
    local dir=$1 major pkg
    major=$(sqled_major)
    mkdir -p "$dir"
    for pkg in "postgresql-$major" "postgresql-client-$major" "postgresql-$major-cron"; do
        dpkg-query -L "$pkg" || return 1
    done | grep -E "^/usr/(lib|share)/postgresql/$major(/|$)" | sort -u >"$dir.files" || return 1
    tar -C / --no-recursion -cf - -T <(sed 's|^/||' "$dir.files") | tar -C "$dir" -xf - || return 1
    SQLED_BIN=$dir/usr/lib/postgresql/$major/bin
    SQLED_PGXS=$dir/usr/lib/postgresql/$major/lib/pgxs
}

# sqled_psql [PSQL OPTIONS]: psql of the copy, as postgres, on the suite's
# cluster.
sqled_psql() {
    as_postgres env PGHOST="$SQLED_HOST" PGPORT="$SQLED_PORT" "$SQLED_BIN/psql" -X "$@"
}

# sqled_start: the cluster, pg_cron preloaded and serving the database appdb,
# its jobs run by background workers (no connection to open).  The
# edition's settings are placeholders here; those of the invariant checker's
# pace are set as its TAP test sets them.
sqled_start() {
    local conf
    SQLED_HOST=$IDEM_TMP/sqled
    SQLED_DATA=$IDEM_TMP/sqled/data
    SQLED_PORT=$(free_port) || return 1
    as_postgres mkdir -p "$SQLED_HOST"
    as_postgres "$SQLED_BIN/initdb" -D "$SQLED_DATA" -A trust -U postgres --no-sync -E UTF8 \
        --locale=C >"$IDEM_TMP/sqled-initdb.log" 2>&1 || { cat "$IDEM_TMP/sqled-initdb.log"; return 1; }
    conf=$SQLED_DATA/postgresql.conf
    as_postgres tee -a "$conf" >/dev/null <<EOF
port = $SQLED_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$SQLED_HOST'
fsync = off
shared_preload_libraries = 'pg_cron'
cron.database_name = 'appdb'
cron.use_background_workers = on
max_worker_processes = 24
max_connections = 60
max_prepared_transactions = 4
$idem_log_prefix
EOF
    IDEM_STOP_CLUSTERS+=("$SQLED_BIN/pg_ctl|$SQLED_DATA")
    as_postgres env PGCTLTIMEOUT=600 "$SQLED_BIN/pg_ctl" -D "$SQLED_DATA" -l "$IDEM_TMP/sqled-server.log" \
        -w start >/dev/null || { cat "$IDEM_TMP/sqled-server.log"; return 1; }
}

# sqled_install_command: the command of sql_edition/README.md that installs
# the edition with psql, as written there (the first line of an sh block
# that runs psql on sql_edition/idempotency_sql.sql).
sqled_install_command() {
    awk '/^ *```/ { fence = !fence; sh = fence && $0 ~ /```(sh|bash|shell)$/; next }
         sh && /(^| )psql .*sql_edition\/idempotency_sql\.sql/ { sub(/^ +/, ""); print; exit }' \
        "$IDEM_ROOT/sql_edition/README.md" 2>/dev/null
}

# sqled_no_library: CREATE EXTENSION idempotency and LOAD 'idempotency'
# fail on the cluster, as where no library of ours was ever installed.
sqled_no_library() {
    local out ok=1
    out=$(sqled_psql -d postgres -c 'CREATE EXTENSION idempotency' 2>&1) && ok=0
    echo "$out" | grep -q 'extension "idempotency" is not available\|could not open extension control file' || ok=0
    out=$(sqled_psql -d postgres -c "LOAD 'idempotency'" 2>&1) && ok=0
    echo "$out" | grep -q 'could not access file "idempotency"' || ok=0
    [ "$(sqled_psql -d postgres -At -c "SELECT count(*) FROM pg_available_extensions
            WHERE name = 'idempotency'" 2>&1)" = 0 ] || ok=0
    sqled_result "CREATE EXTENSION idempotency and LOAD 'idempotency' fail: no library of ours" "$ok"
}

# sqled_install_app: the database appdb (the one the README's command
# names), the role idem_owner (no superuser, CREATE on appdb) and the
# edition installed by it with the README's command, as written; pg_cron
# created by the superuser, its schema open to idem_owner, as managed
# services set it up.
sqled_install_app() {
    local cmd ok=1 out=$IDEM_TMP/sqled-install.out
    cmd=$(sqled_install_command)
    if [ -z "$cmd" ]; then
        echo "sql_edition/README.md shows no psql command that runs sql_edition/idempotency_sql.sql"
        sqled_result "the role idem_owner (no superuser) installs the edition with the README's command" 0
        return 1
    fi
    log "installing the SQL edition: $cmd"
    sqled_psql -q -v ON_ERROR_STOP=1 -d postgres \
        -c "CREATE ROLE idem_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" \
        -c "CREATE DATABASE appdb" \
        -c "GRANT CREATE ON DATABASE appdb TO idem_owner" >"$out" 2>&1 || ok=0
    sqled_psql -q -v ON_ERROR_STOP=1 -d appdb -c "CREATE EXTENSION pg_cron" \
        -c "GRANT USAGE ON SCHEMA cron TO idem_owner" >>"$out" 2>&1 || ok=0
    # The command as written, from the top of the tree, as idem_owner.
    (cd "$IDEM_ROOT" && as_postgres env PGHOST="$SQLED_HOST" PGPORT="$SQLED_PORT" PGUSER=idem_owner \
        PATH="$SQLED_BIN:$PATH" bash -c "$cmd") >>"$out" 2>&1 || ok=0
    [ "$(sqled_psql -At -d appdb -c "SELECT rolsuper FROM pg_roles WHERE rolname = 'idem_owner'")" = f ] || ok=0
    SQLED_SCHEMA=$(sqled_psql -At -d appdb -c "SELECT n.nspname FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = 'idem_records'
        AND pg_get_userbyid(c.relowner) = 'idem_owner'")
    [ -n "$SQLED_SCHEMA" ] || ok=0
    [ "$ok" = 1 ] || cat "$out"
    sqled_result "the role idem_owner (no superuser) installs the edition with the README's command" "$ok"
    [ "$ok" = 1 ]
}

# sqled_tests KIND STATUS: the names of sql_edition/test/shared_tests of
# that kind and status, in order; of those, only the ones REGRESS (or
# ISOLATION) names when it is set, as for the C edition's suites.
sqled_tests() {
    local only=
    case $1 in regress) only=${REGRESS:-} ;; isolation) only=${ISOLATION:-} ;; esac
    awk -v k="$1" -v s="$2" -v only=" $only " '!/^#/ && $1 == k && $3 == s &&
        (only == "  " || index(only, " " $2 " ")) { print $2 }' "$SQLED_LIST"
}

# sqled_runs KIND: the tests of that kind that run against the edition
# (run and edition), in order, limited by REGRESS (or ISOLATION) as above.
sqled_runs() {
    local only=
    case $1 in regress) only=${REGRESS:-} ;; isolation) only=${ISOLATION:-} ;; esac
    awk -v k="$1" -v only=" $only " '!/^#/ && $1 == k && ($3 == "run" || $3 == "edition") &&
        (only == "  " || index(only, " " $2 " ")) { print $2 }' "$SQLED_LIST"
}

# sqled_check_list: every file of sql/ and specs/ is named once in
# sql_edition/test/shared_tests, with a known status; the edition's own
# files exist.  One test.
sqled_check_list() {
    local ok=1 f n kind dir ext problems
    problems=$(awk '!/^#/ && NF > 0 {
            if ($3 !~ /^(run|edition|c-only|pending)$/) print "unknown status: " $0
            else if ($3 != "run" && $3 != "edition" && NF < 4) print "no reason given: " $0
            if (seen[$1 " " $2]++) print "named twice: " $1 " " $2 }' "$SQLED_LIST")
    [ -z "$problems" ] || { echo "$problems"; ok=0; }
    for kind in regress isolation; do
        case $kind in regress) dir=sql ext=sql ;; isolation) dir=specs ext=spec ;; esac
        for f in "$IDEM_ROOT/$dir"/*."$ext"; do
            n=$(basename "$f" ".$ext")
            if ! awk -v k="$kind" -v n="$n" '!/^#/ && $1 == k && $2 == n { found = 1 } END { exit !found }' \
                    "$SQLED_LIST"; then
                echo "sql_edition/test/shared_tests does not name $dir/$n.$ext"
                ok=0
            fi
        done
        for n in $(awk -v k="$kind" '!/^#/ && $1 == k { print $2 }' "$SQLED_LIST"); do
            [ -f "$IDEM_ROOT/$dir/$n.$ext" ] || { echo "sql_edition/test/shared_tests names $dir/$n.$ext, which does not exist"; ok=0; }
        done
    done
    for n in $(sqled_tests regress edition); do
        [ -f "$IDEM_ROOT/sql_edition/test/sql/$n.sql" ] && [ -f "$IDEM_ROOT/sql_edition/test/expected/$n.out" ] \
            || { echo "no sql_edition/test/sql/$n.sql or expected/$n.out"; ok=0; }
    done
    for n in $(sqled_tests isolation edition); do
        [ -f "$IDEM_ROOT/sql_edition/test/specs/$n.spec" ] && [ -f "$IDEM_ROOT/sql_edition/test/expected/$n.out" ] \
            || { echo "no sql_edition/test/specs/$n.spec or expected/$n.out"; ok=0; }
    done
    sqled_result "sql_edition/test/shared_tests names every file of sql/ and specs/ once" "$ok"
}

# sqled_inputdir DIR KIND: a scratch input folder for pg_regress (sql/) or
# pg_isolation_regress (specs/): the shared files that run, the edition's
# own, and the expected outputs: the shared ones (their alternatives
# included, which hold for both editions), replaced by the edition's
# override where sql_edition/test/expected has one.
sqled_inputdir() {
    local dir=$1 kind=$2 n src ext f
    case $kind in regress) src=sql ext=sql ;; isolation) src=specs ext=spec ;; esac
    mkdir -p "$dir/$src" "$dir/expected"
    for n in $(sqled_tests "$kind" run); do
        cp "$IDEM_ROOT/$src/$n.$ext" "$dir/$src/"
        for f in "$IDEM_ROOT/expected/$n.out" "$IDEM_ROOT"/expected/"$n"_[0-9].out; do
            [ -f "$f" ] && cp "$f" "$dir/expected/"
        done
    done
    for n in $(sqled_tests "$kind" edition); do
        cp "$IDEM_ROOT/sql_edition/test/$src/$n.$ext" "$dir/$src/"
    done
    for n in $(sqled_tests "$kind" run) $(sqled_tests "$kind" edition); do
        if [ -f "$IDEM_ROOT/sql_edition/test/expected/$n.out" ]; then
            rm -f "$dir/expected/$n.out" "$dir/expected/$n"_[0-9].out
            cp "$IDEM_ROOT/sql_edition/test/expected/$n.out" "$dir/expected/"
        fi
    done
    cp "$IDEM_ROOT/sql_edition/idempotency_sql.sql" "$dir/"
    # (the test data, where the files read it in the C edition's run: from
    # the top of the tree)
    ln -s "$IDEM_TMP/src/test" "$dir/test"
    as_root chown -R postgres: "$dir"
}

# sqled_install_db DB: the edition installed in DB (made here) as the role
# idem_installer (no superuser, CREATE on DB and on its schema public), the
# way sql_edition/test/sql/setup.sql installs it for pg_regress.
sqled_install_db() {
    sqled_psql -q -v ON_ERROR_STOP=1 -d postgres \
        -c "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_installer') THEN
                CREATE ROLE idem_installer; END IF; END \$\$" \
        -c "CREATE DATABASE $1" -c "GRANT CREATE ON DATABASE $1 TO idem_installer" &&
    sqled_psql -q -v ON_ERROR_STOP=1 -d "$1" -c "GRANT CREATE ON SCHEMA public TO idem_installer" \
        -c "SET ROLE idem_installer" -f "$IDEM_ROOT/sql_edition/idempotency_sql.sql"
}

# sqled_count OUT STATUS: adds the "ok"/"FAILED" lines of a pg_regress or
# pg_isolation_regress output to the counts; a run that failed (STATUS)
# without a FAILED line (a missing expected file, say) counts as one
# failure.
sqled_count() {
    local p f
    p=$(grep -cE '(\.\.\. +ok|^ok [0-9]+ +[-+] )' "$1" || true)
    f=$(grep -cE '(\.\.\. +FAILED|^not ok [0-9]+ +[-+] )' "$1" || true)
    [ "$2" -eq 0 ] || [ "$f" -gt 0 ] || f=1
    passed=$((passed + p))
    failed=$((failed + f))
    [ "$f" -eq 0 ] || sqled_failed=1
}

# The per-call defaults, whatever the server says, as the Makefile's
# installcheck sets them for the C edition.
SQLED_PGOPTIONS="-c idempotency.default_ttl=1d -c idempotency.default_lease=30s -c idempotency.claim_wait=0"

# sqled_regress: the shared sql/ files against the edition (pg_regress of
# the copy, in the database contrib_regression as PGXS names it).
sqled_regress() {
    local dir=$IDEM_TMP/sqled/regress out=$IDEM_TMP/sqled-regress.out tests status=0
    tests=$(sqled_runs regress)
    log "suite: sql_edition regress ($(echo $tests | wc -w) files)"
    sqled_inputdir "$dir" regress
    (cd "$dir" && as_postgres env PGOPTIONS="$SQLED_PGOPTIONS" \
        "$SQLED_PGXS/src/test/regress/pg_regress" --inputdir=. --outputdir=. --bindir="$SQLED_BIN" \
        --host="$SQLED_HOST" --port="$SQLED_PORT" --dbname=contrib_regression --encoding=UTF8 \
        $tests) 2>&1 | tee "$out" || status=$?
    sqled_count "$out" "$status"
    if [ -s "$dir/regression.diffs" ]; then
        echo "===== sql_edition: $dir/regression.diffs"
        cat "$dir/regression.diffs"
    fi
}

# sqled_isolation: the shared specs against the edition, in a database
# where the installer ran (in place of --load-extension).
sqled_isolation() {
    local dir=$IDEM_TMP/sqled/isolation out=$IDEM_TMP/sqled-isolation.out tests status=0
    tests=$(sqled_runs isolation)
    log "suite: sql_edition isolation ($(echo $tests | wc -w) specs)"
    sqled_inputdir "$dir" isolation
    if ! sqled_install_db isolation_regression >"$out" 2>&1; then
        cat "$out"
        sqled_result "the edition installs in isolation_regression" 0
        return
    fi
    (cd "$dir" && as_postgres env PGOPTIONS="$SQLED_PGOPTIONS" \
        "$SQLED_PGXS/src/test/isolation/pg_isolation_regress" --inputdir=. --outputdir=output_iso \
        --bindir="$SQLED_BIN" --host="$SQLED_HOST" --port="$SQLED_PORT" --use-existing \
        --dbname=isolation_regression $tests) 2>&1 | tee -a "$out" || status=$?
    sqled_count "$out" "$status"
    if [ -s "$dir/output_iso/regression.diffs" ]; then
        echo "===== sql_edition: $dir/output_iso/regression.diffs"
        cat "$dir/output_iso/regression.diffs"
    fi
}

# sqled_pgtle: sql_edition/idempotency_sql_pgtle.sql hands pg_tle exactly
# the SQL that the psql installer runs (the text between its ">>>" and
# "<<<" lines), both as sql_edition/build.sh writes them; that SQL uses
# only trusted languages and no statement that needs a superuser.  pg_tle
# is in no Debian suite: the file runs here against a stand-in
# pgtle.install_extension that keeps what it is given, in a database of
# its own.
sqled_pgtle() {
    local ok=1 out=$IDEM_TMP/sqled-pgtle.out dir=$IDEM_TMP/sqled/pgtle
    as_postgres mkdir -p "$dir"
    sh "$IDEM_ROOT/sql_edition/build.sh" --check >"$out" 2>&1 || { cat "$out"; ok=0; }
    sqled_result "sql_edition/build.sh --check: both installers are as build.sh writes them" "$ok"

    ok=1
    sed -n '/^-- >>> the SQL of sql_edition\/src\//,/^-- <<< the SQL of sql_edition\/src\//p' \
        "$IDEM_ROOT/sql_edition/idempotency_sql.sql" | as_postgres tee "$dir/psql-body.sql" >/dev/null
    if [ "$(grep -c '^-- >>> \|^-- <<< ' "$dir/psql-body.sql")" != 2 ]; then
        echo "sql_edition/idempotency_sql.sql has not one '-- >>>' and one '-- <<<' line around its SQL"
        ok=0
    fi
    sqled_psql -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE pgtle_standin" >>"$out" 2>&1 || ok=0
    sqled_psql -q -v ON_ERROR_STOP=1 -d pgtle_standin >>"$out" 2>&1 <<'SQL' || ok=0
CREATE SCHEMA pgtle;
CREATE TABLE pgtle.given (name text, version text, description text, ext text, requires text[]);
CREATE FUNCTION pgtle.install_extension(name text, version text, description text, ext text,
                                        requires text[] DEFAULT NULL)
RETURNS boolean LANGUAGE sql
AS $$ INSERT INTO pgtle.given VALUES (name, version, description, ext, requires) RETURNING true $$;
SQL
    sqled_psql -q -v ON_ERROR_STOP=1 -d pgtle_standin -f "$IDEM_ROOT/sql_edition/idempotency_sql_pgtle.sql" \
        >>"$out" 2>&1 || ok=0
    # (psql -A -t prints the text and a newline; the body ends with one)
    sqled_psql -At -d pgtle_standin -c "SELECT ltrim(ext, E'\n') FROM pgtle.given" 2>>"$out" \
        | as_postgres tee "$dir/pgtle-body.sql" >/dev/null
    [ "$(sqled_psql -At -d pgtle_standin -c "SELECT count(*) || ' ' || min(name) || ' ' || min(version)
            FROM pgtle.given")" = "1 idempotency_sql 1.3" ] || { echo "pgtle.install_extension was not called once for idempotency_sql 1.3"; ok=0; }
    if ! diff -u "$dir/psql-body.sql" <(sed '$d' "$dir/pgtle-body.sql") >>"$out" 2>&1; then
        echo "the pg_tle installer does not carry exactly the psql installer's SQL"
        ok=0
    fi
    [ "$ok" = 1 ] || tail -n 60 "$out"
    sqled_result "the pg_tle installer hands pgtle.install_extension exactly the psql installer's SQL" "$ok"

    # Languages: every LANGUAGE clause names sql or plpgsql (what was
    # installed is checked too, by the edition's setup test).  Statements
    # only a superuser may run: none.
    ok=1
    if grep -noiE 'LANGUAGE[[:space:]]+[A-Za-z_"]+' "$dir/psql-body.sql" \
            | grep -viE 'LANGUAGE[[:space:]]+"?(sql|plpgsql)"?$'; then
        echo "a language other than sql or plpgsql (above)"
        ok=0
    fi
    if grep -niE '^[^-]*\b(ALTER[[:space:]]+SYSTEM|CREATE[[:space:]]+(EXTENSION|LANGUAGE|EVENT[[:space:]]+TRIGGER|FOREIGN[[:space:]]+DATA|ROLE|USER)|ALTER[[:space:]]+(ROLE|USER|DATABASE)|LOAD[[:space:]]|COPY\b.*\b(PROGRAM|TO|FROM)[[:space:]]+'"'"'|SET[[:space:]]+(LOCAL[[:space:]]+)?(session_replication_role|session_preload_libraries|local_preload_libraries)|pg_read_file|pg_ls_dir|lo_import|lo_export|dblink)' \
            "$dir/psql-body.sql"; then
        echo "a statement that needs a superuser or more than CREATE on the database (above)"
        ok=0
    fi
    sqled_result "the installers' SQL uses only sql and plpgsql, and no statement that needs a superuser" "$ok"
}

# sqled_schema_compare: the edition's types, tables, constraints, indexes
# and comments are those of a fresh install of the C extension
# (sql_edition/test/schema_compare.sh), on the suites' other cluster, where
# the C extension is installed.
sqled_schema_compare() {
    local ok=1 out=$IDEM_TMP/sqled-schema-compare.out
    as_postgres env PSQL="$("$PG_CONFIG" --bindir)/psql -U postgres" \
        sh "$IDEM_TMP/src/sql_edition/test/schema_compare.sh" >"$out" 2>&1 || ok=0
    [ "$ok" = 1 ] || cat "$out"
    sqled_result "its schema is a fresh C 1.3 install's (sql_edition/test/schema_compare.sh)" "$ok"
}

# sqled_invariants: test/invariants/check_invariants.py against the
# edition, as t/021_invariants.pl runs it against the C edition (the
# settings of the worker's pace for the database, the passes the
# clients' own).
sqled_invariants() {
    local ok=1 out=$IDEM_TMP/sqled-invariants.out invariant
    log "suite: sql_edition invariants (${IDEM_INVARIANT_SECONDS:-20} s)"
    if ! sqled_install_db invariants >"$out" 2>&1 ||
        ! sqled_psql -q -v ON_ERROR_STOP=1 -d postgres \
            -c "ALTER DATABASE invariants SET idempotency.cleanup_grace = 0" \
            -c "ALTER DATABASE invariants SET idempotency.tombstone_ttl = 0" \
            -c "ALTER DATABASE invariants SET idempotency.cleanup_delay = 0" >>"$out" 2>&1; then
        cat "$out"
        sqled_result "the invariant checker" 0
        return
    fi
    as_postgres timeout -k 10 600 /usr/bin/python3 -u "$IDEM_TMP/src/test/invariants/check_invariants.py" \
        --dsn "host=$SQLED_HOST port=$SQLED_PORT dbname=invariants" --edition sql \
        --seconds "${IDEM_INVARIANT_SECONDS:-20}" --clients 8 --keys 3 >>"$out" 2>&1 || ok=0
    cat "$out"
    for invariant in 'no call raised unique_violation (23505)' \
        'at most one committed proceed per attempt of a command' \
        'every replay of a record returns the body that finished it' 'no other error'; do
        grep -qxF "ok     $invariant" "$out" || ok=0
    done
    grep -qE '^ +committed proceeds +[1-9]' "$out" || ok=0
    grep -qE '^ +idem_claim pay: replay +[1-9]' "$out" || ok=0
    grep -qE "^ +renames of the application's role +[1-9]" "$out" || ok=0
    grep -qE '^ +maintenance passes +[1-9]' "$out" || ok=0
    sqled_result "the invariant checker: its four invariants, with proceeds, replays, renames and maintenance passes" "$ok"
}

# sqled_cron_setup: in appdb, as idem_owner, a record whose lease ends at
# once and one that expires at once; the job of sql_edition/README.md,
# scheduled by idem_owner as written there; no grace and no tombstones for
# the role's sessions (set by the superuser: a role that is no superuser
# may not set a placeholder for itself).  pg_cron runs the job every minute
# (its finest schedule on 15): sqled_cron_poll waits for it.
sqled_cron_setup() {
    local out=$IDEM_TMP/sqled-cron.out job
    job=$(awk '/^```sql$/ { sql = 1; next } /^```$/ { sql = 0 }
               sql && /^SELECT cron\.schedule\(/ { print; exit }' "$IDEM_ROOT/sql_edition/README.md")
    if [ -z "$job" ]; then
        echo "sql_edition/README.md shows no SELECT cron.schedule(...) line" >"$out"
        return 1
    fi
    sqled_psql -q -v ON_ERROR_STOP=1 -d postgres \
        -c "ALTER ROLE idem_owner IN DATABASE appdb SET idempotency.cleanup_grace = 0" \
        -c "ALTER ROLE idem_owner IN DATABASE appdb SET idempotency.tombstone_ttl = 0" >"$out" 2>&1 &&
    as_postgres env PGHOST="$SQLED_HOST" PGPORT="$SQLED_PORT" "$SQLED_BIN/psql" -X -q -v ON_ERROR_STOP=1 \
        -U idem_owner -d appdb >>"$out" 2>&1 <<SQL
SET search_path = "$SQLED_SCHEMA";
SELECT outcome FROM idem_claim('cron.check', 'leased', '{}', lease => '10 ms');
BEGIN;
SELECT idem_complete(token, 200, '{}')
  FROM idem_claim('cron.check', 'expiring', '{}', ttl => '10 ms');
COMMIT;
$job
SQL
}
sqled_cron_poll() {
    local ok=0 out=$IDEM_TMP/sqled-cron.out i state
    log "sql_edition: waiting for pg_cron's run (at most 150 s)"
    for i in $(seq 1 150); do
        state=$(sqled_psql -At -d appdb -c "SELECT
                (SELECT string_agg(key || '=' || state, ',' ORDER BY key) FROM \"$SQLED_SCHEMA\".idem_records
                  WHERE operation = 'cron.check')
                || '|' || (SELECT count(*) FROM cron.job_run_details d JOIN cron.job j USING (jobid)
                            WHERE d.status = 'succeeded' AND j.username = 'idem_owner')" 2>>"$out")
        case $state in
            "leased=unknown|"[1-9]*) ok=1; break ;;
        esac
        sleep 1
    done
    if [ "$ok" != 1 ]; then
        cat "$out"
        echo "records and successful runs: $state"
        sqled_psql -d appdb -c "SELECT j.jobname, j.username, j.command, d.status, d.return_message
            FROM cron.job_run_details d JOIN cron.job j USING (jobid) ORDER BY d.runid" 2>&1 | tail -n 20
    fi
    sqled_result "pg_cron runs the README's job of idem_owner: a lease that ended is unknown, an expired record deleted" "$ok"
}

# sqled_example_schema: examples/schema.sql, as it is, on the edition
# installed in a schema of its own, as docs/clients.md ("The example
# services") sets it up by hand: a database the installing role idem_owner
# owns; the file refused while the edition is not installed, while its
# schema is not on search_path, and while the role idem_app does not exist
# (idem_owner may not create roles), each time keeping nothing; then, once
# the administrator has made idem_app and its search_path, run twice by
# idem_owner with the schema on search_path; then idem_app claims, writes
# a payment and completes in one transaction, and a retry replays.  One
# test.
sqled_example_schema() {
    local ok=1 out=$IDEM_TMP/sqled-example-schema.out db=idem_schema_sql
    local path_opt='-c search_path=public,idempotency'
    as_owner() {
        as_postgres env PGHOST="$SQLED_HOST" PGPORT="$SQLED_PORT" PGUSER=idem_owner PGOPTIONS="$1" \
            "$SQLED_BIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$db" -f "$2" "${@:3}"
    }
    # refused ERROR-TEXT OPTIONS: the file is refused with that error, and
    # nothing of it is kept.
    refused() {
        if as_owner "$2" "$IDEM_TMP/src/examples/schema.sql" >>"$out" 2>&1; then
            echo "examples/schema.sql was not refused ($1)" >>"$out"
            return 1
        fi
        grep -qF "ERROR:  $1" "$out" || { echo "no error: $1" >>"$out"; return 1; }
        [ "$(sqled_psql -At -d "$db" -c "SELECT count(*) FROM pg_class WHERE relname = 'payments'")" = 0 ] \
            || { echo "a payments table was kept" >>"$out"; return 1; }
    }
    sqled_psql -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $db OWNER idem_owner" >"$out" 2>&1 || ok=0
    [ "$ok" = 1 ] && { refused "neither the idempotency extension nor its SQL edition is installed in database \"$db\"" "" || ok=0; }
    [ "$ok" = 1 ] && { as_owner "" "$IDEM_TMP/src/sql_edition/idempotency_sql.sql" -v schema=idempotency >>"$out" 2>&1 || ok=0; }
    [ "$ok" = 1 ] && { refused 'function idem_claim is in schema idempotency, which is not on search_path' "" || ok=0; }
    [ "$ok" = 1 ] && { refused 'role "idem_app" does not exist' "$path_opt" || ok=0; }
    [ "$ok" = 1 ] && { sqled_psql -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE ROLE idem_app LOGIN" \
        -c 'ALTER ROLE idem_app SET search_path = "$user", public, idempotency' >>"$out" 2>&1 || ok=0; }
    if [ "$ok" = 1 ]; then
        as_owner "$path_opt" "$IDEM_TMP/src/examples/schema.sql" >>"$out" 2>&1 &&
        as_owner "$path_opt" "$IDEM_TMP/src/examples/schema.sql" >>"$out" 2>&1 &&
        as_postgres env PGHOST="$SQLED_HOST" PGPORT="$SQLED_PORT" "$SQLED_BIN/psql" -X -At -v ON_ERROR_STOP=1 \
            -U idem_app -d "$db" >"$out.app" 2>&1 <<'SQL' || ok=0
BEGIN;
SELECT outcome, token FROM idem_claim('payments.create', 'k1', '{"amount": 5}') \gset
INSERT INTO payments (idempotency_key, amount, currency) VALUES ('k1', 5, 'EUR');
SELECT idem_complete(:'token', 201, '{"amount": 5}');
COMMIT;
SELECT :'outcome';
SELECT outcome || ' ' || http_status FROM idem_claim('payments.create', 'k1', '{"amount": 5}');
SELECT count(*) || ' payment' FROM payments;
SQL
        cat "$out.app" >>"$out"
        [ "$(grep -xE 'proceed|replay 201|1 payment' "$out.app" | tr '\n' ' ')" = "proceed replay 201 1 payment " ] || ok=0
    fi
    [ "$ok" = 1 ] || cat "$out"
    sqled_result "examples/schema.sql as it is, on the edition in schema idempotency, by its installing role" "$ok"
}

# sqled_clients: the client libraries' own tests (Python, Node.js) and the
# Python example service end to end, against the edition in the database
# idem_examples: the installer (in schema public), then examples/schema.sql
# as it is, run by the installing role (no superuser) once the
# administrator has made the role idem_app, as docs/clients.md says.
sqled_clients() {
    local tree=$IDEM_TMP/sqled-clients out=$IDEM_TMP/sqled-clients-setup.out
    local IDEM_GROUPS=$tree/groups
    local client_env=(PGHOST=127.0.0.1 PGPORT="$SQLED_PORT" PGDATABASE=idem_examples PGUSER=idem_app
                      IDEM_ADMIN_DSN="host=127.0.0.1 port=$SQLED_PORT dbname=idem_examples user=postgres")
    as_root install -d -o "$(id -u)" -g "$(id -g)" "$tree"
    if ! { tar -C "$IDEM_ROOT" --exclude=node_modules --exclude=__pycache__ \
                --exclude=examples/java --exclude=examples/go --exclude=clients/java --exclude=clients/go \
                -cf - examples clients | tar -C "$tree" -xf - &&
            chmod 644 "$tree/examples/schema.sql" &&
            sqled_install_db idem_examples &&
            sqled_psql -q -v ON_ERROR_STOP=1 -d postgres -c "DO \$\$ BEGIN
                IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_app') THEN
                    CREATE ROLE idem_app LOGIN; END IF; END \$\$" &&
            as_postgres env PGHOST="$SQLED_HOST" PGPORT="$SQLED_PORT" PGOPTIONS="-c role=idem_installer" \
                "$SQLED_BIN/psql" -X -q -v ON_ERROR_STOP=1 -d idem_examples -f "$tree/examples/schema.sql" &&
            (cd "$tree/clients/node" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) &&
            (cd "$tree/examples/node" && timeout 600 npm ci --no-audit --no-fund --loglevel=error); } \
            >"$out" 2>&1; then
        cat "$out"
        sqled_result "the clients' database and packages" 0
        return
    fi
    local before=$failed
    run_client sql_edition-clients-python-lib "$tree/clients/python" \
        /usr/bin/python3 -m pytest -p no:cacheprovider tests
    run_client sql_edition-clients-node-lib "$tree/clients/node" \
        node --test --test-reporter=tap test/
    run_client sql_edition-clients-python "$tree/examples/python" \
        /usr/bin/python3 -u test_payments_service.py --no-rate-limit
    [ "$failed" -eq "$before" ] || sqled_failed=1
}

# sqled_walkthrough: in appdb, the role app given its privileges by the
# block of sql_edition/README.md ("Privileges", as written, by the
# superuser: ALTER ROLE of another role needs more than the installing role
# has), then the README's walkthrough as written, as app: the answers of the
# C edition's walkthrough suite, in order.  app owns appdb, as in the C
# edition's walkthrough, where it creates its business table.  One test.
sqled_walkthrough() {
    local ok=1 out=$IDEM_TMP/sqled-walkthrough.out sql=$IDEM_TMP/sqled-walkthrough.sql
    local grants=$IDEM_TMP/sqled-privileges.sql got
    awk '/^### Privileges/ { sec = 1; next } /^#/ { sec = 0 }
         sec && /^```sql$/ { code = 1; next } code && /^```$/ { exit } code' \
        "$IDEM_ROOT/sql_edition/README.md" >"$grants"
    readme_walkthrough >"$sql"
    chmod 644 "$sql" "$grants"
    if [ -s "$grants" ] && sqled_psql -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE ROLE app LOGIN" \
            -c "ALTER DATABASE appdb OWNER TO app" >"$out" 2>&1 &&
        sqled_psql -q -v ON_ERROR_STOP=1 -d appdb -f "$grants" >>"$out" 2>&1 &&
        as_postgres env PGHOST="$SQLED_HOST" PGPORT="$SQLED_PORT" "$SQLED_BIN/psql" -X -v ON_ERROR_STOP=1 \
            -U app -d appdb -f "$sql" >>"$out" 2>&1; then
        got=$(grep -oE '^ *(proceed|replay|mismatch|in_progress|unknown)\b' "$out" | tr -d ' ' | tr '\n' ' ')
        [ "${got% }" = "$IDEM_WALKTHROUGH_ANSWERS" ] || { echo "walkthrough: answers \"${got% }\", expected \"$IDEM_WALKTHROUGH_ANSWERS\""; ok=0; }
    else
        ok=0
    fi
    [ "$ok" = 1 ] || cat "$out"
    sqled_result "the README's walkthrough as app, privileges as sql_edition/README.md gives them" "$ok"
}

# sqled_own_check SCRIPT [ENV...]: one of the edition's own checks
# (sql_edition/test/SCRIPT, from the suite's copy of the tree), as
# postgres, against the suite's cluster.  One test.
sqled_own_check() {
    local script=$1 out=$IDEM_TMP/sqled-$1.out ok=1
    shift
    as_postgres env PSQL="$SQLED_BIN/psql -h $SQLED_HOST -p $SQLED_PORT -U postgres" "$@" \
        sh "$IDEM_TMP/src/sql_edition/test/$script" >"$out" 2>&1 || ok=0
    [ "$ok" = 1 ] || cat "$out"
    sqled_result "sql_edition/test/$script" "$ok"
}

# sqled_differential: the SQL edition's idem_canonical and idem_fingerprint
# against the C edition's, byte for byte, on fixed and random documents
# (test/editions/canonical_differential.sh, a cluster of its own where both
# are installed).  One test.
sqled_differential() {
    local ok=1 out=$IDEM_TMP/sqled-differential.out
    log "suite: sql_edition fingerprint differential (test/editions/canonical_differential.sh)"
    env -u IDEM_TMP bash "$IDEM_ROOT/test/editions/canonical_differential.sh" >"$out" 2>&1 || ok=0
    grep -E '^documents [0-9]+ canonical_bytes [0-9]+ mismatches' "$out" || true
    [ "$ok" = 1 ] || tail -n 60 "$out"
    sqled_result "the fingerprint differential: the SQL edition's canonical form and fingerprint are the C edition's" "$ok"
}

# sqled_jcs: both editions' canonical form and fingerprint against an
# independent RFC 8785 implementation (test/jcs-differential: the npm
# package canonicalize), on documents drawn from every Unicode range.
sqled_jcs() {
    local ok=1 out=$IDEM_TMP/sqled-jcs.out
    log "suite: sql_edition RFC 8785 differential (test/jcs-differential, 5000 documents)"
    env -u IDEM_TMP bash "$IDEM_ROOT/test/jcs-differential/run.sh" 5000 1 >"$out" 2>&1 || ok=0
    grep -E '^(the |differential: )' "$out" || true
    [ "$(grep -c '^differential: 5000 passed, 0 failed$' "$out")" = 2 ] || ok=0
    [ "$ok" = 1 ] || tail -n 60 "$out"
    sqled_result "the RFC 8785 differential: both editions' canonical form and fingerprint are canonicalize's" "$ok"
}

# The suite.
run_sql_edition_suite() {
    local sqled_failed=0 major
    SQLED_LIST=$IDEM_ROOT/sql_edition/test/shared_tests
    major=$(sqled_major)
    log "suite: sql_edition (PostgreSQL $major without our library, pg_cron preloaded)"
    install_packages "postgresql-$major-cron" python3-psycopg2
    sqled_check_list
    sqled_schema_compare
    sqled_differential
    # (node and npm: on the first version, as the clients)
    if [ -z "${IDEM_RUN_LABEL:-}" ]; then sqled_jcs; fi
    if ! sqled_copy_packages "$IDEM_TMP/sqled-pg" || ! sqled_start; then
        sqled_result "a cluster of the distribution's PostgreSQL $major packages alone, pg_cron preloaded" 0
        failed_suites+=(sql_edition)
        return
    fi
    sqled_no_library
    sqled_pgtle
    sqled_own_check installers.sh
    sqled_own_check install_and_maintenance.sh
    sqled_own_check hostile.sh
    local app=0 cron=0
    sqled_install_app && app=1
    if [ "$app" = 1 ]; then sqled_walkthrough; fi
    # (pg_cron in appdb; waits for a run of pg_cron: in the background, while the rest runs)
    sqled_own_check pg_cron.sh CRON_DB=appdb >"$IDEM_TMP/sqled-pg_cron.result" 2>&1 &
    local own_cron=$!
    if [ "$app" = 1 ]; then
        if sqled_cron_setup; then
            cron=1
        else
            cat "$IDEM_TMP/sqled-cron.out"
            sqled_result "pg_cron jobs of idem_owner expire a lease and delete an expired record" 0
        fi
    fi
    sqled_regress
    sqled_isolation
    sqled_invariants
    # (the clients on the first version only, as the clients suite)
    if [ "$app" = 1 ]; then sqled_example_schema; fi
    if [ -z "${IDEM_RUN_LABEL:-}" ]; then sqled_clients; fi
    if [ "$cron" = 1 ]; then sqled_cron_poll; fi
    # (its count, from the subshell that ran it)
    wait "$own_cron" || true
    cat "$IDEM_TMP/sqled-pg_cron.result"
    if grep -q '\.\.\. ok$' "$IDEM_TMP/sqled-pg_cron.result"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        sqled_failed=1
    fi
    [ "$sqled_failed" = 0 ] || failed_suites+=(sql_edition)
}
