# The worker next to bad records and database DDL: a record that a pass
# cannot process is skipped and the passes go on; the extension's schema
# renamed; ALTER DATABASE ... RENAME, CREATE DATABASE ... TEMPLATE and DROP
# DATABASE by a non-superuser owner of a database the worker serves; a
# listed database that does not allow connections; a database listed twice.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('worker_ddl');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.database = 'appdb, ownerdb, appdb, closeddb, "appdb"'
idempotency.naptime = '100ms'
idempotency.cleanup_grace = 0
# deletion without tombstones; t/005_worker_tombstones.pl keeps them
idempotency.tombstone_ttl = 0
});
$node->start;

# The databases exist before the launcher starts, so that it serves them at
# once instead of looking for them again every few seconds.
$node->safe_psql('postgres', q{
CREATE ROLE dbowner LOGIN CREATEDB;
CREATE DATABASE appdb;
CREATE DATABASE ownerdb OWNER dbowner;
CREATE DATABASE closeddb;
ALTER DATABASE closeddb ALLOW_CONNECTIONS false;
});
$node->safe_psql('appdb', 'CREATE EXTENSION idempotency');
$node->safe_psql('ownerdb', 'CREATE EXTENSION idempotency');
$node->restart;

# SQL: whether the worker ran at least $n cycles in database $db.
sub cycles_done
{
	my ($db, $n) = @_;
	return "SELECT coalesce(sum(cycles), 0) >= $n FROM idem_worker_status() WHERE database = '$db'";
}
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# A processing record of appdb whose lease ended, keyed $key.
sub add_ended_lease
{
	my ($key, $schema) = @_;
	$schema //= 'public';
	$node->safe_psql('appdb', qq{
INSERT INTO $schema.idem_records (tenant, caller, operation, key, fingerprint,
    state, attempt, on_lease_expiry, ttl, locked_until, created_at,
    claimed_at, updated_at, expires_at)
VALUES ('', 'app', 'op', '$key', sha256(''), 'processing', 1, 'unknown',
    '1 day', now() - interval '1 minute', now(), now(), now(),
    now() + interval '1 day')});
}

sub lease_expires
{
	my ($key, $what, $schema) = @_;
	$schema //= 'public';
	add_ended_lease($key, $schema);
	ok( $node->poll_query_until(
			'appdb',
			"SELECT state = 'unknown' FROM $schema.idem_records WHERE key = '$key'"),
		"the worker expires leases $what");
}

#
# A database listed twice is served once.
#
ok($node->poll_query_until('postgres', cycles_done('appdb', 3)),
	'appdb gets its cycles');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idem_worker_status() WHERE database = 'appdb'"),
	'1',
	'a database listed twice has one status row');
my $log = slurp_file($node->logfile);
like(
	$log,
	qr/DETAIL:  Databases served: appdb, ownerdb, closeddb;/,
	'the launcher serves each database listed once');
unlike(
	$log,
	qr/another worker serves this database/,
	'a database listed twice never gets a second worker');

#
# Records a pass cannot process: a lease whose ttl overflows the clock,
# first by locked_until, and an expired record that a trigger refuses to
# delete, first by expires_at.  The other records are processed.
#
my $offset = -s $node->logfile;
$node->safe_psql('appdb', q{
CREATE FUNCTION keep_secret() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.key LIKE 'secret-%' THEN
    RAISE EXCEPTION 'this record is kept by a test trigger';
  END IF;
  RETURN OLD;
END $$;
CREATE TRIGGER keep_secret BEFORE DELETE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION keep_secret();
CREATE TABLE refs (record bigint REFERENCES idem_records (id)
  DEFERRABLE INITIALLY DEFERRED);
BEGIN;
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
    attempt, on_lease_expiry, ttl, locked_until, created_at, claimed_at,
    updated_at, expires_at)
VALUES ('', 'app', 'op', 'secret-lease-key', sha256(''), 'processing', 1,
        'unknown', '25000000 mons -740000000 days', now() - interval '1 year',
        now(), now(), now(), now()),
       ('', 'app', 'op', 'secret-delete-key', sha256(''), 'processing', 1,
        'unknown', '1 day', now() + interval '1 day', now(), now(), now(),
        now()),
       ('', 'app', 'op', 'referenced-key', sha256(''), 'processing', 1,
        'unknown', '1 day', now() + interval '1 day', now(), now(), now(),
        now()),
       ('', 'app', 'op', 'old-done', sha256(''), 'processing', 1,
        'unknown', '1 day', now() + interval '1 day', now(), now(), now(),
        now());
UPDATE idem_records SET state = 'succeeded', response_status = 200,
       completed_at = now()
 WHERE key IN ('secret-delete-key', 'referenced-key', 'old-done');
UPDATE idem_records SET expires_at = now() - interval '1 year'
 WHERE key = 'secret-delete-key';
UPDATE idem_records SET expires_at = now() - interval '1 month'
 WHERE key = 'referenced-key';
INSERT INTO refs SELECT id FROM idem_records WHERE key = 'referenced-key';
UPDATE idem_records SET expires_at = now() - interval '1 day'
 WHERE key = 'old-done';
COMMIT;
});
my ($lease_id, $delete_id) = split /\n/, $node->safe_psql('appdb',
	"SELECT id FROM idem_records WHERE key LIKE 'secret-%' ORDER BY key DESC");
my $referenced_id = $node->safe_psql('appdb',
	"SELECT id FROM idem_records WHERE key = 'referenced-key'");
