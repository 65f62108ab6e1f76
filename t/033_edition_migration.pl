# Moving between editions keeps every record answering: a database leaving a
# managed service (the SQL edition, installed by a role that is no
# superuser) for a server of its own (the extension), and back.  The
# records move as data alone (pg_dump --data-only of the two tables, loaded
# with psql as docs/editions.md says): a retry replays the same response
# (so both editions fingerprint the request alike), a running attempt's
# token completes it on the other side, a new claim gets a new record id.
use strict;
use warnings;
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $installer = dirname(__FILE__) . '/../sql_edition/idempotency_sql.sql';

my $node = PostgreSQL::Test::Cluster->new('editions');
$node->init;
# the extension's library preloaded, as a server of its own has it (an
# encryption key is used only then); the SQL edition's databases see its
# settings at their defaults
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;

$node->safe_psql('postgres', q{
	CREATE ROLE app;
	CREATE ROLE owner_role LOGIN;
	CREATE DATABASE managed;
	CREATE DATABASE selfhosted;
	CREATE DATABASE managed_again;
	GRANT CREATE ON DATABASE managed TO owner_role;
	GRANT CREATE ON DATABASE managed_again TO owner_role;
});

# The SQL edition as a managed service's user installs it: no superuser,
# CREATE on the database, a schema of its own.
sub install_sql_edition
{
	my ($db) = @_;
	$node->command_ok(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-v', 'schema=idempotency',
		  '-d', $node->connstr($db) . ' user=owner_role', '-f', $installer ],
		"$db: the SQL edition installs as a role that is no superuser");
	$node->safe_psql($db, q{
		SET ROLE owner_role;
		GRANT USAGE ON SCHEMA idempotency TO app;
		GRANT EXECUTE ON FUNCTION idempotency.idem_claim, idempotency.idem_complete,
		      idempotency.idem_fail, idempotency.idem_replay TO app;
	});
}

# The calls of the application, the same text on either edition.
my $as_app = 'SET ROLE app; SET search_path = idempotency; ';
# A request whose canonical form reorders members, rewrites numbers and
# keeps characters outside ASCII: the editions must agree on its bytes.
my $request = q{'{"zeta": 1.50, "amount": 100.00, "ünïcode": "€", "nested": {"b": 1e2, "a": [0.10, -0]}}'};

sub make_records
{
	my ($db, $prefix) = @_;
	my $out = $node->safe_psql($db, $as_app . qq{
		SELECT idem_complete(token, 201, '{"id": "PAY-1", "amount": 100}',
		                     '{"Location": "/payments/PAY-1"}', 'PAY-1')
		  FROM idem_claim('payments.create', '$prefix-ok', $request);
		SELECT idem_fail(token, 422, '{"error": "amount must be positive"}')
		  FROM idem_claim('payments.create', '$prefix-failed', '{"amount": -1}');
		SELECT idem_fail(token, 503, retryable => true)
		  FROM idem_claim('payments.create', '$prefix-retry', '{"amount": 3}');
		SELECT token FROM idem_claim('payments.create', '$prefix-running', '{"amount": 5}',
		                             lease => '1h');
	});
	my ($token) = $out =~ /^(\S+)$/m;
	return $token;
}

my $records_query =
  'SELECT role, tenant, caller, operation, key, encode(fingerprint, \'hex\'), state, attempt,
          encode(attempt_token, \'hex\'), recovery_point, locked_until, on_lease_expiry, ttl,
          response_status, response_headers, response_body, resource_id, created_at,
          claimed_at, updated_at, completed_at, expires_at, former_role, id
     FROM idempotency.idem_records ORDER BY id';
my $archive_query =
  'SELECT a::text FROM idempotency.idem_records_archive a ORDER BY id, claimed_at';

# Dump the records of $from as $user, load them into $to as $loader.  The
# sequence is named: the extension's is a member of it, which --table does
# not bring along with the table (without it, new claims on the SQL
# edition would take ids the moved records hold).
sub move_records
{
	my ($from, $user, $to, $loader) = @_;
	my $file = $node->basedir . "/$from.records.sql";
	$node->command_ok(
		[ 'pg_dump', '--data-only', '--table=idempotency.idem_records',
		  '--table=idempotency.idem_records_archive',
		  '--table=idempotency.idem_records_id_seq', '-f', $file,
		  '-d', $node->connstr($from) . " user=$user" ],
		"$from: pg_dump --data-only of the two tables as $user");
	$node->command_ok(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $file,
		  '-d', $node->connstr($to) . " user=$loader" ],
		"$to: psql loads them as $loader");
}

