#!/bin/sh
# The SQL edition installed by a role that is no superuser: a second run of
# the installer keeps every record, a downgrade is refused, a failed install
# leaves nothing; the maintenance procedure commits every batch, archives
# when asked, and refuses a setting that does not parse; idem_list answers
# only for a role the session may act as.
#
# Needs a server with no library of ours required and a superuser to set
# the roles up; the usual PG* variables or psql options in PSQL choose it:
#   PSQL="psql -h /tmp -p 5432 -U postgres" sql_edition/test/install_and_maintenance.sh
# Creates and drops the database idem_sqled_test and the roles idem_sqled_*.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
psql=${PSQL:-psql}
db=idem_sqled_test
installer="$here/idempotency_sql.sql"
PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
export PGOPTIONS

cleanup() {
    $psql -X -q -d postgres <<SQL >/dev/null 2>&1 || true
DROP DATABASE IF EXISTS $db;
DROP ROLE IF EXISTS idem_sqled_owner;
DROP ROLE IF EXISTS idem_sqled_app;
DROP ROLE IF EXISTS idem_sqled_other;
SQL
}
trap cleanup EXIT
cleanup

as_super() { $psql -X -q -v ON_ERROR_STOP=1 -d $db "$@"; }
as_owner() { $psql -X -q -v ON_ERROR_STOP=1 -d $db -U idem_sqled_owner "$@"; }
fail() { echo "install_and_maintenance: $*" >&2; exit 1; }

$psql -X -q -v ON_ERROR_STOP=1 -d postgres <<SQL
CREATE ROLE idem_sqled_owner LOGIN;
CREATE ROLE idem_sqled_app LOGIN;
CREATE ROLE idem_sqled_other;
CREATE DATABASE $db;
SQL

# 1. A role without CREATE on the database is refused, and nothing is left.
if out=$($psql -X -q -v ON_ERROR_STOP=1 -d $db -U idem_sqled_owner -v schema=idempotency \
            -f "$installer" 2>&1); then
    fail "a role without CREATE installed the edition"
fi
echo "$out" | grep -q 'may not create it' || fail "unexpected refusal: $out"
as_super -Atc "SELECT count(*) FROM pg_namespace WHERE nspname = 'idempotency'" | grep -qx 0 \
    || fail "a refused install left its schema"

# 2. Installed by a role that is no superuser, with CREATE on the database.
as_super -c "GRANT CREATE ON DATABASE $db TO idem_sqled_owner" -c "GRANT CREATE ON SCHEMA public TO idem_sqled_owner"
as_owner -v schema=idempotency -f "$installer"
as_owner -Atc "SELECT version FROM idempotency.idem_sql_edition" | grep -qx 1.3 \
    || fail "idem_sql_edition does not record 1.3"

# Records of every state, as a claim would write them, made by the owner.
as_owner <<'SQL'
SET search_path = idempotency;
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
    attempt, on_lease_expiry, ttl, locked_until, created_at, claimed_at,
    updated_at, expires_at)
SELECT '', '', 'op', 'k' || i, sha256(convert_to(i::text, 'UTF8')), 'processing', 1,
       CASE WHEN i % 2 = 0 THEN 'retry' ELSE 'unknown' END::idem_lease_policy,
       '1 day', now() - interval '1 minute', now() - interval '2 hours',
       now() - interval '2 hours', now() - interval '2 hours', now() + interval '1 day'
  FROM generate_series(1, 12) AS i;
-- k7..k12: finished; k7, k8 long expired (deleted), k9, k10 past the grace
-- only (purged into tombstones), k11, k12 not expired
UPDATE idem_records SET state = 'succeeded', response_status = 200,
       response_body = '{"ok": true}', resource_id = 'r' || id, completed_at = now(),
       locked_until = NULL
 WHERE id > 6;
UPDATE idem_records SET expires_at = now() - interval '30 days' WHERE id IN (7, 8);
UPDATE idem_records SET expires_at = now() - interval '1 hour' WHERE id IN (9, 10);
SQL

digest="SELECT md5(string_agg(r::text, ',' ORDER BY r.id)) FROM idempotency.idem_records AS r"
before=$(as_owner -Atc "$digest")

