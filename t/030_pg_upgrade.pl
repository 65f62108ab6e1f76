# pg_upgrade from an older PostgreSQL major version keeps every record: a
# cluster of the older version holds records in every state (and a
# tombstone, an archived copy, a sealed response), pg_upgrade makes a
# cluster of the version under test of it, and there every record is the
# same, column for column, and answers as before: replays, a running
# attempt's token, an unknown record, a tombstone, new claims.
#
# Runs when IDEM_UPGRADE_FROM names the installation of the older version
# (the folder holding its bin/, the extension installed there), as
# PG_VERSIONS="15 18" bash scripts/test.sh sets it; skipped otherwise.
use strict;
use warnings;
use File::Basename;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old_install = $ENV{IDEM_UPGRADE_FROM};
plan skip_all => 'IDEM_UPGRADE_FROM does not name an older installation'
  unless defined $old_install && -x "$old_install/bin/pg_ctl";

my $key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';

# Both clusters: the worker serves "postgres" only, so that no pass touches
# the records of appdb while they are compared; the same encryption key.
my $settings = qq{
idempotency.database = 'postgres'
idempotency.encryption_key = '$key'
};

my $old = PostgreSQL::Test::Cluster->new('old', install_path => $old_install);
$old->init(extra => [ '--encoding=UTF8', '--locale=C' ]);
$old->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\n$settings");
$old->start;

$old->safe_psql('postgres', 'CREATE DATABASE appdb');
$old->safe_psql('appdb', q{
	CREATE ROLE app;
	CREATE EXTENSION idempotency;
	GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_replay TO app;
});

# One record in each state, claimed by the application's role, a sealed
# response, and a tombstone: a finished record past its expiry that cleanup
# purged (the table's owner moves expires_at into the past).
my $token = $old->safe_psql('appdb', q{
	SET ROLE app;
	-- a lease of a microsecond has ended by the next statement
	SELECT outcome FROM idem_claim('payments.create', 'key-unknown', lease => '1 microsecond');
	SELECT outcome FROM idem_claim('payments.create', 'key-unknown');
	SELECT idem_complete(token, 201, '{"id": "PAY-1", "amount": 100}',
	                     '{"Location": "/payments/PAY-1"}', 'PAY-1')
	  FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}');
	SELECT idem_complete(token, 200, raw_body => '\x00ff'::bytea)
	  FROM idem_claim('payments.create', 'key-raw', '{"amount": 2}');
	SELECT idem_complete(token, 201, '{"id": "PAY-6"}')
	  FROM idem_claim('payments.create', 'key-expired', '{"amount": 6}');
	SELECT idem_fail(token, 422, '{"error": "amount must be positive"}')
	  FROM idem_claim('payments.create', 'key-failed', '{"amount": -1}');
	SELECT idem_fail(token, 503, retryable => true)
	  FROM idem_claim('payments.create', 'key-retry', '{"amount": 3}');
	SELECT token FROM idem_claim('payments.create', 'key-running', '{"amount": 5}', lease => '1h');
});
($token) = $token =~ /^(\d+\.\d+\.[0-9a-f]{32})$/m;
ok(defined $token, 'a running attempt has a token');
$old->safe_psql('appdb', q{
	UPDATE idem_records SET expires_at = now() - interval '1 hour'
	 WHERE key = 'key-expired';
	SET idempotency.tombstone_ttl = '30d';
	SELECT idem_cleanup();
	INSERT INTO idem_records_archive
	SELECT a.* FROM idem_records r,
	       jsonb_populate_record(NULL::idem_records_archive,
	                             to_jsonb(r) || jsonb_build_object('archived_at', now())) a
	 WHERE r.key = 'key-ok';
});

my $records_query = 'SELECT r::text FROM idem_records r ORDER BY id';
my $archive_query =
  'SELECT a::text FROM idem_records_archive a ORDER BY id, archived_at';
