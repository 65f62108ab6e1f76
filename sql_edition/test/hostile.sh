#!/bin/sh
# The SQL edition against the roles that use it: what a role granted EXECUTE
# can do by calling the edition's functions directly, private ones included
# (every function is executable by someone), and by what any role of the
# database may do besides (advisory locks, settings).  Each case is one
# that the edition once let through.
#
# Needs a server with no library of ours required and a superuser to set
# the roles up; the usual PG* variables or psql options in PSQL choose it:
#   PSQL="psql -h /tmp -p 5432 -U postgres" sql_edition/test/hostile.sh
# Creates and drops the database idem_sqled_hostile and the roles
# idem_sqled_h_*.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
psql=${PSQL:-psql}
db=idem_sqled_hostile
PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
export PGOPTIONS

cleanup() {
    $psql -X -q -d postgres <<SQL >/dev/null 2>&1 || true
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
 WHERE datname = '$db' AND pid <> pg_backend_pid();
DROP DATABASE IF EXISTS $db;
DROP ROLE IF EXISTS idem_sqled_h_owner;
DROP ROLE IF EXISTS idem_sqled_h_app;
DROP ROLE IF EXISTS idem_sqled_h_app2;
SQL
    wait
}
trap cleanup EXIT
cleanup

as_super() { $psql -X -q -v ON_ERROR_STOP=1 -d $db "$@"; }
as_app() { $psql -X -q -At -v ON_ERROR_STOP=1 -d $db -U idem_sqled_h_app "$@"; }
as_app2() { $psql -X -q -At -v ON_ERROR_STOP=1 -d $db -U idem_sqled_h_app2 "$@"; }
fail() { echo "hostile: $*" >&2; exit 1; }

# wait_for_lock APPLICATION_NAME: until a session of that name holds an
# advisory lock (at most 20 s)
wait_for_lock() {
    i=0
    until [ "$(as_super -At -c "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                                 WHERE l.locktype = 'advisory' AND l.granted
                                   AND a.application_name = '$1'")" -gt 0 ]; do
        i=$((i + 1))
        [ $i -le 200 ] || fail "the session $1 took no advisory lock"
        sleep 0.1
    done
}
# end_session APPLICATION_NAME: ends the sessions of that name
end_session() {
    as_super -At -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE application_name = '$1'" >/dev/null
}

$psql -X -q -v ON_ERROR_STOP=1 -d postgres <<SQL
CREATE ROLE idem_sqled_h_owner LOGIN;
CREATE ROLE idem_sqled_h_app LOGIN;
CREATE ROLE idem_sqled_h_app2 LOGIN;
CREATE DATABASE $db;
GRANT CREATE ON DATABASE $db TO idem_sqled_h_owner;
SQL
$psql -X -q -v ON_ERROR_STOP=1 -d $db -U idem_sqled_h_owner -v schema=idempotency \
    -f "$here/idempotency_sql.sql"
$psql -X -q -v ON_ERROR_STOP=1 -d $db -U idem_sqled_h_owner <<'SQL'
GRANT USAGE ON SCHEMA idempotency TO idem_sqled_h_app, idem_sqled_h_app2;
GRANT EXECUTE ON FUNCTION idempotency.idem_claim, idempotency.idem_claim_text,
      idempotency.idem_complete, idempotency.idem_fail, idempotency.idem_heartbeat,
      idempotency.idem_checkpoint, idempotency.idem_replay, idempotency.idem_resolve,
      idempotency.idem_list, idempotency.idem_inbox, idempotency.idem_claim_many
   TO idem_sqled_h_app, idem_sqled_h_app2;
SQL
as_super -c "ALTER ROLE idem_sqled_h_app SET search_path = idempotency" \
         -c "ALTER ROLE idem_sqled_h_app2 SET search_path = idempotency"

