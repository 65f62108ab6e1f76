# idem_stat_operations under load and across restarts: 8 pgbench clients
# claiming new keys and a small set of contended keys lose no increment
# (every total is exact); the background worker's deletions are counted
# under the records' role and operation; the counters survive a clean
# restart and start from zero after a crash; a full table evicts the least
# recently used entries and counts the evictions.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('stat_operations');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.database = 'appdb'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
idempotency.tombstone_ttl = 0
idempotency.stat_max = 100
restart_after_crash = on
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->safe_psql('appdb', 'CREATE EXTENSION idempotency');
$node->safe_psql('appdb', 'CREATE SEQUENCE new_keys');

my $clients = 8;
my $transactions = 150;
my $total = $clients * $transactions;

# Each transaction claims a new key and completes it, then claims one of
# ten contended keys and completes it when it proceeds.
$node->pgbench(
	"--no-vacuum --client=$clients --transactions=$transactions appdb",
	0,
	[qr{processed: $total/$total}],
	[qr{^$}],
	'8 clients claim new and contended keys',
	{
		'001_stat_claims' => q{
\set k random(1, 10)
BEGIN;
SELECT idem_complete(d.token, 201)
  FROM idem_claim('stat.new', 'new-' || nextval('new_keys')) AS d;
SELECT idem_complete(d.token, 200)
  FROM idem_claim('stat.hot', 'hot-' || :k, '{"k": 1}') AS d
 WHERE d.outcome = 'proceed';
COMMIT;
}
	});

my $counts = q{
SELECT operation, proceed, replay, in_progress, mismatch, unknown, expired,
       completions, failures
  FROM idem_stat_operations WHERE database = 'appdb' AND operation LIKE 'stat.%'
 ORDER BY operation};
is( $node->safe_psql('appdb',
		"SELECT operation, proceed, completions, replay + in_progress + mismatch + unknown + expired"
		  . " FROM idem_stat_operations WHERE operation = 'stat.new'"),
	"stat.new|$total|$total|0",
	'every new key counted once as proceed and once as completed');
is( $node->safe_psql('appdb',
		"SELECT proceed + replay + in_progress + mismatch + unknown + expired"
		  . " FROM idem_stat_operations WHERE operation = 'stat.hot'"),
	$total,
	'every contended claim counted once, under one outcome');
is( $node->safe_psql('appdb',
		"SELECT s.proceed = s.completions AND s.proceed = r.n AND s.mismatch = 0"
		  . " FROM idem_stat_operations s,"
		  . " (SELECT count(*) AS n FROM idem_records WHERE operation = 'stat.hot') r"
		  . " WHERE s.operation = 'stat.hot'"),
	't',
	'contended keys: one proceed and one completion per record');

# The worker deletes expired records and counts them.
$node->safe_psql('appdb',
	"UPDATE idem_records SET expires_at = now() - interval '1 hour' WHERE operation = 'stat.new'"
);
ok( $node->poll_query_until(
		'appdb',
		"SELECT records_deleted FROM idem_stat_operations WHERE operation = 'stat.new'",
		$total),
	'the worker\'s deletions are counted under the records\' operation');

# A clean restart keeps every counter.
my $before = $node->safe_psql('appdb', $counts);
$node->restart;
is($node->safe_psql('appdb', $counts), $before, 'counters survive a clean restart');
ok(!-e $node->data_dir . '/pg_stat/idem_stat_operations.stat',
	'the saved file is removed once read');

# After a crash they start from zero, as pg_stat_statements' do.
my $psql = $node->background_psql('appdb');
my $pid = $psql->query_safe('SELECT pg_backend_pid()');
my $offset = -s $node->logfile;
kill 'KILL', $pid;
$node->wait_for_log(qr/all server processes terminated; reinitializing/,
	$offset);
eval { $psql->quit; };
$node->poll_query_until('appdb', 'SELECT 1', '1');
is($node->safe_psql('appdb', "SELECT count(*) FROM idem_stat_operations WHERE operation LIKE 'stat.%'"),
	'0', 'counters start from zero after a crash');

# A full table evicts the least recently used entries: 150 operations, one
# statement each, into a table of 100.
$node->safe_psql('appdb', 'SELECT idem_stat_reset()');
$node->safe_psql('appdb',
	join('', map { "SELECT outcome FROM idem_claim('evict-$_', 'k');\n" } 1 .. 150));
is( $node->safe_psql('appdb',
		"SELECT count(*) <= 100, bool_or(operation = 'evict-150'), NOT bool_or(operation = 'evict-1')"
		  . " FROM idem_stat_operations"),
	't|t|t',
	'the least recently used entries are evicted');
ok($node->safe_psql('appdb', 'SELECT evictions FROM idem_stat_operations_info') >= 50,
	'evictions are counted');

$node->stop;
done_testing();
