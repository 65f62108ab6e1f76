# On a physical standby the records can be read but not written: claims
# that replay and idem_replay work, anything that needs a write (a new key,
# a new attempt, a completion, a heartbeat, a resolution) fails with a clear
# error.  A read-only transaction on the primary behaves the same.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# The worker serves no database here: in "postgres" (the default) its first
# cycle would expire key-expired's lease on the primary, and the standby
# would replay the record as unknown before the test reads it.
$primary->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\n"
	. "idempotency.database = 'no_such_database'");
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	CREATE ROLE app;
	GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_heartbeat,
	                          idem_checkpoint, idem_replay, idem_resolve TO app;
});

my $out = $primary->safe_psql('postgres', q{
	SET ROLE app;
	SELECT idem_complete(token, 201, '{"id": "PAY-1"}', '{"Location": "/payments/PAY-1"}', 'PAY-1')
	  FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}');
	SELECT idem_fail(token, 503, retryable => true)
	  FROM idem_claim('payments.create', 'key-retry', '{"amount": 3}');
	SELECT 'unknown-id=' || record_id
	  FROM idem_claim('payments.create', 'key-unknown', lease => '1 microsecond');
	SELECT pg_sleep(0.01);
	SELECT outcome FROM idem_claim('payments.create', 'key-unknown');
	SELECT 'expired=' || record_id
	  FROM idem_claim('payments.create', 'key-expired', lease => '1 microsecond');
	SELECT 'token=' || token
	  FROM idem_claim('payments.create', 'key-running', '{"amount": 5}', lease => '1h');
});
my ($token) = $out =~ /^token=(\S+)$/m;
my ($unknown_id) = $out =~ /^unknown-id=(\d+)$/m;

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'standby is in recovery');

# Reads work.
is($standby->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome, http_status, headers, body, resource_id
	  FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')}),
	'replay|201|{"Location": "/payments/PAY-1"}|{"id": "PAY-1"}|PAY-1',
	'a claim that replays works on the standby');
is($standby->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome, body FROM idem_replay('payments.create', 'key-ok')}),
	'replay|{"id": "PAY-1"}', 'idem_replay works on the standby');
is($standby->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome FROM idem_claim('payments.create', 'key-ok', '{"amount": 101}')}),
	'mismatch', 'a mismatch is answered on the standby');
is($standby->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome, error_code FROM idem_claim('payments.create', 'key-running', '{"amount": 5}')}),
	'in_progress|IDEMPOTENCY_REQUEST_IN_PROGRESS', 'in_progress is answered on the standby');
is($standby->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome FROM idem_claim('payments.create', 'key-unknown')}),
	'unknown', 'unknown is answered on the standby');
is($standby->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome, state FROM idem_claim('payments.create', 'key-expired')}),
	'unknown|unknown',
	'an ended lease is answered unknown on the standby, as on the primary');
is($standby->safe_psql('postgres', q{
	SELECT state FROM idem_records WHERE key = 'key-expired'}),
	'processing', '... without marking the record (the primary does that)');

# Writes fail with a clear error.
my %writes = (
	'a new key' => q{SELECT idem_claim('payments.create', 'key-new')},
	'a new attempt' => q{SELECT idem_claim('payments.create', 'key-retry', '{"amount": 3}')},
	'a completion' => "SELECT idem_complete('$token', 200)",
	'a failure' => "SELECT idem_fail('$token', 500)",
	'a heartbeat' => "SELECT idem_heartbeat('$token')",
	'a checkpoint' => "SELECT idem_checkpoint('$token', 'x')",
	'a resolution' => "SELECT idem_resolve($unknown_id, 'succeeded', 200)",
);
foreach my $what (sort keys %writes)
{
	my ($ret, $stdout, $stderr) =
	  $standby->psql('postgres', "SET ROLE app; $writes{$what}");
	like($stderr, qr/ERROR:  cannot [a-z ]+ on a standby server\n.*\nHINT:  Send claims and their completions to the primary/s,
		"$what is refused on the standby with a clear error");
}

# The primary, in a read-only transaction: the same answers and errors.
is($primary->safe_psql('postgres', q{
	SET ROLE app;
	SET default_transaction_read_only = on;
	SELECT outcome FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')}),
	'replay', 'a replay works in a read-only transaction');
my ($ret, $stdout, $stderr) = $primary->psql('postgres', q{
	SET ROLE app;
	SET default_transaction_read_only = on;
	SELECT idem_claim('payments.create', 'key-new')});
like($stderr, qr/ERROR:  cannot claim an idempotency key in a read-only transaction/,
	'a claim in a read-only transaction is refused clearly');

# The standby followed along and nothing was written there.
$primary->safe_psql('postgres', "SET ROLE app; SELECT idem_complete('$token', 201, '{\"id\": \"PAY-5\"}')");
$primary->wait_for_catchup($standby, 'replay');
is($standby->safe_psql('postgres', q{
	SET ROLE app;
	SELECT outcome, body FROM idem_claim('payments.create', 'key-running', '{"amount": 5}')}),
	'replay|{"id": "PAY-5"}', 'the standby replays what the primary completed');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM idem_records'),
	$primary->safe_psql('postgres', 'SELECT count(*) FROM idem_records'),
	'standby and primary hold the same records');

$standby->stop;
$primary->stop;
done_testing();