# 1. idem__finish, the body of idem_complete and idem_fail, called directly
# writes only what those write: not a processing record without token or
# lease (in_progress for ever), not unknown, not succeeded through
# idem_fail's privilege, not a resource_id with a failure.
token=$(as_app -c "SELECT token FROM idem_claim('op', 'finish-1', '{}')")
for args in "'idem_complete', '$token', 'processing', 200" \
            "'idem_complete', '$token', 'unknown', 200" \
            "'idem_complete', '$token', 'failed', 500" \
            "'idem_fail', '$token', 'succeeded', 200" \
            "'elsewhere', '$token', 'failed', 500"; do
    out=$(as_app -c "SELECT idem__finish('idem_sqled_h_app', $args, '{}', NULL, NULL, NULL)" 2>&1) \
        && fail "idem__finish($args) wrote the record"
    echo "$out" | grep -q 'invalid outcome for an attempt token' || fail "idem__finish($args): $out"
done
out=$(as_app -c "SELECT idem__finish('idem_sqled_h_app', 'idem_fail', '$token', 'failed', 500, '{}', NULL, 'r-1', NULL)" 2>&1) \
    && fail "idem__finish stored a resource_id with a failure"
[ "$(as_app -c "SELECT state FROM idem_replay('op', 'finish-1')")" = processing ] \
    || fail "a refused idem__finish changed the record"
as_app -c "SELECT idem_complete('$token', 201)" >/dev/null
[ "$(as_app -c "SELECT outcome || ' ' || http_status FROM idem_claim('op', 'finish-1', '{}')")" = "replay 201" ] \
    || fail "idem_complete no longer completes"

# 2. An advisory lock taken by another role on the hash of a key (computed
# with the edition's own function, or seen in pg_locks while a claim held
# it) does not keep the key from being claimed: a claim answers proceed,
# not in_progress, while it is held; idem_inbox and idem_claim_many too.
$psql -X -q -d $db -U idem_sqled_h_app2 -v ON_ERROR_STOP=1 \
      -c "SET application_name = 'idem_h_squatter'" \
      -c "SELECT pg_advisory_lock(idem__key_lock_id('idem_sqled_h_app'::regrole, '', '', k, 'order-1'))
            FROM unnest(ARRAY['pay', 'consumer', 'many']) AS k" \
      -c "SELECT pg_sleep(120)" >/dev/null 2>&1 &
wait_for_lock idem_h_squatter
[ "$(as_app -c "SELECT outcome FROM idem_claim('pay', 'order-1', '{}')")" = proceed ] \
    || fail "another role's advisory lock kept a key from being claimed"
[ "$(as_app -c "SELECT idem_inbox('consumer', 'order-1', '{}')")" = proceed ] \
    || fail "another role's advisory lock kept a message from being recorded"
[ "$(as_app -c "SELECT outcome FROM idem_claim_many('many', ARRAY['order-1'], wait => '200ms')")" = proceed ] \
    || fail "another role's advisory lock kept a key of idem_claim_many from being claimed"
end_session idem_h_squatter

# ... while a claim of the role's own that has not ended is still found by
# the lock: in_progress at once, never a second proceed.
$psql -X -q -d $db -U idem_sqled_h_app -v ON_ERROR_STOP=1 \
      -c "SET application_name = 'idem_h_claimer'" \
      -c "BEGIN" -c "SELECT idem_claim('pay', 'order-2', '{}')" \
      -c "SELECT pg_sleep(120)" >/dev/null 2>&1 &
wait_for_lock idem_h_claimer
[ "$(as_app -c "SELECT outcome FROM idem_claim('pay', 'order-2', '{}')")" = in_progress ] \
    || fail "a claim did not see the role's own claim of the key in progress"
end_session idem_h_claimer

