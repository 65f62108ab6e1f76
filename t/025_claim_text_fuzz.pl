# The differential fuzzer of idem_claim_text (test/fuzz/claim_text.py):
# for generated and mutated JSON texts, the fingerprint idem_claim_text
# stores is idem_fingerprint(text::jsonb), and a text that jsonb refuses is
# refused with the same SQLSTATE, message and detail, writing nothing; in a
# UTF8 database and in a LATIN1 one.  Fixed seeds: the same texts each run.
#
# A longer run, with other seeds:
#   IDEM_FUZZ_CASES=20000 IDEM_FUZZ_SEED=7 PROVE_TESTS=t/025_claim_text_fuzz.pl \
#       bash scripts/test.sh tap
use strict;
use warnings;
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $cases = $ENV{IDEM_FUZZ_CASES} // 400;
my $seed = $ENV{IDEM_FUZZ_SEED} // 1;
my $fuzzer = dirname(__FILE__) . '/../test/fuzz/claim_text.py';

my $node = PostgreSQL::Test::Cluster->new('claim_text_fuzz');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'\n");
$node->start;
$node->safe_psql('postgres',
	"CREATE DATABASE latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");

for my $db ('postgres', 'latin1')
{
	$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	my $dsn = sprintf('host=%s port=%d dbname=%s', $node->host, $node->port, $db);
	my ($stdout, $stderr);
	my $ok = IPC::Run::run(
		[ '/usr/bin/python3', '-u', $fuzzer, '--dsn', $dsn, '--seed', $seed,
		  '--cases', $db eq 'latin1' ? int($cases / 2) : $cases ],
		'>', \$stdout, '2>', \$stderr);
	note($stdout);
	note($stderr) if $stderr ne '';
	like($stdout, qr/^\d+ cases: [1-9]\d* accepted, [1-9]\d* refused, 0 different$/m,
		"$db: the same fingerprints and errors as the jsonb's");
	ok($ok, "$db: the fuzzer exits 0");
}

#
# Nesting near the stack's limit: a text that the cast to jsonb accepts in
# a statement, idem_claim_text accepts in the same place of the statement
# (its parse runs no deeper on the stack than the cast's), and one it
# refuses is refused with the cast's error.  A low max_stack_depth makes
# the limit a few hundred levels deep; each statement is a session's own.
#
# The deepest document a statement accepts, found by bisection.
sub deepest
{
	my ($statement) = @_;
	my ($low, $high) = (1, 20000);
	while ($low < $high)
	{
		my $mid = int(($low + $high + 1) / 2);
		my $doc = ('[' x $mid) . (']' x $mid);
		(my $sql = $statement) =~ s/DOC/'$doc'/;
		my ($ret, $stdout, $stderr) = $node->psql('postgres',
			"SET max_stack_depth = '100kB'; $sql");
		if ($ret == 0) { $low = $mid; }
		else { $high = $mid - 1; }
	}
	my $doc = ('[' x ($low + 1)) . (']' x ($low + 1));
	(my $sql = $statement) =~ s/DOC/'$doc'/;
	my ($ret, $stdout, $stderr) = $node->psql('postgres',
		"SET max_stack_depth = '100kB'; $sql");
	like($stderr, qr/ERROR:  stack depth limit exceeded/,
		"one level deeper is refused as too deep: $statement");
	return $low;
}
my $cast = deepest('SELECT DOC::jsonb');
cmp_ok($cast, '>', 100, 'the cast to jsonb accepts some hundred levels');
for my $claim ("SELECT idem_claim_text('depth', md5(random()::text), DOC)",
	"SELECT * FROM idem_claim_text('depth', md5(random()::text), DOC)")
{
	my $deepest = deepest($claim);
	cmp_ok($deepest, '>=', $cast,
		"as deep as the cast: $claim (cast $cast, claim $deepest)");
}

$node->stop;
done_testing();
