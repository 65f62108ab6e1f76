# idempotency.synchronous_outcomes: with synchronous_commit = off, a
# transaction that writes a record still commits synchronously, so an
# immediate shutdown (no WAL flushed by anyone else) right after the claim
# or the completion takes nothing back: the retry replays or is told
# in_progress, never proceeds a second time.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('sync_outcomes');
$node->init;
# The WAL writer flushes asynchronous commits only every 10 s: nothing but
# the setting under test flushes them before the immediate stop.
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.database = 'no_such_database'
synchronous_commit = off
wal_writer_delay = 10s
wal_writer_flush_after = 0
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
$node->safe_psql('postgres', 'CHECKPOINT');

is($node->safe_psql('postgres', 'SHOW idempotency.synchronous_outcomes'),
	'on', 'on by default');

# Flushed at commit: the WAL is on disk at least up to where the claim's
# transaction had written it before its commit record.
is( $node->safe_psql(
		'postgres', q{
BEGIN;
SELECT (idem_claim('op', 'k1', '{"a": 1}')).outcome;
SELECT pg_current_wal_insert_lsn() AS written \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() >= :'written';
}),
	"proceed\nt",
	'a claim that proceeds is flushed at commit');

# A claim that proceeds, then a crash: the retry is not a second attempt.
my $token = $node->safe_psql('postgres',
	q{SELECT token FROM idem_claim('op', 'k2', '{"a": 2}', lease => '1h')});
$node->stop('immediate');
$node->start;
is( $node->safe_psql(
		'postgres',
		q{SELECT outcome, attempt FROM idem_claim('op', 'k2', '{"a": 2}')}),
	'in_progress|1',
	'after a crash, the retry of a claim that proceeded is in_progress');

# Its completion, then a crash: the retry replays.
$node->safe_psql('postgres',
	qq{SELECT idem_complete('$token', 201, '{"id": 7}')});
$node->stop('immediate');
$node->start;
is( $node->safe_psql(
		'postgres',
		q{SELECT outcome, http_status, body FROM idem_claim('op', 'k2', '{"a": 2}')}),
	'replay|201|{"id": 7}',
	'after a crash, the retry of a completed request replays');

# Replays and in_progress answers write nothing and force no flush; a
# session may turn the setting off only as a superuser.
$node->safe_psql('postgres', q{CREATE ROLE app LOGIN});
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	'SET idempotency.synchronous_outcomes = off', extra_params => [ '-U', 'app' ]);
like($stderr, qr/permission denied to set parameter/,
	'an ordinary role cannot turn it off');

$node->stop;
done_testing();
