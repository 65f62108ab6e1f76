# The background worker on a cluster with the library preloaded and a short
# naptime: a database that does not exist, a database created later, the
# extension missing, created, dropped and created again, lease expiry to
# unknown and to retryable, chunked cleanup of a backlog, unknown and
# processing records never deleted, SIGHUP, SIGTERM, kill -9 of the launcher
# and of a client backend, idem_launch_worker(), and no worker on a standby.
# Each cycle runs in a process of its own; the status's pid is that of the
# launcher serving the database.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('worker');
$node->init(allows_streaming => 1);
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.database = 'appdb, nosuchdb'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
# deletion without tombstones; t/005_worker_tombstones.pl keeps them
idempotency.tombstone_ttl = 0
idempotency.cleanup_batch_size = 1000
idempotency.cleanup_max_batches = 5
restart_after_crash = on
});
$node->start;

# Insert $n processing records keyed $prefix1..$prefixN.
sub insert_processing
{
	my (%a) = @_;
	my $policy = $a{policy} // 'unknown';
	my $lease = $a{lease} // '1 hour';
	my $ttl = $a{ttl} // '1 day';
	my $expires = $a{expires} // '1 day';
	return qq{
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
    attempt, on_lease_expiry, ttl, locked_until, created_at, claimed_at,
    updated_at, expires_at)
SELECT '', 'app', 'op', '$a{prefix}' || i, sha256(''), 'processing', 1,
    '$policy', '$ttl', now() + interval '$lease', now(), now(), now(),
    now() + interval '$expires'
  FROM generate_series(1, $a{n}) i;
};
}

# Records that succeeded and expired an hour ago, in one transaction.
sub insert_expired_succeeded
{
	my ($prefix, $n) = @_;
	$node->safe_psql('appdb',
		    "BEGIN;\n"
		  . insert_processing(prefix => $prefix, n => $n)
		  . "UPDATE idem_records SET state = 'succeeded', response_status = 200,"
		  . " completed_at = now() WHERE key LIKE '$prefix%';\n"
		  . "UPDATE idem_records SET expires_at = now() - interval '1 hour'"
		  . " WHERE key LIKE '$prefix%';\n"
		  . "COMMIT;");
}

sub count_keys
{
	my ($prefix, $state) = @_;
	my $where = "key LIKE '$prefix%'";
	$where .= " AND state = '$state'" if defined $state;
	return $node->safe_psql('appdb',
		"SELECT count(*) FROM idem_records WHERE $where");
}

sub status
{
	my ($column) = @_;
	return $node->safe_psql('appdb',
		"SELECT $column FROM idem_worker_status() WHERE database = 'appdb'");
}

# A new launcher serves appdb (not $old_pid) and has finished a cycle.
sub wait_for_new_worker
{
	my ($old_pid, $what) = @_;
	ok( $node->poll_query_until(
			'appdb', qq{
SELECT count(*) = 1 FROM idem_worker_status()
 WHERE database = 'appdb' AND pid <> $old_pid AND cycles > 0}),
		"a new launcher serves the database after $what");
	my $pid = status('pid');
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'idempotency launcher' AND pid = $pid}),
		"the new launcher runs after $what");
	return $pid;
}

# A lease that ended is expired by the current worker.
sub lease_gets_expired
{
	my ($prefix, $what) = @_;
	$node->safe_psql('appdb',
		insert_processing(prefix => $prefix, n => 1, lease => '-1 second'));
	ok( $node->poll_query_until(
			'appdb',
			"SELECT state = 'unknown' FROM idem_records WHERE key = '${prefix}1'"),
		"leases expire again after $what");
}

#
# A database that does not exist, and one created later.
#
$node->wait_for_log(
	qr/database "nosuchdb" named in idempotency.database does not exist/);
$node->wait_for_log(
	qr/database "appdb" named in idempotency.database does not exist/);
pass('a missing database is reported in the log');

$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->wait_for_log(
	qr/idempotency worker for database "appdb" is waiting for extension "idempotency" to be installed/
);
pass('the worker of a database created later waits for the extension');

#
# Visible in pg_stat_activity, with its own wait event while sleeping.
#
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'idempotency launcher'
   AND application_name = 'idempotency launcher'
   AND datname IS NULL
   AND wait_event_type = 'Extension' AND wait_event = 'Extension'}),
	'the launcher shows in pg_stat_activity, connected to no database, sleeping in its wait event');

#
# Extension created: the worker starts its cycles.
#
my $offset = -s $node->logfile;
$node->safe_psql('appdb', 'CREATE EXTENSION idempotency');
$node->wait_for_log(
	qr/idempotency worker for database "appdb" found extension "idempotency"/,
	$offset);
ok( $node->poll_query_until(
		'appdb',
		"SELECT cycles > 0 FROM idem_worker_status() WHERE database = 'appdb'"),
	'the worker runs cycles once the extension exists');

