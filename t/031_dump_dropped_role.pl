# A record whose role was dropped after 1.3 keeps the dropped role's OID in
# its regrole column.  regrole prints an OID that names no role as a bare
# number, pg_dump writes that number, and regrole's input takes a number as
# an OID without looking it up: restored into another cluster, the record
# belongs to whichever role has that OID there.  That role is then handed
# the dropped role's stored response (a leak across roles), and its own
# claim of the key replays someone else's payment instead of proceeding.
#
# Expected (what this test asks for): after the restore the record belongs
# to no role in the other cluster (it is listed by idem_records_without_role
# and replayed to nobody), or the dump/restore refuses it; never given to an
# unrelated role.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump_src');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE appdb');
$node->safe_psql('appdb', q{
	CREATE EXTENSION idempotency;
	GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_replay TO PUBLIC;
	CREATE ROLE gone;
	SET ROLE gone;
	SELECT idem_complete(token, 201, '{"card": "secret-of-the-dropped-role"}')
	  FROM idem_claim('payments.create', 'key-gone', '{"amount": 100}');
	RESET ROLE;
});
my $gone_oid = $node->safe_psql('appdb', q{SELECT oid FROM pg_roles WHERE rolname = 'gone'});
$node->safe_psql('appdb', 'DROP ROLE gone');
is($node->safe_psql('appdb', 'SELECT count(*) FROM idem_records_without_role()'),
	'1', 'the dropped role\'s record is listed as without a role');

my $dump = $node->basedir . '/appdb.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, $node->connstr('appdb') ],
	'pg_dump of the application database');

# Another cluster, whose roles have other OIDs: the application's role
# there happens to get the OID the dropped role had here.
my $other = PostgreSQL::Test::Cluster->new('dump_dst');
$other->init;
$other->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$other->start;
$other->safe_psql('postgres', 'CREATE DATABASE appdb');
my $got = $other->safe_psql('postgres', qq{
	DO \$\$
	DECLARE
		i int := 0;
		o oid;
	BEGIN
		LOOP
			i := i + 1;
			EXECUTE format('CREATE ROLE filler_%s', i);
			SELECT oid INTO o FROM pg_roles WHERE rolname = 'filler_' || i;
			EXIT WHEN o >= $gone_oid;
		END LOOP;
		EXECUTE format('ALTER ROLE filler_%s RENAME TO innocent', i);
	END
	\$\$;
	SELECT oid FROM pg_roles WHERE rolname = 'innocent'});
SKIP:
{
	skip "the other cluster could not give a role OID $gone_oid (got $got)", 3
	  unless $got eq $gone_oid;

	$other->command_ok(
		[ 'pg_restore', '-d', $other->connstr('appdb'), $dump ],
		'pg_restore into another cluster');

	is($other->safe_psql('appdb', q{
		SET ROLE innocent;
		SELECT count(*) FROM idem_replay('payments.create', 'key-gone')}),
		'0', 'a role of the other cluster is not handed the dropped role\'s response');
	is($other->safe_psql('appdb', q{
		SET ROLE innocent;
		SELECT outcome FROM idem_claim('payments.create', 'key-gone', '{"amount": 100}')}),
		'proceed', 'its own first claim of the key proceeds');
}

$other->stop;
$node->stop;
done_testing();
