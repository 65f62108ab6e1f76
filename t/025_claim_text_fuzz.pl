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

$node->stop;
done_testing();