# 3. A second run keeps every record, and the grants made since (to a role
# and to PUBLIC).
as_owner -c "GRANT EXECUTE ON FUNCTION idempotency.idem_expire_leases TO idem_sqled_app" \
         -c "GRANT EXECUTE ON FUNCTION idempotency.idem_records_without_role TO PUBLIC"
acl="SELECT string_agg(p.proname || ':' || has_function_privilege('idem_sqled_app', p.oid, 'EXECUTE')
                      || ':' || has_function_privilege('idem_sqled_other', p.oid, 'EXECUTE'), ' ' ORDER BY p.proname)
       FROM pg_proc AS p
      WHERE p.pronamespace = 'idempotency'::regnamespace
        AND p.proname IN ('idem_cleanup', 'idem_expire_leases', 'idem_records_without_role')"
granted='idem_cleanup:false:false idem_expire_leases:true:false idem_records_without_role:true:true'
[ "$(as_owner -Atc "$acl")" = "$granted" ] || fail "grants before the second run: $(as_owner -Atc "$acl")"
as_owner -v schema=idempotency -f "$installer"
[ "$(as_owner -Atc "$digest")" = "$before" ] || fail "a second run changed the records"
[ "$(as_owner -Atc "$acl")" = "$granted" ] || fail "a second run changed the grants: $(as_owner -Atc "$acl")"

# An install of 1.3 made before the private helpers of the settings, the
# passes and idem_list had their idem__* names (the helpers of this one
# renamed back to the names it gave them): a run of the installer leaves
# none of the old names, keeps every record and grant, and everything that
# called them works (the passes and idem_list below).
helpers="'idem__setting_integer', 'idem__setting_enum', 'idem__setting_boolean', 'idem__pass_sql',
         'idem__pass_skip', 'idem__pass_batch', 'idem__list_for', 'idem__key_hash_prefix',
         'idem__redact_key', 'idem__error_concerns_rows', 'idem__positive_argument'"
old_names="SELECT count(*) FROM pg_proc
            WHERE pronamespace = 'idempotency'::regnamespace
              AND 'idem__' || substr(proname, 6) IN ($helpers)"
as_owner -c "DO \$\$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc AS p
              WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proname IN ($helpers) LOOP
        EXECUTE format('ALTER FUNCTION %s RENAME TO %I', f,
                       'idem_' || substr((SELECT proname FROM pg_proc WHERE oid = f), 7));
    END LOOP;
END \$\$"
[ "$(as_owner -Atc "$old_names")" = 11 ] || fail "the helpers were not renamed back: $(as_owner -Atc "$old_names")"
as_owner -v schema=idempotency -f "$installer"
[ "$(as_owner -Atc "$old_names")" = 0 ] || fail "a run over the old names left $(as_owner -Atc "$old_names") of them"
[ "$(as_owner -Atc "$digest")" = "$before" ] || fail "a run over the old names changed the records"
[ "$(as_owner -Atc "$acl")" = "$granted" ] || fail "a run over the old names changed the grants: $(as_owner -Atc "$acl")"

# 4. A downgrade is refused, and keeps every record.
as_owner -c "UPDATE idempotency.idem_sql_edition SET version = '1.10'"
if out=$(as_owner -v schema=idempotency -f "$installer" 2>&1); then
    fail "an installer of 1.3 ran over 1.10"
fi
echo "$out" | grep -q 'idempotency SQL edition 1.10 is installed in schema "idempotency": this installer (1.3) does not downgrade it' \
    || fail "unexpected refusal of a downgrade: $out"
[ "$(as_owner -Atc "$digest")" = "$before" ] || fail "a refused downgrade changed the records"
as_owner -Atc "SELECT version FROM idempotency.idem_sql_edition" | grep -qx 1.10 \
    || fail "a refused downgrade changed the recorded version"
as_owner -c "UPDATE idempotency.idem_sql_edition SET version = '1.3'"

# 5. A setting that does not parse is refused where it is read (22023).
out=$(as_owner -c "SET idempotency.cleanup_grace = '10 parsecs'" \
               -c "SELECT idempotency.idem_cleanup()" 2>&1 || true)
echo "$out" | grep -q 'invalid value for parameter "idempotency.cleanup_grace": "10 parsecs"' \
    || fail "a bad cleanup_grace was not refused: $out"