# 3. A setting beyond what PostgreSQL reads as a number is refused as the
# C edition refuses it at SET (22023, its message and hint), not with a
# numeric overflow (22003); a fraction is rounded half to even, as
# PostgreSQL rounds it.
check_setting() {
    out=$(as_app -v VERBOSITY=verbose -c "SET idempotency.default_ttl = '$1'" \
                 -c "SELECT outcome FROM idem_claim('op', 'setting', NULL)" 2>&1) \
        && fail "default_ttl = '$1' accepted"
    echo "$out" | grep -qF "$2" || fail "default_ttl = '$1': $out"
}
check_setting 1e1000000 'ERROR:  22023: invalid value for parameter "idempotency.default_ttl": "1e1000000"'
check_setting 1e400 'ERROR:  22023: invalid value for parameter "idempotency.default_ttl": "1e400"'
check_setting 99999999999999999999999 'HINT:  Value exceeds integer range.'
check_setting 2147483648 'HINT:  Value exceeds integer range.'
check_setting 0.5 'ERROR:  22023: 0 s is outside the valid range for parameter "idempotency.default_ttl" (1 .. 2147483647)'
[ "$(as_app -c "SET idempotency.default_ttl = '2.5'" \
            -c "SELECT extract(epoch FROM (o).ttl_value)
                  FROM (SELECT idem__claim_options(NULL, NULL, NULL, 'unknown', 'reject') AS o) AS x")" = 2.000000 ] \
    || fail "default_ttl = '2.5' not rounded half to even"

# 4. With the archive renamed by its owner and cleanup_action 'archive' (a
# placeholder the role may set), a claim that reuses the role's expired
# record is refused (42P01), and a table of the role's own named
# idem_records_archive in pg_temp, which the functions' search_path lists
# last, is never written in its place: its trigger would run as the owner
# of idem_records and read every role's records.
as_app -c "SELECT idem_complete(token, 200, '{}') FROM idem_claim('op', 'archive-gone', '{}', ttl => '1 ms')" >/dev/null
as_super -c "UPDATE idempotency.idem_records SET expires_at = clock_timestamp() - interval '1 hour'
              WHERE key = 'archive-gone'" \
         -c "ALTER TABLE idempotency.idem_records_archive RENAME TO idem_records_archive_moved"
out=$(as_app -v VERBOSITY=verbose <<'SQL' 2>&1
CREATE TEMP TABLE loot (role regrole, key text);
DO $$
BEGIN
    EXECUTE (SELECT 'CREATE TEMP TABLE idem_records_archive ('
                    || string_agg(quote_ident(attname) || ' ' || format_type(atttypid, atttypmod), ', '
                                  ORDER BY attnum) || ')'
               FROM pg_attribute
              WHERE attrelid = 'idempotency.idem_records_archive_moved'::regclass
                AND attnum > 0 AND NOT attisdropped);
END $$;
CREATE FUNCTION pg_temp.take() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.loot SELECT r.role, r.key FROM idempotency.idem_records AS r;
    RETURN NEW;
END $$;
CREATE TRIGGER take BEFORE INSERT ON pg_temp.idem_records_archive
    FOR EACH ROW EXECUTE FUNCTION pg_temp.take();
GRANT ALL ON pg_temp.idem_records_archive, pg_temp.loot TO idem_sqled_h_owner;
SET idempotency.cleanup_action = 'archive';
\set ON_ERROR_STOP off
SELECT outcome FROM idem_claim('op', 'archive-gone', '{}', on_expired => 'proceed');
\set ON_ERROR_STOP on
SELECT 'taken ' || count(*) FROM pg_temp.loot;
SELECT 'copied ' || count(*) FROM pg_temp.idem_records_archive;
SQL
)
as_super -c "ALTER TABLE idempotency.idem_records_archive_moved RENAME TO idem_records_archive"
echo "$out" | grep -q '^ERROR:  42P01: idempotency cannot reuse an expired record: relation "idem_records_archive" does not exist' \
    || fail "a reuse with the archive renamed: $out"
echo "$out" | grep -qx 'taken 0' && echo "$out" | grep -qx 'copied 0' \
    || fail "a reuse with the archive renamed wrote the role's own table in pg_temp: $out"
[ "$(as_super -At -c "SELECT state FROM idempotency.idem_records WHERE key = 'archive-gone'")" = succeeded ] \
    || fail "a refused reuse changed the record"

