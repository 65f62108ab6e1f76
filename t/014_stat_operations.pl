# idem_stat_operations under load and across restarts: 8 pgbench clients
# claiming new keys and a small set of contended keys lose no increment
# (every total is exact); the background worker's deletions are counted
# under the records' role and operation; the counters survive a clean
# restart and start from zero after a crash; a full table evicts the least
# recently used entries and counts the evictions; operation names counted
# in LATIN1 and SQL_ASCII databases read as valid text in a UTF8 database
# (and the other way round, and in EUC_JP), through upper(), convert_to(),
# a LATIN1 client and the exporter's query, also after a clean restart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use FindBin;

my $node = preloaded_node(
	'stat_operations',
	database => 'appdb',
	conf => q{
idempotency.database = 'appdb'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
idempotency.tombstone_ttl = 0
idempotency.stat_max = 100
restart_after_crash = on
});
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

# Operation names counted in databases of other encodings.  Each name is
# shown converted to the encoding of the database that reads it; bytes that
# are not valid there, characters it lacks, and the bytes outside ASCII of
# an encoding it has no conversion from, as \xNN.  The names are
# written with E'' escapes so that the test's own bytes are ASCII.
$node->safe_psql('appdb', 'SELECT idem_stat_reset()');
for my $db (
	['enc_utf8', 'UTF8'],
	['enc_latin1', 'LATIN1'],
	['enc_ascii', 'SQL_ASCII'],
	['enc_eucjp', 'EUC_JP'])
{
	$node->safe_psql('postgres',
		"CREATE DATABASE $db->[0] ENCODING '$db->[1]' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
	);
	$node->safe_psql($db->[0], 'CREATE EXTENSION idempotency');
}
# LATIN1: e with acute accent (0xe9).
$node->safe_psql('enc_latin1', "SELECT idem_claim(E'enc.caf\\xe9', 'k')");
# SQL_ASCII: the same name in UTF-8 bytes, in LATIN1 bytes (not UTF-8), and
# a long name cut by the counters inside its two-byte last character.
$node->safe_psql('enc_ascii',
	"SELECT idem_claim(E'enc.utf8.caf\\xc3\\xa9', 'k');"
	  . " SELECT idem_claim(E'enc.latin1.caf\\xe9', 'k');"
	  . " SET idempotency.max_key_length = 400;"
	  . " SELECT idem_claim('enc.long.' || repeat('x', 245) || E'\\xc3\\xa9', 'k')");
# UTF8: a euro sign, which LATIN1 lacks.
$node->safe_psql('enc_utf8', "SELECT idem_claim(U&'enc.\\20ac', 'k')");

# Run a query, returning its output, or "ERROR" and what psql said.
sub query
{
	my ($db, $sql) = @_;
	my ($out, $err);
	my $rc = $node->psql($db, $sql, stdout => \$out, stderr => \$err);
	return $rc == 0 ? $out : "ERROR $err";
}

my $names = q{
SELECT database, operation, upper(operation) = upper(%s),
       convert_to(operation, 'UTF8'), length(operation)
  FROM idem_stat_operations WHERE database LIKE 'enc_%%'
 ORDER BY database, operation};
my $in_utf8 = join("\n",
	"enc_ascii|enc.latin1.caf\\xe9|t|\\x656e632e6c6174696e312e6361665c786539|18",
	"enc_ascii|enc.long." . ('x' x 245) . "\\xc3|t|\\x656e632e6c6f6e672e"
	  . ('78' x 245) . "5c786333|258",
	"enc_ascii|enc.utf8.caf\xc3\xa9|t|\\x656e632e757466382e636166c3a9|13",
	"enc_latin1|enc.caf\xc3\xa9|t|\\x656e632e636166c3a9|8",
	"enc_utf8|enc.\xe2\x82\xac|t|\\x656e632ee282ac|5");
my $check = "CASE database WHEN 'enc_utf8' THEN U&'enc.\\20ac'"
  . " WHEN 'enc_latin1' THEN U&'enc.caf\\00e9'"
  . " ELSE operation END";