#
# Lease expiry to unknown and to retryable.  gone-* records get a tiny ttl:
# gone-r becomes retryable and expired, so cleanup deletes it; gone-u becomes
# unknown and expired, which cleanup must never delete.  live-* holds a live
# lease and an expiry in the past: processing records are never deleted.
#
$node->safe_psql(
	'appdb',
	insert_processing(
		prefix => 'u-',
		n => 3,
		policy => 'unknown',
		lease => '-1 minute')
	  . insert_processing(
		prefix => 'r-',
		n => 3,
		policy => 'retry',
		lease => '-1 minute')
	  . insert_processing(
		prefix => 'gone-u-',
		n => 2,
		policy => 'unknown',
		lease => '-1 minute',
		ttl => '1 millisecond')
	  . insert_processing(
		prefix => 'gone-r-',
		n => 2,
		policy => 'retry',
		lease => '-1 minute',
		ttl => '1 millisecond')
	  . insert_processing(
		prefix => 'live-',
		n => 2,
		lease => '1 hour',
		expires => '-1 hour'));

ok( $node->poll_query_until(
		'appdb', q{
SELECT count(*) = 0 FROM idem_records
 WHERE state = 'processing' AND locked_until < clock_timestamp()}),
	'the worker expires ended leases');
is(count_keys('u-', 'unknown'), '3', 'policy unknown moves to unknown');
is(count_keys('r-', 'retryable'), '3', 'policy retry moves to retryable');
is( $node->safe_psql(
		'appdb', q{
SELECT count(*) FROM idem_records
 WHERE key ~ '^(u|r)-'
   AND expires_at = updated_at + ttl
   AND updated_at > claimed_at
   AND attempt = 1 AND locked_until < claimed_at}),
	'6',
	'lease expiry sets updated_at and expires_at = updated_at + ttl, nothing else');
ok($node->poll_query_until('appdb', "SELECT count(*) = 0 FROM idem_records WHERE key LIKE 'gone-r-%'"),
	'cleanup deletes expired retryable records');
is(count_keys('live-', 'processing'), '2', 'a live lease is left alone');

#
# Chunked cleanup of a backlog: 20000 expired records, batches of 1000, at
# most 5 batches per cycle.
#
my $deleted_before = status('rows_deleted');
my $batches_before = status('cleanup_batches');
$offset = -s $node->logfile;
insert_expired_succeeded('old-', 20000);
ok( $node->poll_query_until(
		'appdb', "SELECT count(*) = 0 FROM idem_records WHERE key LIKE 'old-%'"),
	'the worker drains the backlog');
is(status('rows_deleted') - $deleted_before, 20000, 'status counts 20000 deleted rows');
is(status('cleanup_batches') - $batches_before, 20, 'in 20 batches of 1000');
my $log = slurp_file($node->logfile, $offset);
my $limited = () = $log =~ /reached idempotency.cleanup_max_batches/g;
is($limited, 4, 'over 4 cycles of at most 5 batches');
is(count_keys('gone-u-', 'unknown'), '2', 'expired unknown records are never deleted');
is(count_keys('live-', 'processing'), '2', 'processing records are never deleted');
is(status('last_error'), '', 'no error so far');

#
# SIGHUP: naptime, batch size and delay change without a restart.
#
$offset = -s $node->logfile;
$node->append_conf('postgresql.conf',
	"idempotency.naptime = '1h'\nidempotency.cleanup_batch_size = 250\nidempotency.cleanup_delay = '5ms'");
$node->reload;
$node->wait_for_log(
	qr/idempotency launcher reloaded its settings\n.*DETAIL:  naptime 3600000 ms, cleanup batch size 250, .*, cleanup delay 5 ms\./,
	$offset);
pass('the launcher reloads the settings on SIGHUP');
# The launcher starts a cycle at once (after the one running, if any), then
# waits the new naptime: wait until a cycle that started after the reload
# has ended.
my ($hup_at) = slurp_file($node->logfile, $offset) =~
  /^(\S+ \S+ \S+) \[\d+\] (?:[0-9A-Z]{5} )?LOG:  idempotency launcher reloaded its settings/m;
ok( $node->poll_query_until(
		'appdb',
		"SELECT last_cycle_at >= '$hup_at'::timestamptz FROM idem_worker_status() WHERE database = 'appdb'"
	),
	'a cycle started after the reload has ended');
$batches_before = status('cleanup_batches');
insert_expired_succeeded('hup-', 1000);
# The old naptime would clean these within 100ms; the new one waits an hour.
$node->safe_psql('appdb', 'SELECT pg_sleep(0.5)');
is(count_keys('hup-'), '1000', 'a longer naptime takes effect');
$node->append_conf('postgresql.conf', "idempotency.naptime = '100ms'");
$node->reload;
ok( $node->poll_query_until(
		'appdb', "SELECT count(*) = 0 FROM idem_records WHERE key LIKE 'hup-%'"),
	'a reload wakes the worker and a shorter naptime takes effect');
