# The randomized invariant checker (test/invariants/check_invariants.py)
# against a server whose worker expires leases and cleans up every 100ms:
# claims in and out of transaction blocks, idem_claim_many, idem_inbox,
# completions, failures, heartbeats, checkpoints, resolutions and the
# maintenance passes over three keys, at every isolation level, while the
# application's role is renamed back and forth.  Never a
# 23505, never two committed proceeds for one attempt, identical replays.
#
# A short run here; a long one before a change of the claim paths:
#   IDEM_INVARIANT_SECONDS=600 PROVE_TESTS=t/021_invariants.pl \
#       bash scripts/test.sh tap
use strict;
use warnings;
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $seconds = $ENV{IDEM_INVARIANT_SECONDS} // 20;
my $checker = dirname(__FILE__) . '/../test/invariants/check_invariants.py';

my $node = PostgreSQL::Test::Cluster->new('invariants');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.database = 'postgres'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
idempotency.tombstone_ttl = 0
idempotency.cleanup_delay = 0
max_connections = 40
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $dsn = sprintf('host=%s port=%d dbname=postgres', $node->host, $node->port);
my ($stdout, $stderr);
my $ok = IPC::Run::run(
	[ '/usr/bin/python3', '-u', $checker, '--dsn', $dsn, '--seconds', $seconds,
	  '--clients', 8, '--keys', 3 ],
	'>', \$stdout, '2>', \$stderr);
note($stdout);
note($stderr) if $stderr ne '';

for my $invariant (
	'no call raised unique_violation (23505)',
	'at most one committed proceed per attempt of a command',
	'every replay of a record returns the body that finished it',
	'no other error')
{
	like($stdout, qr/^ok +\Q$invariant\E$/m, $invariant);
}
ok($ok, 'the checker exits 0');
like($stdout, qr/^ +committed proceeds +[1-9]/m, 'claims proceeded at all');
like($stdout, qr/^ +idem_claim pay: replay +[1-9]/m, 'claims replayed at all');
like($stdout, qr/^ +renames of the application's role +[1-9]/m,
	'the application\'s role was renamed while it claimed');

my $worker = $node->safe_psql('postgres',
	'SELECT rows_expired > 0 OR rows_deleted > 0 FROM idem_worker_status()');
note("worker expired or deleted records: $worker");

$node->stop;
done_testing();
