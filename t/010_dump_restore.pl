# Records are application data: pg_dump of an application database keeps
# every record, in every state, and after pg_restore into a new database a
# retry replays the very same response, a running attempt's token still
# works, and new claims get new record ids.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->safe_psql('postgres', 'CREATE ROLE app');
$node->safe_psql('appdb', q{
	CREATE EXTENSION idempotency;
	GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_heartbeat,
	                          idem_checkpoint, idem_replay, idem_resolve TO app;
});

# One record in each state, claimed by the application's role.
my $token = $node->safe_psql('appdb', q{
	SET ROLE app;
	SELECT idem_complete(token, 201, '{"id": "PAY-1", "amount": 100}',
	                     '{"Location": "/payments/PAY-1"}', 'PAY-1')
	  FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}');
	SELECT idem_fail(token, 422, '{"error": "amount must be positive"}')
	  FROM idem_claim('payments.create', 'key-failed', '{"amount": -1}');
	SELECT idem_fail(token, 503, retryable => true)
	  FROM idem_claim('payments.create', 'key-retry', '{"amount": 3}');
	SELECT outcome FROM idem_claim('payments.create', 'key-unknown', lease => '1 microsecond');
	SELECT pg_sleep(0.01);
	SELECT outcome FROM idem_claim('payments.create', 'key-unknown');
	SELECT token FROM idem_claim('payments.create', 'key-running', '{"amount": 5}', lease => '1h');
});
($token) = $token =~ /^(\d+\.\d+\.[0-9a-f]{32})$/m;
ok(defined $token, 'a running attempt has a token');

my $records_query =
  'SELECT role, tenant, caller, operation, key, encode(fingerprint, \'hex\'), state, attempt,
          encode(attempt_token, \'hex\'), recovery_point, locked_until, on_lease_expiry, ttl,
          response_status, response_headers, response_body, resource_id, created_at,
          claimed_at, updated_at, completed_at, expires_at, id
     FROM idem_records ORDER BY id';
my $before = $node->safe_psql('appdb', $records_query);
is(scalar(split /\n/, $before), 5, 'five records before the dump');

# The archive (idempotency.cleanup_action = 'archive') is application data
# too: a copy of the finished record, as cleanup makes it.
$node->safe_psql('appdb', q{
	INSERT INTO idem_records_archive
	SELECT a.* FROM idem_records r,
	       jsonb_populate_record(NULL::idem_records_archive,
	                             to_jsonb(r) || jsonb_build_object('archived_at', now())) a
	 WHERE r.key = 'key-ok'});
my $archive_query =
  'SELECT a::text FROM idem_records_archive a ORDER BY id, claimed_at';
my $archive_before = $node->safe_psql('appdb', $archive_query);
like($archive_before, qr/PAY-1/, 'the archive holds a copy with its response');

# Custom format through pg_restore, and plain SQL through psql.
my $dump = $node->basedir . '/appdb.dump';
my $sql = $node->basedir . '/appdb.sql';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('appdb') ],
	'pg_dump -Fc');
$node->command_ok([ 'pg_dump', '-f', $sql, '-d', $node->connstr('appdb') ],
	'pg_dump plain');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->safe_psql('postgres', 'CREATE DATABASE restored_sql');
$node->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a new database');
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('restored_sql'), '-f', $sql ],
	'psql restores the plain dump');