# 5. A wait longer than lock_timeout can hold (2147483647 ms, about 24.8
# days; a wait of up to 365,250 days is accepted) waits for the lock it
# meets rather than failing on lock_timeout's range (22023): for a claim
# of the key in progress, for a transaction past 64 new keys holding the
# key's bucket, and for a record's row held by another transaction.
claim_after() {     # claim_after SESSION SQL: runs SQL while SESSION holds its locks, ends SESSION, prints the answer
    out_file=$(mktemp)
    as_app -c "$2" >"$out_file" 2>&1 &
    claim_pid=$!
    sleep 1
    end_session "$1"
    wait $claim_pid || true
    cat "$out_file"
    rm -f "$out_file"
}
$psql -X -q -d $db -U idem_sqled_h_app -v ON_ERROR_STOP=1 \
      -c "SET application_name = 'idem_h_long_key'" \
      -c "BEGIN" -c "SELECT idem_claim('pay', 'order-3', '{}')" \
      -c "SELECT pg_sleep(120)" >/dev/null 2>&1 &
wait_for_lock idem_h_long_key
out=$(claim_after idem_h_long_key "SELECT outcome FROM idem_claim('pay', 'order-3', '{}', wait => '30 days')")
[ "$out" = proceed ] || fail "a claim waiting 30 days for a claim of its key: $out"

