# idempotency.encryption_key is protected only when the library is loaded at
# server start: then no role but a superuser can read it, and it is refused
# where the catalogs would keep it readable.  Without the preload the setting
# is a plain placeholder until a session loads the library, readable by
# every role, so the key is not used: a completion refuses, and no response
# is stored at all.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $key  = 'ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100';
my $key2 = '00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff';

# With the preload.
my $node = PostgreSQL::Test::Cluster->new('key_preloaded');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.database = 'no_such_database'
idempotency.encryption_key = '$key'
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE app LOGIN;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_replay TO app;
});

# A fresh session of an unprivileged role, before any idem_* call.
my ($ret, $out, $err) = $node->psql('postgres',
	'SHOW idempotency.encryption_key', extra_params => [ '-U', 'app' ]);
unlike($out . $err, qr/$key/, 'an unprivileged role cannot SHOW the key');
# (PostgreSQL 15's words, then 16's and later's)
like(
	$err,
	qr/must be superuser or have privileges of pg_read_all_settings|permission denied to examine "idempotency.encryption_key"/,
	'... it is told it may not');
($ret, $out, $err) = $node->psql('postgres',
	"SELECT current_setting('idempotency.encryption_key', true)",
	extra_params => [ '-U', 'app' ]);
unlike($out . $err, qr/$key/,
	'an unprivileged role cannot read the key with current_setting()');
is($node->safe_psql('postgres', 'SHOW idempotency.encryption_key'),
	'(set)', 'a superuser is shown that it is set, not the key');

($ret, $out, $err) = $node->psql('postgres',
	"ALTER ROLE app SET idempotency.encryption_key = '$key2'");
like($err, qr/cannot be stored in the catalogs/,
	'ALTER ROLE ... SET of a key is refused');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM pg_db_role_setting WHERE array_to_string(setconfig, ',') LIKE '%encryption%'"),
	'0', 'no key is stored in pg_db_role_setting');

# The application's responses are sealed and replay.
is( $node->safe_psql(
		'postgres', q{
SELECT token FROM idem_claim('op', 'k1') \gset
SELECT idem_complete(:'token', 201, '{"secret": "card-4242"}');
SELECT outcome || ' ' || (body->>'secret') FROM idem_claim('op', 'k1');
}, extra_params => [ '-U', 'app' ]),
	"\nreplay card-4242", 'a response is sealed and replays');
is($node->safe_psql('postgres',
	q{SELECT response_body IS NULL AND response_sealed IS NOT NULL FROM idem_records}),
	't', 'it is stored sealed');
$node->stop;

# Without the preload: the key is not used, and nothing is stored.
my $plain = PostgreSQL::Test::Cluster->new('key_not_preloaded');
$plain->init;
$plain->append_conf('postgresql.conf', "idempotency.encryption_key = '$key'");
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION idempotency');
($ret, $out, $err) = $plain->psql('postgres', q{
SELECT token FROM idem_claim('op', 'k1') \gset
SELECT idem_complete(:'token', 201, '{"secret": "card-4242"}');
});
like($err, qr/idempotency.encryption_key is set but the library is not in shared_preload_libraries/,
	'without the preload a completion refuses to use the key');
is($plain->safe_psql('postgres',
	q{SELECT state || ' ' || (response_body IS NULL)::text FROM idem_records}),
	'processing true', 'and stores nothing, in plaintext or otherwise');
$plain->stop;

done_testing();
