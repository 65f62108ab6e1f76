# REINDEX INDEX CONCURRENTLY idem_records_scope_key (what the 55000 error
# of an invalid scope index advises) while claims run.  catalog.c looks the
# index up by name, then reads its pg_index row; a claim whose name lookup
# came before the swap of the indexes and whose pg_index read came after
# it reads the old index: "is not valid" (55000) between the swap and the
# drop, "cache lookup failed for index" (XX000) after the drop.  A run of
# test/invariants/check_invariants.py beside a loop of DDL statements saw
# the 55000.  Here gdb holds the REINDEX before the swap and the claim of
# a new session right after its name lookup (catalog.c, look_up), then
# lets the REINDEX finish before the claim goes on: today the claim fails
# with XX000.  A claim must look the index up again,
# not fail, when the catalog changed under the lookup.
use strict;
use warnings;
use File::Temp qw(tempdir);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

plan skip_all => 'gdb is not installed' if system('gdb --version >/dev/null 2>&1') != 0;

my $node = PostgreSQL::Test::Cluster->new('reindex_concurrently');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
SELECT outcome FROM idem_claim('op', 'before', '{"n":1}');
});
my $dir = tempdir(CLEANUP => 1);

# A session that ran one statement, and its backend's pid.
sub session
{
	my ($name, @statements) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'psql', '-X', '-At', '-v', 'ON_ERROR_STOP=0',
			'-d', $node->connstr('postgres') . " application_name=$name",
			map { ('-c', $_) } @statements
		],
		'>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

# gdb holding backend $pid at $where until release($gdb)
sub hold
{
	my ($pid, $where, $tag) = @_;
	my $file = "$dir/$tag.out";
	my $h = IPC::Run::start(
		[
			'gdb', '-p', $pid, '-batch', '-q',
			'-ex', 'handle SIGUSR1 nostop noprint pass',
			'-ex', 'handle SIGALRM nostop noprint pass',
			'-ex', 'handle SIGINT nostop noprint pass',
			'-ex', "break $where",
			'-ex', 'continue',
			'-ex', 'echo HELD\n',
			'-ex', "shell while [ ! -f $dir/$tag.go ]; do sleep 0.05; done",
			'-ex', 'detach'
		],
		'>', $file, '2>&1');
	my $gdb = { h => $h, file => $file, go => "$dir/$tag.go" };
	ok(gdb_says($gdb, qr/Breakpoint 1 at/), "gdb holds a breakpoint at $where");
	return $gdb;
}

sub gdb_says
{
	my ($gdb, $re) = @_;
	for (1 .. 1200)
	{
		return 1 if -f $gdb->{file} && slurp_file($gdb->{file}) =~ $re;
		sleep(0.1);
	}
	diag(slurp_file($gdb->{file})) if -f $gdb->{file};
	return 0;
}

sub release
{
	my ($gdb) = @_;
	open(my $fh, '>', $gdb->{go}) or die;
	close($fh);
	$gdb->{h}->finish;
}

sub pid_of
{
	my ($name) = @_;
	my $pid;
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = '$name'")
	  or die "no session $name";
	return $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE application_name = '$name'");
}

my $reindexer = session('reindexer', 'SELECT pg_sleep(3600)',
	'REINDEX INDEX CONCURRENTLY idem_records_scope_key');
my $reindex_pid = pid_of('reindexer');
my $hold_reindex = hold($reindex_pid, 'index_concurrently_swap', 'reindex');
$node->safe_psql('postgres', "SELECT pg_cancel_backend($reindex_pid)");
ok(gdb_says($hold_reindex, qr/HELD/), 'the REINDEX is held before it swaps the indexes');

# a new session (its catalog not looked up yet) sleeps until cancelled; its
# next statement is the claim held
my $claimer = session('claimer', 'SELECT pg_sleep(3600)',
	q{SELECT outcome FROM idem_claim('op', 'during', '{"n":1}')});
my $claimer_pid = pid_of('claimer');
my $hold_claim = hold($claimer_pid, 'catalog.c:181', 'claim');
$node->safe_psql('postgres', "SELECT pg_cancel_backend($claimer_pid)");
ok(gdb_says($hold_claim, qr/HELD/), 'the claim is held right after its name lookup');

release($hold_reindex);
$reindexer->{h}->finish;
like(${ $reindexer->{out} } . ${ $reindexer->{err} }, qr/REINDEX/, 'the REINDEX finished');
release($hold_claim);
$claimer->{h}->finish;
note('claimer: ' . ${ $claimer->{out} } . ${ $claimer->{err} });
unlike(${ $claimer->{err} }, qr/cache lookup failed|is not valid/,
	'a claim whose lookup of the scope index straddled REINDEX CONCURRENTLY does not fail');
like(${ $claimer->{out} }, qr/^proceed$/m, 'the claim proceeds');

$node->stop;
done_testing();
