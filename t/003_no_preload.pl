# Without shared_preload_libraries: no launcher, the SQL passes work,
# idem_launch_worker() still starts a launcher whose cycles serve the
# current database, and idem_stat_operations counts nothing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('no_preload');
$node->init;
$node->append_conf('postgresql.conf', "idempotency.naptime = '100ms'");
$node->append_conf('postgresql.conf', 'max_prepared_transactions = 2');
$node->start;

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'"
	),
	'0',
	'no launcher or worker runs without the preload');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_worker_status()'),
	'0', 'idem_worker_status() is empty');

my $insert = q{
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
    attempt, on_lease_expiry, ttl, locked_until, created_at, claimed_at,
    updated_at, expires_at)
VALUES ('', 'app', 'op', 'KEY', sha256(''), 'processing', 1, 'retry', '1 day',
    now() - interval '1 minute', now(), now(), now(), now() + interval '1 day');
};
(my $sql = $insert) =~ s/KEY/by-sql/;
$node->safe_psql('postgres', $sql);
is($node->safe_psql('postgres', 'SELECT idem_expire_leases()'),
	'1', 'idem_expire_leases() works from SQL');

my $pid = $node->safe_psql('postgres', 'SELECT idem_launch_worker()');
like($pid, qr/^\d+$/, 'idem_launch_worker() starts a launcher for the database');
is( $node->safe_psql(
		'postgres',
		"SELECT backend_type || ', ' || coalesce(datname, 'no database') FROM pg_stat_activity WHERE pid = $pid"),
	'idempotency launcher, no database',
	'the launcher runs, connected to no database');

($sql = $insert) =~ s/KEY/by-worker/;
$node->safe_psql('postgres', $sql);
ok( $node->poll_query_until(
		'postgres',
		"SELECT state = 'retryable' FROM idem_records WHERE key = 'by-worker'"),
	'the launched worker expires leases');
is( $node->safe_psql(
		'postgres',
		"SELECT pid = $pid AND rows_expired = 1 FROM idem_worker_status()"),
	't',
	'idem_worker_status() shows it');

# idempotency.max_new_keys_per_second needs the shared memory reserved at
# start: without the preload it is ignored, and a session that meets a claim
# it would limit says so once.
$node->append_conf('postgresql.conf', 'idempotency.max_new_keys_per_second = 1');
$node->reload;
ok( $node->poll_query_until(
		'postgres',
		"SELECT current_setting('idempotency.max_new_keys_per_second', true) = '1'"),
	'the rate limit is set');
my ($ret, $out, $err) = $node->psql('postgres', q{
SELECT string_agg(DISTINCT outcome, ',')
  FROM generate_series(1, 20) i,
       idem_claim('limit.op', 'new-' || i) c;
});
is($out, 'proceed', 'without the preload, new keys are not rate limited');
my @warnings = ($err =~ /WARNING:  idempotency.max_new_keys_per_second is ignored because the library is not in shared_preload_libraries/g);
is(scalar(@warnings), 1, '... and the session is warned once');

# Without the preload nothing is counted: the counters' table is sized and
# created at server start.  The views show no rows; a reset says why.
$node->safe_psql('postgres', "SELECT outcome FROM idem_claim('stat.op', 'k1')");
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stat_operations'),
	'0', 'idem_stat_operations has no rows without the preload');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stat_operations_info'),
	'0', 'idem_stat_operations_info neither');
my ($stdout, $stderr);
($ret, $stdout, $stderr) =
  $node->psql('postgres', 'SELECT idem_stat_reset()');
like(
	$stderr,
	qr/idempotency counters are not kept.*HINT:  Add idempotency to shared_preload_libraries/s,
	'idem_stat_reset() says why');

# A session loads the library at its first call, which may come in the
# middle of a DDL statement (here from an event trigger at its start) that
# the library's hooks did not see begin.  A claim of that transaction is
# written at once, so the rest of the statement checks its row: the ALTER
# TABLE fails, not the COMMIT after the claim answered proceed.
$node->safe_psql('postgres', q{
CREATE FUNCTION claim_at_ddl() RETURNS event_trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM idem_claim('np.op', 'np-1', '{}'); END $$;
CREATE EVENT TRIGGER claim_at_ddl ON ddl_command_start
  WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION claim_at_ddl();
});
($ret, $stdout, $stderr) = $node->psql('postgres', q{
BEGIN;
ALTER TABLE idem_records ADD CONSTRAINT np_no_1 CHECK (key <> 'np-1');
COMMIT;
});
like(
	$stderr,
	qr/check constraint "np_no_1" of relation "idem_records" is violated by some row/,
	'a claim made in the DDL statement that loads the library is written at once');
$node->safe_psql('postgres',
	'DROP EVENT TRIGGER claim_at_ddl; DROP FUNCTION claim_at_ddl()');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_constraint WHERE conname = 'np_no_1'"),
	'0',
	'... and the constraint was not added');

# In the session's next transactions a claim is kept pending again: its
# record is inserted once, at the completion.
is( $node->safe_psql(
		'postgres', q{
SELECT outcome FROM idem_claim('np.op', 'np-2', '{}');
BEGIN;
SELECT n_tup_ins AS before FROM pg_stat_xact_user_tables
 WHERE relname = 'idem_records' \\gset
SELECT outcome FROM idem_claim('np.op', 'np-3', '{}');
SELECT n_tup_ins - :before FROM pg_stat_xact_user_tables
 WHERE relname = 'idem_records';
COMMIT;
}),
	"proceed\nproceed\n0",
	'a later transaction of that session keeps its claim pending');

# The same after a transaction that loads the library with a claim and
# commits, or prepares: that claim is written at once (the hook may have
# missed a DDL statement of its transaction), the next transaction's is
# kept pending.
my $inserted = q{
SELECT n_tup_ins - :before FROM pg_stat_xact_user_tables
 WHERE relname = 'idem_records';
};
my $before = q{
SELECT n_tup_ins AS before FROM pg_stat_xact_user_tables
 WHERE relname = 'idem_records' \gset
};
foreach my $end ('COMMIT', "PREPARE TRANSACTION 'np_loaded'")
{
	is( $node->safe_psql(
			'postgres', qq{
BEGIN;
$before
SELECT outcome FROM idem_claim('np.op', 'np-end-1', '{}');
$inserted
$end;
BEGIN;
$before
SELECT outcome FROM idem_claim('np.op', 'np-end-2', '{}');
$inserted
COMMIT;
}),
		"proceed\n1\nproceed\n0",
		"after $end, the session's next transaction keeps its claim pending");
	$node->safe_psql('postgres', "COMMIT PREPARED 'np_loaded'")
	  if $end =~ /PREPARE/;
	is( $node->safe_psql(
			'postgres',
			"SELECT count(*) FROM idem_records WHERE key LIKE 'np-end-%'"),
		'2', '... and both records are committed');
	$node->safe_psql('postgres',
		"DELETE FROM idem_records WHERE key LIKE 'np-end-%'");
}

$node->stop;
done_testing();