# What a client sees of the moved records on $db, made on the other side.
sub check_moved
{
	my ($db, $prefix, $token, $records_before, $archive_before, $count) = @_;
	is($node->safe_psql($db, $records_query), $records_before,
		"$db: every record is back, column for column");
	is($node->safe_psql($db, $archive_query), $archive_before,
		"$db: the archive is back, row for row");
	is($node->safe_psql($db, $as_app . qq{
		SELECT outcome, http_status, headers, body, resource_id
		  FROM idem_claim('payments.create', '$prefix-ok', $request)}),
		'replay|201|{"Location": "/payments/PAY-1"}|{"id": "PAY-1", "amount": 100}|PAY-1',
		"$db: a retry of the same request replays the same response");
	is($node->safe_psql($db, $as_app . qq{
		SELECT outcome, http_status FROM idem_claim('payments.create', '$prefix-ok',
		                                            '{"amount": 101}')}),
		'mismatch|422', "$db: another request under the key is still a mismatch");
	is($node->safe_psql($db, $as_app . qq{
		SELECT outcome, http_status, body FROM idem_replay('payments.create', '$prefix-failed')}),
		'replay|422|{"error": "amount must be positive"}', "$db: a stable failure replays");
	is($node->safe_psql($db, $as_app . qq{
		SELECT outcome, error_code FROM idem_claim('payments.create', '$prefix-running',
		                                           '{"amount": 5}')}),
		'in_progress|IDEMPOTENCY_REQUEST_IN_PROGRESS', "$db: a running attempt is still running");
	$node->safe_psql($db, $as_app . "SELECT idem_complete('$token', 201, '{\"id\": \"PAY-5\"}')");
	is($node->safe_psql($db, $as_app . qq{
		SELECT outcome, body FROM idem_claim('payments.create', '$prefix-running', '{"amount": 5}')}),
		'replay|{"id": "PAY-5"}', "$db: the token minted on the other side completes it");
	is($node->safe_psql($db, $as_app . qq{
		SELECT outcome, attempt FROM idem_claim('payments.create', '$prefix-retry', '{"amount": 3}')}),
		'proceed|2', "$db: a retryable record gets attempt 2");
	is($node->safe_psql($db, $as_app . qq{
		SELECT outcome FROM idem_claim('payments.create', 'after-move-$db')}),
		'proceed', "$db: a new key proceeds");
	is($node->safe_psql($db, qq{
		SELECT count(*), count(DISTINCT id), max(id) = (SELECT id FROM idempotency.idem_records
		                                                  WHERE key = 'after-move-$db')
		  FROM idempotency.idem_records}),
		"$count|$count|t", "$db: the new record's id follows the moved ones, nothing lost");
}

# 1. Off a managed service: SQL edition -> extension.
install_sql_edition('managed');
my $token = make_records('managed', 'm');
ok(defined $token, 'the SQL edition minted a token for the running attempt');
$node->safe_psql('managed', q{
	SET ROLE owner_role;
	INSERT INTO idempotency.idem_records_archive
	SELECT a.* FROM idempotency.idem_records r,
	       jsonb_populate_record(NULL::idempotency.idem_records_archive,
	                             to_jsonb(r) || jsonb_build_object('archived_at', now())) a
	 WHERE r.key = 'm-ok'});
my $records_before = $node->safe_psql('managed', $records_query);
my $archive_before = $node->safe_psql('managed', $archive_query);
is(scalar(split /\n/, $records_before), 4, 'four records on the SQL edition');
like($archive_before, qr/PAY-1/, 'and an archived copy');

$node->safe_psql('selfhosted', q{
	CREATE SCHEMA idempotency;
	CREATE EXTENSION idempotency SCHEMA idempotency;
	GRANT USAGE ON SCHEMA idempotency TO app;
	GRANT EXECUTE ON FUNCTION idempotency.idem_claim, idempotency.idem_complete,
	      idempotency.idem_fail, idempotency.idem_replay TO app;
});
move_records('managed', 'owner_role', 'selfhosted', 'postgres');
check_moved('selfhosted', 'm', $token, $records_before, $archive_before, 5);

# 2. Onto a managed service: extension -> SQL edition, loaded by the
# edition's owner, who is no superuser.
my $token2 = make_records('selfhosted', 's');
ok(defined $token2, 'the extension minted a token for the running attempt');
# And a response the extension stored encrypted (idempotency.encryption_key),
# which moves as it is.
$node->safe_psql('selfhosted', q{
	SET idempotency.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
	SET ROLE app; SET search_path = idempotency;
	SELECT idem_complete(token, 201, '{"id": "PAY-S"}', '{"Location": "/payments/PAY-S"}')
	  FROM idem_claim('payments.create', 'sealed', '{"amount": 7}');
});
is($node->safe_psql('selfhosted', q{
	SELECT response_sealed IS NOT NULL AND response_body IS NULL FROM idempotency.idem_records
	 WHERE key = 'sealed'}), 't', 'the extension stored the response sealed');
$records_before = $node->safe_psql('selfhosted', $records_query);
$archive_before = $node->safe_psql('selfhosted', $archive_query);
install_sql_edition('managed_again');
move_records('selfhosted', 'postgres', 'managed_again', 'owner_role');
check_moved('managed_again', 's', $token2, $records_before, $archive_before, 11);

# The SQL edition cannot decrypt the sealed response: its replay is
# refused, never answered without its body; another request still answers
# mismatch.
my ($ret, $stdout, $stderr) = $node->psql('managed_again', $as_app . q{
	\set VERBOSITY verbose
	SELECT outcome, body FROM idem_claim('payments.create', 'sealed', '{"amount": 7}')});
isnt($ret, 0, 'a replay of the sealed response on the SQL edition fails');
like($stderr, qr/55000: cannot decrypt a stored response: its key is not configured/,
	'with 55000, as the extension without the key');
like($stderr, qr/HINT:  Replay it where the C extension holds its key/, 'and a hint');
is($node->safe_psql('managed_again', $as_app . q{
	SELECT outcome, http_status FROM idem_claim('payments.create', 'sealed', '{"amount": 8}')}),
	'mismatch|422', 'another request for the key still answers mismatch');
($ret, $stdout, $stderr) = $node->psql('managed_again', $as_app . q{
	SELECT * FROM idem_replay('payments.create', 'sealed')});
like($stderr, qr/cannot decrypt a stored response/, 'idem_replay of it is refused too');

# The records made on either edition, moved twice, still answer.
is($node->safe_psql('managed_again', $as_app . qq{
	SELECT outcome, body FROM idem_claim('payments.create', 'm-running', '{"amount": 5}')}),
	'replay|{"id": "PAY-5"}', 'a record made on the SQL edition, moved twice, replays');

done_testing();
