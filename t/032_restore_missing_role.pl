# From 1.3 idem_records.role is a regrole: pg_dump writes each record's
# role by name, and the restore looks every name up, as it does for the
# owners and grants it restores.  Restored where one of those roles does
# not exist (a role dropped since the dump, roles not restored first), the
# COPY of idem_records fails as a whole, and pg_restore says so, naming
# the role: the records are not restored, loudly.  With the roles restored
# first (pg_dumpall --roles-only, as for any database with owners and
# grants), every record is back.  (docs/security.md, "Dump and restore".)
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
my ($out, $err) = ('', '');
IPC::Run::run([ 'pg_restore', '-d', $node->connstr('restored'), $dump ],
	'>', \$out, '2>', \$err);
like($err, qr/"idem_records".*role "temp_role" does not exist/s,
	'pg_restore reports the COPY of idem_records it could not restore, naming the role');
is($node->safe_psql('restored', 'SELECT count(*) FROM idem_records'),
	'0', 'no record of it is restored under another role or half-way');

# The roles restored first: every record is back, and replays.
$node->safe_psql('postgres', 'CREATE ROLE temp_role; CREATE DATABASE restored_again');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored_again'), $dump ],
	'pg_restore once the roles exist');
is($node->safe_psql('restored_again', q{SELECT count(*) FROM idem_records WHERE key = 'key-keeper'}),
	'1', 'the record of a role that exists is restored');
is($node->safe_psql('restored_again', q{
	SET ROLE keeper;
	SELECT outcome FROM idem_claim('payments.create', 'key-keeper', '{"amount": 1}')}),
	'replay', 'its retry replays instead of paying a second time');
is($node->safe_psql('restored_again', q{
	SET ROLE temp_role;
	SELECT outcome FROM idem_claim('payments.create', 'key-temp', '{"amount": 2}')}),
	'replay', 'and so does the role restored first (by its name, as the dump names it)');

$node->stop;
done_testing();
