# The background worker keeps tombstones: past expiry (and
# idempotency.cleanup_grace) it purges a finished record's response and
# keeps the rest, which a late claim is answered expired from; past
# idempotency.tombstone_ttl it deletes the record.  A reload of
# tombstone_ttl takes effect at the next cycle, and so does
# cleanup_action = 'archive'.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('tombstones');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.database = 'appdb'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
idempotency.cleanup_batch_size = 7
});
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->safe_psql('appdb', 'CREATE EXTENSION idempotency');

# $n completed commands keyed $prefix1..$prefixN whose records expired $ago.
sub finished
{
	my ($prefix, $n, $ago) = @_;
	$node->safe_psql('appdb', qq{
SELECT idem_complete((idem_claim('op', '$prefix' || i, '{"n": 1}')).token, 201,
                     '{"id": "R-1"}', '{"Location": "/r/1"}', 'R-1')
  FROM generate_series(1, $n) i;
UPDATE idem_records SET expires_at = now() - interval '$ago'
 WHERE key LIKE '$prefix%';
});
}

sub count_where
{
	my ($where) = @_;
	return $node->safe_psql('appdb',
		"SELECT count(*) FROM idem_records WHERE $where");
}

finished('live-', 3, '-1 day');     # expires tomorrow
finished('stone-', 20, '1 hour');   # a tombstone: more than two batches
finished('gone-', 5, '8 days');     # past the seven-day window

ok( $node->poll_query_until(
		'appdb', q{
SELECT count(*) = 0 FROM idem_records
 WHERE key LIKE 'gone-%'
    OR (key LIKE 'stone-%' AND (response_body IS NOT NULL
        OR response_headers IS NOT NULL OR resource_id IS NOT NULL))}),
	'the worker purges expired responses and deletes records past the window');

is(count_where(q{key LIKE 'stone-%' AND state = 'succeeded'
   AND response_status = 201 AND completed_at IS NOT NULL}),
	'20', 'tombstones keep state, status and times');
is(count_where(q{key LIKE 'live-%' AND response_body IS NOT NULL}),
	'3', 'records that have not expired keep their response');

is( $node->safe_psql(
		'appdb',
		q{SELECT outcome || ' ' || http_status || ' ' || error_code
		    FROM idem_claim('op', 'stone-1', '{"n": 1}')}),
	'expired 409 IDEMPOTENCY_KEY_EXPIRED',
	'a late claim of a tombstone is answered expired');

# The window is reloadable: with 0, the worker deletes the tombstones.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.tombstone_ttl = 0; SELECT pg_reload_conf()");
ok($node->poll_query_until('appdb', q{SELECT count(*) = 3 FROM idem_records}),
	'after a reload of tombstone_ttl = 0 the worker deletes the tombstones');

# With cleanup_action = 'archive' the worker copies every record it deletes
# to idem_records_archive first, with its response.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET idempotency.cleanup_action = 'archive'; SELECT pg_reload_conf()");
finished('kept-', 4, '1 hour');
ok( $node->poll_query_until(
		'appdb', q{
SELECT (SELECT count(*) FROM idem_records WHERE key LIKE 'kept-%') = 0
   AND (SELECT count(*) FROM idem_records_archive
         WHERE key LIKE 'kept-%' AND response_body IS NOT NULL) = 4}),
	'with archive, the worker archives the records it deletes');
is($node->safe_psql('appdb', q{SELECT count(*) FROM idem_records_archive WHERE key LIKE 'stone-%'}),
	'0', 'records deleted before archiving was on are not in the archive');

$node->stop;
done_testing();
