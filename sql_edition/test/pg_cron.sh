#!/bin/sh
# The SQL edition's maintenance run by pg_cron, scheduled by a role that is
# no superuser, as on a managed service: the role that installed the edition
# schedules CALL idem_maintenance() in its database with
# cron.schedule_in_database (EXECUTE on it granted, as the services grant
# it), and the next run expires the leases that ended.
#
# Needs a server with pg_cron in shared_preload_libraries, installed in the
# database cron.database_name names (CRON_DB, postgres by default), and able
# to connect to itself as pg_cron does (cron.host, or background workers);
# a superuser to set the roles up, chosen by PSQL as in the other tests:
#   PSQL="psql -h /tmp -p 5432 -U postgres" sql_edition/test/pg_cron.sh
# A run starts at the next full minute: this waits up to 150 seconds.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
psql=${PSQL:-psql}
cron_db=${CRON_DB:-postgres}
db=idem_sqled_cron
PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
export PGOPTIONS

cleanup() {
    $psql -X -q -d "$cron_db" <<SQL >/dev/null 2>&1 || true
SELECT cron.unschedule(jobid) FROM cron.job WHERE username = 'idem_sqled_cron_owner';
DROP DATABASE IF EXISTS $db;
REVOKE ALL ON FUNCTION cron.schedule_in_database(text, text, text, text, text, boolean)
    FROM idem_sqled_cron_owner;
REVOKE ALL ON SCHEMA cron FROM idem_sqled_cron_owner;
DROP ROLE IF EXISTS idem_sqled_cron_owner;
SQL
}
trap cleanup EXIT
cleanup
fail() { echo "pg_cron: $*" >&2; exit 1; }

$psql -X -q -v ON_ERROR_STOP=1 -d "$cron_db" <<SQL
CREATE ROLE idem_sqled_cron_owner LOGIN;
CREATE DATABASE $db OWNER idem_sqled_cron_owner;
GRANT USAGE ON SCHEMA cron TO idem_sqled_cron_owner;
GRANT EXECUTE ON FUNCTION cron.schedule_in_database(text, text, text, text, text, boolean)
    TO idem_sqled_cron_owner;
SQL
owner() { $psql -X -q -v ON_ERROR_STOP=1 -U idem_sqled_cron_owner "$@"; }

owner -d $db -v schema=idempotency -f "$here/idempotency_sql.sql"
owner -d $db <<'SQL'
INSERT INTO idempotency.idem_records (tenant, caller, operation, key, fingerprint, state,
    attempt, on_lease_expiry, ttl, locked_until, created_at, claimed_at, updated_at, expires_at)
SELECT '', '', 'op', 'k' || i, sha256(''), 'processing', 1,
       CASE WHEN i = 1 THEN 'retry' ELSE 'unknown' END::idempotency.idem_lease_policy, '1 day',
       now() - interval '1 minute', now(), now(), now(), now() + interval '1 day'
  FROM generate_series(1, 3) AS i;
SQL

job=$(owner -d "$cron_db" -Atc "SELECT cron.schedule_in_database('idem-maintenance-test',
          '* * * * *', 'CALL idempotency.idem_maintenance()', '$db')")

status=
i=0
while [ $i -lt 75 ]; do
    status=$(owner -d "$cron_db" -Atc "SELECT status || ': ' || coalesce(return_message, '')
                                         FROM cron.job_run_details WHERE jobid = $job
                                        ORDER BY runid DESC LIMIT 1")
    case "$status" in
        succeeded:*|failed:*) break ;;
    esac
    sleep 2
    i=$((i + 1))
done
[ "$status" = "succeeded: CALL" ] || fail "the job's run: '${status:-none within 150 s}'"
states=$(owner -d $db -Atc "SELECT string_agg(key || '=' || state, ' ' ORDER BY id)
                              FROM idempotency.idem_records")
[ "$states" = "k1=retryable k2=unknown k3=unknown" ] || fail "after the run: $states"
echo "pg_cron: a job scheduled by the installing role ran idem_maintenance() and expired the leases"