my $states_query =
  'SELECT state, count(*) FROM idem_records GROUP BY state ORDER BY state';
my $answers_query = q{
	SET ROLE app;
	SELECT key, outcome, http_status, headers, body, raw_body, resource_id, error_code
	  FROM unnest('{key-ok,key-raw,key-failed,key-unknown,key-expired,key-running}'::text[]) key,
	       idem_replay('payments.create', key)
	 ORDER BY key};
my $before = $old->safe_psql('appdb', $records_query);
# A record belongs to its role's identity: pg_upgrade keeps role OIDs.
my $roles_query = 'SELECT id, role::oid FROM idem_records ORDER BY id';
my $roles_before = $old->safe_psql('appdb', $roles_query);
my $archive_before = $old->safe_psql('appdb', $archive_query);
my $answers_before = $old->safe_psql('appdb', $answers_query);
is( $old->safe_psql('appdb', $states_query),
	"processing|1\nsucceeded|3\nfailed|1\nretryable|1\nunknown|1",
	'the old cluster holds a record in every state');
is( $old->safe_psql('appdb',
		q{SELECT string_agg(key, ',' ORDER BY key) FROM idem_records
		   WHERE response_sealed IS NOT NULL AND response_body IS NULL}),
	'key-failed,key-ok,key-raw', 'the responses are sealed');
is( $old->safe_psql('appdb',
		q{SELECT response_sealed IS NULL AND expires_at < now()
		    FROM idem_records WHERE key = 'key-expired'}),
	't', 'and one is a tombstone');

# The new cluster, of the version under test, made by pg_upgrade; the
# library is preloaded once it is upgraded.
my $new = PostgreSQL::Test::Cluster->new('new');
# (initdb enables data checksums from 18 on; pg_upgrade needs the old
# cluster's setting)
$new->init(
	extra => [
		'--encoding=UTF8', '--locale=C',
		$new->pg_version >= 18 ? '--no-data-checksums' : ()
	]);
ok($old->pg_version < $new->pg_version,
	'from PostgreSQL ' . $old->pg_version . ' to ' . $new->pg_version);

# pg_upgrade restores each column's attribute options: one the new server
# does not know fails the restore of any table, the extension's or not.
# Debian's 15.20 marks every column with pg_attver, which 18.6 does not
# know; such options are cleared in the old cluster first, as an upgrade
# between those two releases needs of any database.
$new->start;
my @unknown_options;
foreach my $option (split /\n/,
	$old->safe_psql('appdb', q{
		SELECT DISTINCT split_part(o, '=', 1)
		  FROM pg_attribute, unnest(attoptions) o ORDER BY 1}))
{
	my ($ret) = $new->psql('postgres', qq{
		CREATE TEMP TABLE t (c int);
		ALTER TABLE t ALTER COLUMN c SET ("$option" = 1)});
	push @unknown_options, $option if $ret != 0;
}
$new->stop;
if (@unknown_options)
{
	note 'clearing attribute options ' . $new->pg_version
	  . ' does not know: ' . join(', ', @unknown_options);
	my $list = join(', ', map { "'$_'" } @unknown_options);
	foreach my $db ('appdb', 'postgres', 'template1')
	{
		$old->safe_psql($db, qq{
			UPDATE pg_attribute
			   SET attoptions = NULLIF(ARRAY(SELECT o FROM unnest(attoptions) o
			                                  WHERE split_part(o, '=', 1) NOT IN ($list)),
			                           '{}')
			 WHERE attoptions IS NOT NULL});
	}
}
$old->stop;
my $upgrade_dir = $new->basedir . '/upgrade';
mkdir $upgrade_dir;
chdir $upgrade_dir;
command_ok(
	[
		'pg_upgrade', '--no-sync',
		'--old-datadir' => $old->data_dir,
		'--new-datadir' => $new->data_dir,
		'--old-bindir' => $old->config_data('--bindir'),
		'--new-bindir' => $new->config_data('--bindir'),
		'--socketdir' => $new->host,
		'--old-port' => $old->port,
		'--new-port' => $new->port,
		'--copy',
	],
	'pg_upgrade from ' . $old->pg_version . ' to ' . $new->pg_version);