lease_expires('good-1', 'behind a record whose ttl overflows');
ok( $node->poll_query_until(
		'appdb', "SELECT count(*) = 0 FROM idem_records WHERE key = 'old-done'"),
	'cleanup deletes expired records behind one it cannot delete');
$node->wait_for_log(
	qr/WARNING:  idempotency lease expiry skipped record $lease_id \(key hash [0-9a-f]{8}\): timestamp out of range/,
	$offset);
$node->wait_for_log(
	qr/WARNING:  idempotency cleanup skipped record $delete_id \(key hash [0-9a-f]{8}\): this record is kept by a test trigger/,
	$offset);
$node->wait_for_log(
	qr/WARNING:  idempotency cleanup skipped record $referenced_id \(key hash [0-9a-f]{8}\): update or delete on table "idem_records" violates foreign key constraint/,
	$offset);
pass('each skipped record is logged by its id, deferred constraints included');
like(
	$node->safe_psql('appdb',
		"SELECT last_error FROM idem_worker_status() WHERE database = 'appdb'"),
	qr/^(lease expiry skipped record $lease_id \(key hash [0-9a-f]{8}\): timestamp out of range|cleanup skipped record ($delete_id \(key hash [0-9a-f]{8}\): this record is kept by a test trigger|$referenced_id \(key hash [0-9a-f]{8}\): update or delete on table "idem_records" violates foreign key constraint .*))$/,
	'the status shows the last skipped record');
lease_expires('good-2', 'again in the next cycles');
# (the test's own statements are logged too: look at the other lines only)
unlike(
	slurp_file($node->logfile),
	qr/^\S.*(WARNING|ERROR|DETAIL|HINT|CONTEXT):.*secret-/m,
	'the log never shows a key');
is( $node->safe_psql('appdb',
		"SELECT string_agg(state::text, ',' ORDER BY key) FROM idem_records WHERE key LIKE 'secret-%'"),
	'succeeded,processing',
	'the skipped records are left as they were');
# One transaction that locks idem_records first: dropping refs alone would
# take refs before idem_records, the opposite order of the worker's foreign
# key check on a delete, and deadlock with it.
$node->safe_psql('appdb', q{
BEGIN;
LOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE;
DROP TRIGGER keep_secret ON idem_records;
DROP TABLE refs;
DELETE FROM idem_records;
COMMIT;
});

#
# The extension's schema renamed: the worker finds it under its new name.
#
$node->safe_psql('appdb', 'ALTER SCHEMA public RENAME TO idem_app');
lease_expires('renamed-1', 'after ALTER SCHEMA ... RENAME', 'idem_app');
$node->safe_psql('appdb', 'ALTER SCHEMA idem_app RENAME TO public');
lease_expires('renamed-2', 'after the schema got its name back');

#
# No process of the worker stays connected to the databases it serves:
# commands that need a database to themselves succeed.  A cycle running
# when they start is waited for (each waits up to 5 seconds for other
# sessions to leave), and one that would start meanwhile waits for them.
#
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity
 WHERE backend_type = 'idempotency launcher' AND datname IS NULL}),
	'the launcher is connected to no database');
my ($ret, $stdout, $stderr) =
  $node->psql('postgres', 'ALTER DATABASE appdb RENAME TO appdb_renamed');
is($ret, 0, 'ALTER DATABASE ... RENAME succeeds on a database the worker serves')
  or diag $stderr;
($ret, $stdout, $stderr) =
  $node->psql('postgres', 'ALTER DATABASE appdb_renamed RENAME TO appdb');
is($ret, 0, 'and so does renaming it back') or diag $stderr;
($ret, $stdout, $stderr) =
  $node->psql('postgres', 'CREATE DATABASE appcopy TEMPLATE appdb');
is($ret, 0, 'CREATE DATABASE ... TEMPLATE succeeds on a database the worker serves')
  or diag $stderr;
$node->safe_psql('postgres', 'DROP DATABASE appcopy');
lease_expires('after-rename', 'after the database was renamed and renamed back');

ok($node->poll_query_until('postgres', cycles_done('ownerdb', 1)),
	'ownerdb gets its cycles');
($ret, $stdout, $stderr) = $node->psql('postgres', 'DROP DATABASE ownerdb',
	extra_params => [ '-U', 'dbowner' ]);
is($ret, 0, 'a non-superuser owner drops a database the worker serves')
  or diag $stderr;

#
# A database that does not allow connections: logged once, no FATAL, served
# once it allows them again.
#
my ($closed_at) = slurp_file($node->logfile) =~
  /^(\S+ \S+ \S+) \[\d+\] (?:[0-9A-Z]{5} )?LOG:  database "closeddb" served by the idempotency worker does not allow connections/m;
ok(defined $closed_at, 'a database refusing connections is logged');
# the launcher looks at it again every 5 seconds: let two looks pass
ok( $node->poll_query_until(
		'postgres',
		"SELECT clock_timestamp() > '$closed_at'::timestamptz + interval '11 seconds'"
	),
	'time for the launcher to look at it again');
$log = slurp_file($node->logfile);
my $closed = () = $log =~ /database "closeddb" served by the idempotency worker does not allow connections/g;
is($closed, 1, 'a database refusing connections is logged once');
unlike($log, qr/FATAL:.*closeddb/, 'and never causes a FATAL');
$offset = -s $node->logfile;
$node->safe_psql('postgres', 'ALTER DATABASE closeddb ALLOW_CONNECTIONS true');
$node->wait_for_log(
	qr/idempotency worker for database "closeddb" is waiting for extension "idempotency" to be installed/,
	$offset);
pass('a database that allows connections again is served');

$node->stop;
done_testing();