is(status('cleanup_batches') - $batches_before, 4, 'a new batch size takes effect');

#
# An error inside a cycle is logged and kept in the status, and the worker
# goes on: cancel the worker while it waits for a lock on the table.
#
my $locker = $node->background_psql('appdb');
$locker->query_safe(
	'BEGIN; LOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE');
my $launcher_pid = status('pid');
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'idempotency worker' AND datname = 'appdb'
   AND wait_event_type = 'Lock'}),
	'the worker waits for the table lock');
my $worker_pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency worker' AND datname = 'appdb'"
);
$offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($worker_pid)");
$node->wait_for_log(
	qr/idempotency worker for database "appdb" failed a cycle: canceling statement due to user request/,
	$offset);
$locker->query_safe('COMMIT');
$locker->quit;
like(
	status('last_error_at IS NOT NULL AS ok, last_error'),
	qr/^t\|canceling statement due to user request$/,
	'the error is kept in the status');
lease_gets_expired('after-error-', 'an error in a cycle');
is(status('pid'), $launcher_pid, 'the same launcher goes on after an error');

#
# SIGTERM: the launcher exits at once; the postmaster starts another.
#
my $pid = status('pid');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'SIGTERM ends the launcher');
$pid = wait_for_new_worker($pid, 'SIGTERM');

#
# idem_launch_worker(): refused where a worker runs, starts one elsewhere.
#
my ($ret, $stdout, $stderr) =
  $node->psql('appdb', 'SELECT idem_launch_worker()');
like(
	$stderr,
	qr/ERROR:  an idempotency worker is already running in database "appdb"\nDETAIL:  Its process ID is $pid\./,
	'idem_launch_worker refuses a second worker for a database');
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
my $manual = $node->safe_psql('postgres', 'SELECT idem_launch_worker()');
like($manual, qr/^\d+$/, 'idem_launch_worker starts a launcher and returns its pid');
is( $node->safe_psql(
		'postgres',
		"SELECT pid FROM idem_worker_status() WHERE database = 'postgres'"),
	$manual,
	'idem_worker_status shows the started worker');
($ret, $stdout, $stderr) =
  $node->psql('postgres', 'SELECT idem_launch_worker()');
like(
	$stderr,
	qr/an idempotency worker is already running in database "postgres"/,
	'and refuses a second one');

#
# kill -9 of the launcher: crash restart, the launcher comes back.
#
$offset = -s $node->logfile;
kill 'KILL', $pid;
$node->wait_for_log(qr/all server processes terminated; reinitializing/,
	$offset);
$pid = wait_for_new_worker($pid, 'kill -9 of the launcher');
lease_gets_expired('after-kill-launcher-', 'kill -9 of the launcher');

#
# kill -9 of a client backend: same.
#
my $client = $node->background_psql('appdb');
my $client_pid = $client->query_safe('SELECT pg_backend_pid()');
$offset = -s $node->logfile;
kill 'KILL', $client_pid;
$node->wait_for_log(qr/all server processes terminated; reinitializing/,
	$offset);
eval { $client->quit; };
$pid = wait_for_new_worker($pid, 'kill -9 of a client backend');
lease_gets_expired('after-kill-client-', 'kill -9 of a client backend');

#
# DROP EXTENSION and CREATE EXTENSION again.
#
$offset = -s $node->logfile;
$node->safe_psql('appdb', 'DROP EXTENSION idempotency');
$node->wait_for_log(
	qr/idempotency worker for database "appdb" is waiting for extension "idempotency" to be installed/,
	$offset);
pass('the worker waits again after DROP EXTENSION');
$node->safe_psql('appdb', 'CREATE EXTENSION idempotency');
$node->wait_for_log(
	qr/idempotency worker for database "appdb" found extension "idempotency"/,
	$offset);
lease_gets_expired('after-recreate-', 'CREATE EXTENSION again');
is(status('pid'), $pid, 'the same launcher survived DROP EXTENSION');

#
# The database that does not exist: one line per launcher start, never a
# crash loop.
#
$log = slurp_file($node->logfile);
my $launches = () = $log =~ /LOG:  idempotency launcher started/g;
my $missing = () =
  $log =~ /database "nosuchdb" named in idempotency.database does not exist/g;
is($launches, 5,
	'the launcher started five times (a restart after SIGTERM, two crash restarts, idem_launch_worker)'
);
is($missing, $launches - 1,
	'one LOG line per start of the launcher serving the missing database');
unlike($log, qr/FATAL:.*nosuchdb/, 'no FATAL for the missing database');

#
# A standby runs no worker.
#
$node->backup('bkp');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'bkp', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'"
	),
	'0',
	'no launcher or worker runs on a standby');
($ret, $stdout, $stderr) =
  $standby->psql('appdb', 'SELECT idem_launch_worker()');
like(
	$stderr,
	qr/cannot start the idempotency worker during recovery/,
	'idem_launch_worker refuses on a standby');
$standby->stop;

$node->stop;
done_testing();
