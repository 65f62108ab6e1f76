# The worker with idempotency.cleanup_action = 'archive' when archiving
# fails: nothing is purged or deleted without its copy, and nothing is lost.
#  - the archive table renamed away: cleanup and purge log a clear error
#    every cycle and change nothing, lease expiry goes on; the table back,
#    the records are copied and purged;
#  - a cycle process killed (SIGKILL) in the middle of a purge pass: the
#    batches before it are purged with their copies, the rest still hold
#    their responses, no record is half purged, and the cycles after the
#    restart finish the work with one copy per record.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = preloaded_node(
	'archive_faults',
	database => 'appdb',
	conf => q{
idempotency.database = 'appdb'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
idempotency.cleanup_batch_size = 7
idempotency.cleanup_action = 'archive'
restart_after_crash = on
});

# $n completed commands keyed $prefix01..$prefixNN whose records expired an
# hour ago, the first key the longest ago.
sub finished
{
	my ($prefix, $n) = @_;
	$node->safe_psql('appdb', qq{
SELECT idem_complete((idem_claim('op', '$prefix' || to_char(i, 'FM00'), '{"n": 1}')).token,
                     201, '{"id": "R-1"}', '{"Location": "/r/1"}', 'R-1')
  FROM generate_series(1, $n) i;
UPDATE idem_records
   SET expires_at = now() - interval '1 hour' - right(key, 2)::int * interval '-1 second'
 WHERE key LIKE '$prefix%';
});
}

# SQL: the records of $prefix that hold their response, those purged with
# exactly one full copy in the archive, and those purged without one.
sub census
{
	my ($prefix) = @_;
	return $node->safe_psql('appdb', qq{
SELECT count(*) FILTER (WHERE r.response_body IS NOT NULL) || ' held, ' ||
       count(*) FILTER (WHERE r.response_body IS NULL AND copies = 1) || ' purged with a copy, ' ||
       count(*) FILTER (WHERE r.response_body IS NULL AND copies <> 1) || ' purged without'
  FROM idem_records r,
       LATERAL (SELECT count(*) AS copies FROM idem_records_archive a
                 WHERE a.id = r.id AND a.claimed_at = r.claimed_at
                   AND a.response_body = '{"id": "R-1"}'
                   AND a.response_headers = '{"Location": "/r/1"}'
                   AND a.resource_id = 'R-1') c
 WHERE r.key LIKE '$prefix%'});
}

#
# The archive table renamed away.
#
$node->safe_psql('appdb',
	'ALTER TABLE idem_records_archive RENAME TO idem_records_archive_moved');
my $log_offset = -s $node->logfile;
finished('moved-', 10);
$node->safe_psql('appdb', q{
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint,
    state, attempt, on_lease_expiry, ttl, locked_until, created_at,
    claimed_at, updated_at, expires_at)
VALUES ('', 'app', 'op', 'lease-ended', sha256(''), 'processing', 1, 'unknown',
    '1 day', now() - interval '1 minute', now(), now(), now(),
    now() + interval '1 day')});

$node->wait_for_log(
	qr/idempotency worker for database "appdb" failed a cycle: idempotency purge cannot archive: relation "public.idem_records_archive" does not exist/,
	$log_offset);
ok( $node->poll_query_until(
		'appdb', q{SELECT state = 'unknown' FROM idem_records WHERE key = 'lease-ended'}),
	'without the archive table, lease expiry goes on');
# Several cycles later, still nothing purged.
$node->wait_for_log(
	qr/failed a cycle: idempotency purge cannot archive(?s:.*)failed a cycle: idempotency purge cannot archive/,
	$log_offset);
is( $node->safe_psql(
		'appdb', q{
SELECT count(*) FILTER (WHERE response_body IS NOT NULL) || ' of ' || count(*)
  FROM idem_records WHERE key LIKE 'moved-%'}),
	'10 of 10', 'without the archive table, no record is purged');

$node->safe_psql('appdb',
	'ALTER TABLE idem_records_archive_moved RENAME TO idem_records_archive');
ok( $node->poll_query_until(
		'appdb', qq{SELECT count(*) = 0 FROM idem_records WHERE key LIKE 'moved-%' AND response_body IS NOT NULL}),
	'the table back, the worker purges');
is(census('moved-'), '0 held, 10 purged with a copy, 0 purged without',
	'each purged record has its full copy');

#
# SIGKILL of the cycle process in the middle of a purge pass: a trigger on
# the archive makes the copy of killed-10 (in the second batch of seven)
# wait for an advisory lock this session holds.
#
$node->safe_psql('appdb', q{
CREATE FUNCTION archive_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.key = 'killed-10' THEN
    PERFORM pg_advisory_xact_lock(4242);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER archive_gate BEFORE INSERT ON idem_records_archive
  FOR EACH ROW EXECUTE FUNCTION archive_gate();
});
my $gate = $node->background_psql('appdb');
$gate->query_safe('BEGIN');
$gate->query_safe('SELECT pg_advisory_xact_lock(4242)');
finished('killed-', 20);
ok( $node->poll_query_until(
		'appdb', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'idempotency worker' AND wait_event_type = 'Lock'
   AND wait_event = 'advisory'}),
	'the purge pass waits in the copy of the second batch');
my $worker_pid = $node->safe_psql('appdb', q{
SELECT pid FROM pg_stat_activity
 WHERE backend_type = 'idempotency worker' AND wait_event = 'advisory'});
is(census('killed-'), '13 held, 7 purged with a copy, 0 purged without',
	'the first batch is purged with its copies, the second not yet');

# From now on the copy of killed-10 fails (an error that is no row's
# fault, so it ends the pass): the crash frees the lock, not the gate.
$node->safe_psql('appdb', q{
CREATE OR REPLACE FUNCTION archive_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.key = 'killed-10' THEN
    RAISE EXCEPTION 'archive gate closed' USING ERRCODE = 'lock_not_available';
  END IF;
  RETURN NEW;
END $$;
});

$log_offset = -s $node->logfile;
kill 'KILL', $worker_pid;
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
eval { $gate->quit; };
$node->wait_for_log(
	qr/idempotency worker for database "appdb" failed a cycle: archive gate closed/,
	$log_offset);
is(census('killed-'), '13 held, 7 purged with a copy, 0 purged without',
	'after SIGKILL: the batch killed changed nothing, no record is half purged');

$node->safe_psql('appdb', 'DROP TRIGGER archive_gate ON idem_records_archive');
ok( $node->poll_query_until(
		'appdb', qq{SELECT count(*) = 0 FROM idem_records WHERE key LIKE 'killed-%' AND response_body IS NOT NULL}),
	'the cycles after the restart purge the rest');
is(census('killed-'), '0 held, 20 purged with a copy, 0 purged without',
	'every record purged once, with one full copy');

$node->stop;
done_testing();
