# From 1.3 idem_records.role is a regrole: pg_dump writes each record's
# role by name, and the restore looks every name up.  Restored where one
# of those roles does not exist (a cluster whose roles were not all
# recreated first, a role dropped since the dump), the COPY of the whole
# table fails: every record is lost, those of roles that do exist
# included, and each of their retries proceeds a second time.  Under 1.2
# (text) the same restore kept every record.
#
# Expected (what this test asks for): the records of the roles that exist
# are restored and replay; the missing role's record is kept without a
# role (or left out alone), never the whole table.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('restore_missing');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;

$node->safe_psql('postgres', q{
	CREATE DATABASE appdb;
	CREATE ROLE keeper;
	CREATE ROLE temp_role;
});
$node->safe_psql('appdb', q{
	CREATE EXTENSION idempotency;
	GRANT EXECUTE ON FUNCTION idem_claim, idem_complete TO PUBLIC;
	SET ROLE keeper;
	SELECT idem_complete(token, 201, '{"charge": "ch_keeper"}')
	  FROM idem_claim('payments.create', 'key-keeper', '{"amount": 1}');
	RESET ROLE;
	SET ROLE temp_role;
	SELECT idem_complete(token, 201, '{"charge": "ch_temp"}')
	  FROM idem_claim('payments.create', 'key-temp', '{"amount": 2}');
	RESET ROLE;
});
my $dump = $node->basedir . '/appdb.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, $node->connstr('appdb') ],
	'pg_dump of the application database');

$node->safe_psql('appdb', 'DROP OWNED BY temp_role');
$node->safe_psql('postgres', 'DROP ROLE temp_role; CREATE DATABASE restored');
# without --exit-on-error, as one restores what can be restored
# (its exit status is not what is tested: it reports the COPY it lost)
run_log([ 'pg_restore', '-d', $node->connstr('restored'), $dump ]);

is($node->safe_psql('restored', q{SELECT count(*) FROM idem_records WHERE key = 'key-keeper'}),
	'1', 'the record of a role that exists is restored');
is($node->safe_psql('restored', q{
	SET ROLE keeper;
	SELECT outcome FROM idem_claim('payments.create', 'key-keeper', '{"amount": 1}')}),
	'replay', 'its retry replays instead of paying a second time');

$node->stop;
done_testing();
