# REINDEX INDEX CONCURRENTLY idem_records_scope_key (what the 55000 error
# of an invalid scope index advises) while a claim looks the index up.
# catalog.c finds the index by name, then reads its pg_index row; a lookup
# whose name came before the swap of the indexes and whose pg_index read
# came after it read the old index: "is not valid" (55000) between the swap
# and the drop, "cache lookup failed for index" (XX000) after the drop.
# A run of test/invariants/check_invariants.py beside a loop of DDL
# statements saw the 55000.
#
# Here the REINDEX is held before the swap by a transaction whose snapshot
# it waits for, and the claim of a new session at the pause point
# scope_index_lookup (right after the name lookup, src/test_pause.h) by
# advisory lock 478478.  The REINDEX then swaps the indexes and goes on
# until it waits for the claim (or, if the claim held no lock on the table,
# to its end, dropping the old index) before the claim goes on: the claim
# must look the index up again and proceed, not fail.  Then a session
# whose lookups are kept from before a whole REINDEX claims: it must take
# the invalidations before it uses them, not open the dropped index.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('reindex_concurrently');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
SELECT outcome FROM idem_claim('op', 'before', '{"n":1}');
});

plan skip_all => 'the extension is built without its pause points (make IDEM_TEST_PAUSE=1)'
  unless $node->safe_psql('postgres',
	"SELECT current_setting('idempotency.test_pause', true) IS NOT NULL") eq 't';

my $index_before = $node->safe_psql('postgres',
	"SELECT 'idem_records_scope_key'::regclass::oid");

# A session running its statements in the background.
sub session
{
	my ($name, @statements) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'psql', '-X', '-At', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr('postgres') . " application_name=$name",
			map { ('-c', $_) } @statements
		],
		'>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

# The phase of the REINDEX, from pg_stat_progress_create_index; 'done' once
# it has finished.
my $phase_of_reindex = q{
SELECT coalesce((SELECT p.phase FROM pg_stat_progress_create_index p
                   JOIN pg_stat_activity a USING (pid)
                  WHERE a.application_name = 'reindexer'), 'done')};

# the pause point's lock, held until the claim may go on
my $pauser = $node->background_psql('postgres');
$pauser->query_safe('SELECT pg_advisory_lock(478478)');

# an older snapshot, which the REINDEX waits for before the swap
my $snapshot = $node->background_psql('postgres');
$snapshot->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');

my $reindexer = session('reindexer', 'REINDEX INDEX CONCURRENTLY idem_records_scope_key');
ok( $node->poll_query_until(
		'postgres', "$phase_of_reindex = 'waiting for old snapshots'"),
	'the REINDEX waits for an older snapshot before it swaps the indexes');

# a new session (its catalog not looked up yet) claims, and pauses right
# after its lookup of the index's name
my $claimer = session('claimer', "SET idempotency.test_pause = 'scope_index_lookup'",
	q{SELECT outcome FROM idem_claim('op', 'during', '{"n":1}')});
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
 WHERE a.application_name = 'claimer' AND l.locktype = 'advisory'
   AND l.objid = 478478 AND NOT l.granted}),
	'the claim pauses after its lookup of the index name');

# the REINDEX swaps the indexes, then waits for the claim before it marks
# the old index dead (or, without that wait, drops it)
$snapshot->query_safe('COMMIT');
ok( $node->poll_query_until(
		'postgres',
		"$phase_of_reindex IN ('waiting for readers before marking dead', 'done')"),
	'the REINDEX has swapped the indexes');
is($node->safe_psql('postgres', $phase_of_reindex),
	'waiting for readers before marking dead',
	'the REINDEX waits for the claim before it marks the old index dead');
isnt($node->safe_psql('postgres', "SELECT 'idem_records_scope_key'::regclass::oid"),
	$index_before, 'the name denotes the new index');

$pauser->query_safe('SELECT pg_advisory_unlock(478478)');
$claimer->{h}->finish;
note('claimer: ' . ${ $claimer->{out} } . ${ $claimer->{err} });
unlike(${ $claimer->{err} }, qr/cache lookup failed|is not valid|ERROR/,
	'a claim whose lookup of the scope index straddled REINDEX CONCURRENTLY does not fail');
like(${ $claimer->{out} }, qr/^proceed$/m, 'the claim proceeds');

$reindexer->{h}->finish;
is(${ $reindexer->{err} }, '', 'the REINDEX finished without an error');
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'idem_records'::regclass
   AND c.relname LIKE 'idem_records_scope_key%'
   AND i.indisvalid AND i.indisready AND i.indislive}),
	'1', 'one valid scope index is left');

# the claim's record is found through the new index
is( $node->safe_psql('postgres',
		q{SELECT outcome FROM idem_claim('op', 'during', '{"n":1}')}),
	'in_progress', 'a second claim of the key finds the first one');

# A session whose lookups are kept from an earlier transaction, in a
# transaction begun before a whole REINDEX INDEX CONCURRENTLY (it holds no
# lock on the table then, so the REINDEX does not wait for it): its claim
# must not use the index the lookups name, which is gone.
my $kept = $node->background_psql('postgres');
$kept->query_safe(q{SELECT outcome FROM idem_claim('op', 'kept', '{"n":1}')});
$kept->query_safe('BEGIN; SELECT 1');
my $index_kept = $node->safe_psql('postgres', "SELECT 'idem_records_scope_key'::regclass::oid");
$node->safe_psql('postgres', 'REINDEX INDEX CONCURRENTLY idem_records_scope_key');
isnt($node->safe_psql('postgres', "SELECT 'idem_records_scope_key'::regclass::oid"),
	$index_kept, 'the REINDEX replaced the index');
my ($kept_out, $kept_ret) = $kept->query(
	q{SELECT outcome FROM idem_claim('op', 'kept again', '{"n":1}')});
is($kept_ret, 0, 'a claim with lookups from before the REINDEX does not fail');
is($kept_out, 'proceed', 'it proceeds');
$kept->query_safe('COMMIT');

$pauser->quit;
$snapshot->quit;
$kept->quit;
$node->stop;
done_testing();