foreach my $db ('restored', 'restored_sql')
{
	is($node->safe_psql($db, $records_query), $before,
		"$db: every record is back, column for column");
	is($node->safe_psql($db, $archive_query), $archive_before,
		"$db: the archive is back, column for column");
	my ($archive_ret, $archive_out, $archive_err) =
	  $node->psql($db, 'SET ROLE app; SELECT count(*) FROM idem_records_archive');
	like($archive_err, qr/permission denied for table idem_records_archive/,
		"$db: the application's role cannot read the archive");

	is($node->safe_psql($db, q{
		SET ROLE app;
		SELECT outcome, http_status, headers, body, resource_id
		  FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')}),
		'replay|201|{"Location": "/payments/PAY-1"}|{"id": "PAY-1", "amount": 100}|PAY-1',
		"$db: a retry replays the same response");
	is($node->safe_psql($db, q{
		SET ROLE app;
		SELECT outcome, http_status, body
		  FROM idem_replay('payments.create', 'key-failed')}),
		'replay|422|{"error": "amount must be positive"}',
		"$db: a stable failure replays");
	is($node->safe_psql($db, q{
		SET ROLE app;
		SELECT outcome, attempt FROM idem_claim('payments.create', 'key-retry', '{"amount": 3}')}),
		'proceed|2', "$db: a retryable record gets attempt 2");
	is($node->safe_psql($db, q{
		SET ROLE app;
		SELECT outcome FROM idem_claim('payments.create', 'key-unknown')}),
		'unknown', "$db: an unknown record stays unknown");
	is($node->safe_psql($db, q{
		SET ROLE app;
		SELECT outcome, error_code FROM idem_claim('payments.create', 'key-running', '{"amount": 5}')}),
		'in_progress|IDEMPOTENCY_REQUEST_IN_PROGRESS', "$db: a running attempt is still running");
	$node->safe_psql($db, "SET ROLE app; SELECT idem_complete('$token', 201, '{\"id\": \"PAY-5\"}')");
	is($node->safe_psql($db, q{
		SET ROLE app;
		SELECT outcome, body FROM idem_claim('payments.create', 'key-running', '{"amount": 5}')}),
		'replay|{"id": "PAY-5"}', "$db: its token still completes it");
	is($node->safe_psql($db, q{
		SET ROLE app;
		SELECT (c).record_id > 5 FROM idem_claim('payments.create', 'key-new') c}),
		't', "$db: new claims get new record ids");
	is($node->safe_psql($db, q{
		SELECT count(*) FROM idem_records}),
		'6', "$db: nothing was lost or duplicated (5 restored, 1 new)");

	# A role that did not make the records does not see them after the restore either.
	$node->safe_psql($db, 'GRANT EXECUTE ON FUNCTION idem_claim TO PUBLIC');
	is($node->safe_psql($db, q{
		SET ROLE pg_monitor;
		SELECT outcome FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')}),
		'proceed', "$db: records stay with their role");
}

# The guard still rejects raw inserts of finished records (with an answer:
# one without is what idem_inbox writes) outside a restore.
my ($ret, $stdout, $stderr) = $node->psql('restored', q{
	INSERT INTO idem_records (role, tenant, caller, operation, key, fingerprint, state, attempt,
	                          on_lease_expiry, ttl, response_status, created_at, claimed_at,
	                          updated_at, expires_at)
	VALUES ('app', '', 'app', 'op', 'raw', sha256(''), 'succeeded', 1, 'unknown', '1 day',
	        201, now(), now(), now(), now() + '1 day')});
like($stderr, qr/invalid new idempotency record/, 'a raw INSERT of a finished record is still refused');

# Into another cluster, whose roles have other OIDs: pg_dump writes a
# record's role by its name and the restore finds the role of that name,
# so every record is back with its role, and the application's role
# replays its answers.  A role of that cluster that made no record sees
# none of them, whatever its OID.
my $other = PostgreSQL::Test::Cluster->new('other');
$other->init;
$other->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$other->start;
$other->safe_psql('postgres', q{
	CREATE ROLE filler_1; CREATE ROLE filler_2; CREATE ROLE filler_3;
	CREATE ROLE app;
	CREATE DATABASE appdb});
my $app_oid = $node->safe_psql('appdb', "SELECT 'app'::regrole::oid");
my $other_app_oid = $other->safe_psql('postgres', "SELECT 'app'::regrole::oid");
isnt($other_app_oid, $app_oid, 'the other cluster gives app another OID');
$other->command_ok(
	[ 'pg_restore', '--exit-on-error', '-d', $other->connstr('appdb'), $dump ],
	'pg_restore into another cluster');
is($other->safe_psql('appdb', $records_query), $before,
	'another cluster: every record is back with its role, column for column');
is($other->safe_psql('appdb', "SELECT count(*) FROM idem_records WHERE role::oid = $other_app_oid"),
	'5', 'another cluster: the records belong to its app role, by OID');
is($other->safe_psql('appdb', q{
	SET ROLE app;
	SELECT outcome, http_status, body FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')}),
	'replay|201|{"id": "PAY-1", "amount": 100}', 'another cluster: app replays its answer');
$other->safe_psql('appdb', 'GRANT EXECUTE ON FUNCTION idem_claim TO PUBLIC');
foreach my $role ('filler_1', 'filler_2', 'filler_3')
{
	is($other->safe_psql('appdb', qq{
		SET ROLE $role;
		SELECT outcome FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')}),
		'proceed', "another cluster: $role sees none of app's records");
}
$other->stop;

$node->stop;
done_testing();