$new->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'\n$settings");
$new->start;

is($new->safe_psql('appdb', $records_query),
	$before, 'every record is kept, column for column');
is($new->safe_psql('appdb', $roles_query),
	$roles_before, 'every record keeps its role, by OID');
is($new->safe_psql('appdb', $archive_query),
	$archive_before, 'the archive is kept, column for column');
is($new->safe_psql('appdb', $answers_query),
	$answers_before, 'every record answers as before (idem_replay)');

# What the application's role is answered now: the same as before.
foreach my $case (
	[
		q{SELECT outcome, http_status, headers, body, resource_id
		    FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')},
		'replay|201|{"Location": "/payments/PAY-1"}|{"id": "PAY-1", "amount": 100}|PAY-1',
		'a retry replays the same response'
	],
	[
		q{SELECT outcome, raw_body FROM idem_claim('payments.create', 'key-raw', '{"amount": 2}')},
		'replay|\x00ff', 'exact bytes replay byte for byte'
	],
	[
		q{SELECT outcome, http_status, body
		    FROM idem_claim('payments.create', 'key-failed', '{"amount": -1}')},
		'replay|422|{"error": "amount must be positive"}', 'a stable failure replays'
	],
	[
		q{SELECT outcome FROM idem_claim('payments.create', 'key-ok', '{"amount": 101}')},
		'mismatch', 'another request under a used key is a mismatch'
	],
	[
		q{SELECT outcome FROM idem_claim('payments.create', 'key-unknown')},
		'unknown', 'an unknown record stays unknown'
	],
	[
		q{SELECT outcome, error_code FROM idem_claim('payments.create', 'key-expired', '{"amount": 6}')},
		'expired|IDEMPOTENCY_KEY_EXPIRED', 'a tombstone answers expired'
	],
	[
		q{SELECT outcome, attempt FROM idem_claim('payments.create', 'key-retry', '{"amount": 3}')},
		'proceed|2', 'a retryable record gets attempt 2'
	],
	[
		q{SELECT outcome, error_code FROM idem_claim('payments.create', 'key-running', '{"amount": 5}')},
		'in_progress|IDEMPOTENCY_REQUEST_IN_PROGRESS', 'a running attempt is still running'
	],
	[
		qq{SELECT idem_complete('$token', 201, '{"id": "PAY-5"}');
		   SELECT outcome, body FROM idem_claim('payments.create', 'key-running', '{"amount": 5}')},
		qq{\nreplay|{"id": "PAY-5"}}, 'its token from before the upgrade completes it'
	])
{
	my ($query, $expected, $name) = @$case;
	is($new->safe_psql('appdb', "SET ROLE app; $query"), $expected, $name);
}
my $max_id = $new->safe_psql('appdb', 'SELECT max(id) FROM idem_records');
is( $new->safe_psql('appdb', qq{
		SET ROLE app;
		SELECT outcome, record_id > $max_id
		  FROM idem_claim('payments.create', 'key-new')}),
	'proceed|t', 'a new key proceeds, with a new record id');
is($new->safe_psql('appdb', 'SELECT count(*) FROM idem_records'),
	'8', 'nothing was lost or duplicated (7 upgraded, 1 new)');

# The role renamed after the upgrade keeps its records.
$new->safe_psql('postgres', 'ALTER ROLE app RENAME TO app_v2');
is($new->safe_psql('appdb', q{
		SET ROLE app_v2;
		SELECT outcome, http_status FROM idem_claim('payments.create', 'key-ok', '{"amount": 100}')}),
	'replay|201', 'a role renamed after the upgrade still replays its answers');

$new->stop;
done_testing();
