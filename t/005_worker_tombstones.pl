# The background worker keeps tombstones: past expiry (and
# idempotency.cleanup_grace) it purges a finished record's response and
# keeps the rest, which a late claim is answered expired from; past
# idempotency.tombstone_ttl it deletes the record.  A reload of
# tombstone_ttl takes effect at the next cycle, and so does
# cleanup_action = 'archive'.  A backlog larger than a cycle drains behind
# records the application keeps, which become tombstones.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = preloaded_node(
	'tombstones',
	database => 'appdb',
	conf => q{
idempotency.database = 'appdb'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
idempotency.cleanup_batch_size = 7
});

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

# A backlog past the window larger than one cycle, behind two records the
# application keeps: one a foreign key refuses to let go, one a trigger
# keeps silently (returning NULL).  The worker drains the rest over several
# cycles, makes the two kept records tombstones instead of leaving them
# their responses, and does not rewrite them in later cycles.  Restarted,
# so that the settings hold from the first cycle on.
$node->safe_psql('postgres', q{
ALTER SYSTEM RESET idempotency.tombstone_ttl;
ALTER SYSTEM RESET idempotency.cleanup_action;
ALTER SYSTEM SET idempotency.cleanup_max_batches = 2;
});
$node->restart;
my $log_offset = -s $node->logfile;
$node->safe_psql('appdb', q{
CREATE TABLE app_orders (record_id bigint REFERENCES idem_records (id));
CREATE FUNCTION keep_silently() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.key = 'silent-1' THEN
    RETURN NULL;
  END IF;
  RETURN OLD;
END $$;
BEGIN;
SELECT idem_complete((idem_claim('op', k, '{"n": 1}')).token, 201,
                     '{"id": "R-1"}', '{"Location": "/r/1"}', 'R-1')
  FROM unnest(ARRAY['fk-1', 'silent-1', 'window-1']) AS k;
SELECT idem_complete((idem_claim('op', 'backlog-' || i, '{"n": 1}')).token, 201,
                     '{"id": "R-1"}', '{"Location": "/r/1"}', 'R-1')
  FROM generate_series(1, 40) i;
INSERT INTO app_orders SELECT id FROM idem_records WHERE key = 'fk-1';
CREATE TRIGGER keep_silently BEFORE DELETE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION keep_silently();
UPDATE idem_records SET expires_at = now() - interval '9 days'
 WHERE key IN ('fk-1', 'silent-1');
UPDATE idem_records SET expires_at = now() - interval '8 days'
 WHERE key LIKE 'backlog-%';
UPDATE idem_records SET expires_at = now() - interval '1 hour'
 WHERE key = 'window-1';
COMMIT;
});
ok( $node->poll_query_until(
		'appdb', q{
SELECT count(*) FILTER (WHERE key LIKE 'backlog-%') = 0
   AND count(*) FILTER (WHERE key IN ('fk-1', 'silent-1', 'window-1')
                          AND response_body IS NULL AND resource_id IS NULL) = 3
  FROM idem_records}),
	'the worker drains a backlog behind records it cannot delete, and purges those');
like(
	slurp_file($node->logfile, $log_offset),
	qr/reached idempotency\.cleanup_max_batches: \d+ expired records deleted in 2 batches/,
	'the backlog took more than one cycle');
like(
	$node->safe_psql('appdb', 'SELECT last_error FROM idem_worker_status()'),
	qr/^cleanup skipped record \d+ \(key hash [0-9a-f]{8}\): /,
	'the status names the last skipped record');
my $kept = q{SELECT string_agg(key || ':' || xmin, ',' ORDER BY key)
  FROM idem_records WHERE key IN ('fk-1', 'silent-1')};
my $kept_before = $node->safe_psql('appdb', $kept);
my $cycles = $node->safe_psql('appdb', 'SELECT cycles FROM idem_worker_status()');
ok( $node->poll_query_until(
		'appdb', "SELECT cycles >= $cycles + 3 FROM idem_worker_status()"),
	'the worker runs three more cycles');
is($node->safe_psql('appdb', $kept), $kept_before,
	'the tombstones of the kept records are not rewritten');

$node->stop;
done_testing();