is(query('enc_utf8', sprintf($names, $check)), $in_utf8,
	'a UTF8 database reads the names of LATIN1 and SQL_ASCII databases as UTF-8');

# In a LATIN1 database, the euro sign is shown as its UTF-8 bytes, the
# SQL_ASCII bytes as LATIN1 characters.
my $in_latin1 = join("\n",
	"enc_ascii|enc.latin1.caf\xc3\xa9|t|\\x656e632e6c6174696e312e636166c3a9|15",
	"enc_ascii|enc.long." . ('x' x 245) . "\xc3\x83|t|\\x656e632e6c6f6e672e"
	  . ('78' x 245) . "c383|255",
	"enc_ascii|enc.utf8.caf\xc3\x83\xc2\xa9|t|\\x656e632e757466382e636166c383c2a9|14",
	"enc_latin1|enc.caf\xc3\xa9|t|\\x656e632e636166c3a9|8",
	"enc_utf8|enc.\\xe2\\x82\\xac|t|\\x656e632e5c7865325c7838325c786163|16");
is( query(
		'enc_latin1',
		"SET client_encoding = 'UTF8';"
		  . sprintf($names,
			"CASE WHEN database = 'enc_latin1' THEN E'enc.caf\\xe9' ELSE operation END")),
	$in_latin1,
	'a LATIN1 database reads the names of UTF8 and SQL_ASCII databases as LATIN1');

# EUC_JP has no conversion from LATIN1: the bytes outside ASCII are escaped.
is( query(
		'enc_eucjp',
		"SELECT operation, convert_to(operation, 'UTF8') FROM idem_stat_operations"
		  . " WHERE database = 'enc_latin1'"),
	"enc.caf\\xe9|\\x656e632e6361665c786539",
	'a database without a conversion from the name\'s encoding escapes its bytes');

# A LATIN1 client of the UTF8 database.
is( query(
		'enc_utf8',
		"SET client_encoding = 'LATIN1'; SELECT operation FROM idem_stat_operations"
		  . " WHERE database IN ('enc_latin1', 'enc_ascii') AND operation LIKE '%caf%'"
		  . " ORDER BY operation"),
	"enc.caf\xe9\nenc.latin1.caf\\xe9\nenc.utf8.caf\xe9",
	'a LATIN1 client reads the names through the UTF8 database');

# The exporter's query (monitoring/queries.yaml), from the UTF8 database
# with a LATIN1 client (which cannot be sent the euro sign) and from the
# SQL_ASCII database.
my $yaml = slurp_file("$FindBin::RealBin/../monitoring/queries.yaml");
my ($exporter) = $yaml =~ /^idem_stat_operations:\n  query: \|\n(.*?)^  master:/ms;
ok(defined $exporter, 'the exporter\'s query is found');
my $exported = "SELECT database, operation, proceed FROM ($exporter) AS e"
  . " WHERE database LIKE 'enc_%%' AND operation NOT LIKE 'enc.long.%%' %s ORDER BY 1, 2";
is( query('enc_utf8',
		"SET client_encoding = 'LATIN1';"
		  . sprintf($exported, "AND database <> 'enc_utf8'")),
	"enc_ascii|enc.latin1.caf\\xe9|1\nenc_ascii|enc.utf8.caf\xe9|1\n"
	  . "enc_latin1|enc.caf\xe9|1",
	'the exporter\'s query runs in the UTF8 database with a LATIN1 client');
is( query('enc_ascii', sprintf($exported, '')),
	"enc_ascii|enc.latin1.caf\xe9|1\nenc_ascii|enc.utf8.caf\xc3\xa9|1\n"
	  . "enc_latin1|enc.caf\xe9|1\nenc_utf8|enc.\xe2\x82\xac|1",
	'a SQL_ASCII database reads every name as its bytes');

# Each entry keeps its encoding across a clean restart.
$node->restart;
is(query('enc_utf8', sprintf($names, $check)), $in_utf8,
	'the names keep their encodings across a clean restart');

$node->stop;
done_testing();