same=$(as_super -At -c "SELECT 'b' || i FROM generate_series(1, 5000) AS i
                         WHERE idempotency.idem__key_lock_id('idem_sqled_h_app'::regrole, '', '', 'bucket', 'b' || i) & 127
                             = idempotency.idem__key_lock_id('idem_sqled_h_app'::regrole, '', '', 'bucket', 'fresh-1') & 127
                         LIMIT 1")
$psql -X -q -d $db -U idem_sqled_h_app -v ON_ERROR_STOP=1 \
      -c "SET application_name = 'idem_h_long_bucket'" \
      -c "BEGIN" \
      -c "SELECT count(*) FROM idem_claim_many('bucket', ARRAY(SELECT 'f' || i FROM generate_series(1, 64) AS i))" \
      -c "SELECT idem_claim('bucket', '$same')" \
      -c "SELECT pg_sleep(120)" >/dev/null 2>&1 &
i=0
until [ "$(as_super -At -c "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                             WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
                               AND a.application_name = 'idem_h_long_bucket'")" -gt 0 ]; do
    i=$((i + 1))
    [ $i -le 200 ] || fail "the session idem_h_long_bucket took no bucket"
    sleep 0.1
done
out=$(claim_after idem_h_long_bucket "SELECT outcome FROM idem_claim('bucket', 'fresh-1', '{}', wait => '30 days')")
[ "$out" = proceed ] || fail "a claim waiting 30 days in a bucket held by another transaction: $out"

as_app -c "SELECT outcome FROM idem_claim('pay', 'order-4', '{}', lease => '1 ms', on_lease_expiry => 'retry')" >/dev/null
$psql -X -q -d $db -v ON_ERROR_STOP=1 \
      -c "SET application_name = 'idem_h_long_row'" \
      -c "BEGIN" -c "SELECT FROM idempotency.idem_records WHERE key = 'order-4' FOR UPDATE" \
      -c "SELECT pg_advisory_xact_lock(7212)" \
      -c "SELECT pg_sleep(120)" >/dev/null 2>&1 &
wait_for_lock idem_h_long_row
out=$(claim_after idem_h_long_row "SELECT outcome FROM idem_claim('pay', 'order-4', '{}', wait => '30 days', on_lease_expiry => 'retry')")
[ "$out" = proceed ] || fail "a claim waiting 30 days for a record's row: $out"

# 6. With idem_records and its scope index renamed (or dropped) by their
# owner, a table of the role's own named idem_records in pg_temp, with an
# index named idem_records_scope_key, is not taken for them by the check
# of the table, which the functions' search_path lists last: a claim is
# refused (42P01), and the table's trigger, which would run as the owner
# of idem_records and read every role's records, never runs.
as_super -c "ALTER TABLE idempotency.idem_records RENAME TO idem_records_moved" \
         -c "ALTER INDEX idempotency.idem_records_scope_key RENAME TO idem_records_scope_key_moved"
out=$(as_app -v VERBOSITY=verbose <<'SQL' 2>&1
CREATE TEMP TABLE seen (who name, records bigint);
SELECT format('CREATE TEMP TABLE idem_records (%s)',
              string_agg(format('%I %s%s%s', attname, format_type(atttypid, atttypmod),
                                CASE attcollation WHEN 950 THEN ' COLLATE "C"' ELSE '' END,
                                CASE attname WHEN 'id' THEN ' GENERATED ALWAYS AS IDENTITY PRIMARY KEY' ELSE '' END),
                         ', ' ORDER BY attnum))
  FROM pg_attribute
 WHERE attrelid = 'idempotency.idem_records_moved'::regclass AND attnum > 0 AND NOT attisdropped \gexec
CREATE UNIQUE INDEX idem_records_scope_key ON pg_temp.idem_records (key, operation, caller, tenant, role);
CREATE FUNCTION pg_temp.look() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pg_temp.seen VALUES (current_user, (SELECT count(*) FROM idempotency.idem_records_moved));
    RETURN NULL;
END $$;
CREATE TRIGGER look AFTER INSERT ON pg_temp.idem_records FOR EACH ROW EXECUTE FUNCTION pg_temp.look();
GRANT ALL ON pg_temp.idem_records, pg_temp.seen TO idem_sqled_h_owner;
\set ON_ERROR_STOP off
SELECT outcome FROM idem_claim('op', 'temp-table', '{}');
\set ON_ERROR_STOP on
SELECT 'looked ' || count(*) FROM pg_temp.seen;
SELECT 'written ' || count(*) FROM pg_temp.idem_records;
SQL
)
as_super -c "ALTER TABLE idempotency.idem_records_moved RENAME TO idem_records" \
         -c "ALTER INDEX idempotency.idem_records_scope_key_moved RENAME TO idem_records_scope_key"
echo "$out" | grep -q '^ERROR:  42P01: table "idem_records" of extension "idempotency" does not exist' \
    || fail "a claim with idem_records renamed: $out"
echo "$out" | grep -qx 'looked 0' && echo "$out" | grep -qx 'written 0' \
    || fail "a claim with idem_records renamed used the role's own table in pg_temp: $out"

# 7. The functions' owner must hold every privilege the functions use on
# idem_records, not one of them: with UPDATE revoked from it (it still
# owns the table), a claim is refused before it writes (42501, the check's
# own message and a hint naming the missing privilege), not answered
# proceed with a record that no completion could then finish.
as_super -c "REVOKE UPDATE ON idempotency.idem_records FROM idem_sqled_h_owner"
out=$(as_app -v VERBOSITY=verbose -c "SELECT outcome FROM idem_claim('op', 'no-update', '{}')" 2>&1 || true)
as_super -c "GRANT UPDATE ON idempotency.idem_records TO idem_sqled_h_owner"
echo "$out" | grep -q "^ERROR:  42501: the idempotency functions' owner \"idem_sqled_h_owner\" may not read and write table \"idem_records\"" \
    || fail "a claim with UPDATE revoked from the functions' owner: $out"
echo "$out" | grep -q '^HINT:  GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.idem_records TO idem_sqled_h_owner' \
    || fail "no hint naming the grant: $out"
[ "$(as_super -At -c "SELECT count(*) FROM idempotency.idem_records WHERE key = 'no-update'")" = 0 ] \
    || fail "a claim with UPDATE revoked wrote a record"
[ "$(as_app -c "SELECT outcome FROM idem_claim('op', 'no-update', '{}')")" = proceed ] \
    || fail "a claim once UPDATE is granted back"

echo "hostile: direct calls of private functions, another role's advisory locks, settings beyond a number, a renamed archive, waits beyond lock_timeout, a renamed table and an owner without every privilege checked"