out=$(as_owner -c "SET idempotency.cleanup_batch_size = 0" \
               -c "SELECT idempotency.idem_expire_leases()" 2>&1 || true)
echo "$out" | grep -q '0 is outside the valid range for parameter "idempotency.cleanup_batch_size" (1 .. 1000000)' \
    || fail "a cleanup_batch_size of 0 was not refused: $out"
[ "$(as_owner -Atc "$digest")" = "$before" ] || fail "a refused setting let a pass change records"

# 6. The procedure pg_cron calls: every batch commits on its own (each
# UPDATE statement of a pass runs in a transaction of its own), leases
# expire as their policy says, long-expired records go (to the archive
# first), recently expired ones become tombstones, the rest stays.
as_owner <<'SQL'
CREATE TABLE public.batch_log (xid xid8);
CREATE FUNCTION public.log_batch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.batch_log VALUES (pg_current_xact_id());
  RETURN NULL;
END $$;
CREATE TRIGGER log_batch AFTER UPDATE ON idempotency.idem_records
  FOR EACH STATEMENT EXECUTE FUNCTION public.log_batch();
SET idempotency.cleanup_batch_size = 2;
SET idempotency.cleanup_delay = 0;
SET idempotency.cleanup_action = 'archive';
CALL idempotency.idem_maintenance();
SQL
as_owner -At >"${TMPDIR:-/tmp}/idem_sqled_check.$$" <<'SQL'
SET search_path = idempotency;
SELECT 'states', string_agg(key || '=' || state, ' ' ORDER BY id) FROM idem_records;
SELECT 'batches', count(*) >= 4 AND count(DISTINCT xid) = count(*) FROM public.batch_log;
DROP TRIGGER log_batch ON idem_records;
SELECT 'archived', string_agg(key, ' ' ORDER BY id) FROM idem_records_archive;
SELECT 'tombstones', string_agg(key, ' ' ORDER BY id) FROM idem_records
 WHERE response_body IS NULL AND resource_id IS NULL AND state = 'succeeded';
SQL
check=$(cat "${TMPDIR:-/tmp}/idem_sqled_check.$$"); rm -f "${TMPDIR:-/tmp}/idem_sqled_check.$$"
expect() {
    printf '%s\n' "$check" | grep -qxF "$1" || fail "expected \"$1\" in: $check"
}
expect 'states|k1=unknown k2=retryable k3=unknown k4=retryable k5=unknown k6=retryable k9=succeeded k10=succeeded k11=succeeded k12=succeeded'
expect 'batches|t'
expect 'archived|k7 k8 k9 k10'
expect 'tombstones|k9 k10'

# 7. idem_list answers the calling role only, and only for a role the
# session may become.
as_super <<'SQL'
GRANT USAGE ON SCHEMA idempotency TO idem_sqled_app, idem_sqled_other;
SQL
as_owner <<'SQL'
GRANT EXECUTE ON FUNCTION idempotency.idem_list TO idem_sqled_app, idem_sqled_other;
-- born processing with its lease ended, then marked unknown: the only way
-- the records guard lets a record become unknown
INSERT INTO idempotency.idem_records (role, tenant, caller, operation, key, fingerprint,
    state, attempt, locked_until, on_lease_expiry, ttl, created_at, claimed_at, updated_at,
    expires_at)
SELECT r::regrole, '', '', 'op', 'u', sha256(''), 'processing', 1, now() - interval '1 minute',
       'unknown', '1 day', now(), now(), now(), now() + interval '1 day'
  FROM unnest(ARRAY['idem_sqled_app', 'idem_sqled_other']) AS r;
UPDATE idempotency.idem_records SET state = 'unknown' WHERE key = 'u';
SQL
$psql -X -q -At -d $db -U idem_sqled_app -c "SELECT key FROM idempotency.idem_list('unknown')" \
    | grep -qx u || fail "idem_list did not list the role's own record"
out=$($psql -X -q -d $db -U idem_sqled_app \
        -c "SELECT * FROM idempotency.idem__list_for('idem_sqled_other', 'unknown', NULL, NULL, 100)" 2>&1 || true)
echo "$out" | grep -q 'permission denied to act as role "idem_sqled_other"' \
    || fail "idem__list_for answered for another role: $out"

echo "install_and_maintenance: install, second run, downgrade, settings, maintenance and idem_list checked"
