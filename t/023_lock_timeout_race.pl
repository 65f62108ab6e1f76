# A claim that waits (wait > 0) waits for the key lock or for the writing
# transaction with lock_timeout set to what is left of its wait, and takes
# the lock timeout error as "the wait ran out" (key_lock.c, wait_for_lock).
# But the lock timeout can fire just as the lock is granted: between the
# end of ProcSleep's wait loop and its disable_timeouts().  The timeout
# then only sets QueryCancelPending, LockAcquire returns the lock, and the
# next CHECK_FOR_INTERRUPTS, outside the subtransaction that catches the
# lock timeout, raises "canceling statement due to lock timeout" (55P03)
# from the claim, which must answer in_progress instead.  A randomized run
# (test/invariants/check_invariants.py, 16 clients, one key) hit it once in
# three minutes; here gdb holds the waiting backend at disable_timeouts()
# once the lock is granted, until its wait has run out.
use strict;
use warnings;
use File::Temp qw(tempdir);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

plan skip_all => 'gdb is not installed' if system('gdb --version >/dev/null 2>&1') != 0;

my $wait = 20;    # seconds the claim may wait: ample for gdb to attach

my $node = PostgreSQL::Test::Cluster->new('lock_timeout_race');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# the holder's claim is kept pending: it holds the key lock until COMMIT
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN; SELECT outcome FROM idem_claim('op', 'k', '{"n":1}')});

my ($out, $err) = ('', '');
my $started = time();
my $waiter = IPC::Run::start(
	[
		'psql', '-X', '-At', '-d', $node->connstr('postgres') . ' application_name=waiter',
		'-c', "SELECT outcome FROM idem_claim('op', 'k', '{\"n\":1}', wait => '$wait s')"
	],
	'>', \$out, '2>', \$err);
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE application_name = 'waiter' AND wait_event_type = 'Lock'}),
	'the claim waits for the key lock');
my $pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE application_name = 'waiter'");

my $dir = tempdir(CLEANUP => 1);
my $gdb_out = "$dir/gdb.out";
my $go = "$dir/go";
my $gdb = IPC::Run::start(
	[
		'gdb', '-p', $pid, '-batch', '-q',
		'-ex', 'handle SIGALRM nostop noprint pass',
		'-ex', 'handle SIGINT nostop noprint pass',
		'-ex', 'handle SIGUSR1 nostop noprint pass',
		'-ex', 'break disable_timeouts',
		'-ex', 'continue',
		'-ex', 'echo HELD\n',
		'-ex', 'bt 3',
		'-ex', "shell while [ ! -f $go ]; do sleep 0.05; done",
		'-ex', 'detach'
	],
	'>', $gdb_out, '2>&1');
sub gdb_says
{
	my ($re) = @_;
	for (1 .. 600)
	{
		return 1 if -f $gdb_out && slurp_file($gdb_out) =~ $re;
		sleep(0.1);
	}
	return 0;
}
ok(gdb_says(qr/Breakpoint 1 at/), 'gdb holds a breakpoint in the waiting backend');

# the key lock goes to the waiter, which stops right after its wait
$holder->query_safe('COMMIT');
ok(gdb_says(qr/HELD\n(?s:.*)#1 .*ProcSleep/), 'the waiter is held after its lock was granted')
  or diag(slurp_file($gdb_out));
my $granted_in_time = time() - $started < $wait;

# hold it until its wait, and so its lock timeout, has run out
sleep(0.1) while time() - $started < $wait + 1;
open(my $fh, '>', $go) or die "could not create $go: $!";
close($fh);
$gdb->finish;
$waiter->finish;

SKIP:
{
	skip 'the lock was granted after the wait had run out', 1 unless $granted_in_time;
	unlike($err, qr/lock timeout/,
		'a claim whose lock timeout fires as the lock is granted does not raise it');
}
note("claim: $out $err");
$holder->quit;
$node->stop;
done_testing();
