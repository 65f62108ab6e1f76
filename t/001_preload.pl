# The library loads through shared_preload_libraries and the extension can
# be created and dropped on such a server.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('preload');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;

is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'idempotency', 'library is preloaded');

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_records'),
	'0', 'records table exists and is empty');

is($node->safe_psql('postgres', 'SHOW idempotency.default_ttl'),
	'1d', 'settings are defined');

my ($ret, $stdout, $stderr) =
  $node->psql('postgres', 'SET idempotency.no_such_setting = 1');
like($stderr, qr/invalid configuration parameter name/,
	'the idempotency. prefix is reserved');

$node->safe_psql('postgres', 'DROP EXTENSION idempotency');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM pg_class WHERE relname = 'idem_records'"),
	'0', 'DROP EXTENSION removes the table');

$node->stop;
done_testing();
