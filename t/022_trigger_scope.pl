# A BEFORE INSERT trigger of the table's owner that changes the scope or key
# of a new record.  The claim decided that its own key was free (key_held,
# under the key lock of that key) and then wrote a row of another key: a
# claim must neither raise 23505 for it nor answer proceed again for a key
# whose record it wrote under another name.  The write should refuse the
# change clearly, as the guard refuses it on UPDATE.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('trigger_scope');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempotency'");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE FUNCTION lower_key() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN NEW.key := lower(NEW.key); RETURN NEW; END $$;
CREATE TRIGGER a_lower_key BEFORE INSERT ON idem_records
  FOR EACH ROW EXECUTE FUNCTION lower_key();
});

# key 'abc' is claimed and committed (stored as itself)
is($node->safe_psql('postgres',
		q{SELECT outcome FROM idem_claim('op', 'abc', '{"n":1}')}),
	'proceed', 'abc proceeds');

# key 'ABC' is free by the probe, but its row is written as 'abc'
my ($ret, $out, $err) = $node->psql('postgres',
	q{SELECT outcome FROM idem_claim('op', 'ABC', '{"n":1}')});
unlike($err, qr/duplicate key value|unique constraint/,
	'a claim whose row a trigger moved to a taken key does not raise 23505');
like($err, qr/a trigger on idem_records changed or skipped a new idempotency record/,
	'the claim is refused, naming the trigger\'s change');

# a trigger that moves every new key to a key of its own: the key claimed
# never has a record, and every retry proceeds again
$node->safe_psql('postgres', q{
DROP TRIGGER a_lower_key ON idem_records;
CREATE FUNCTION suffix_key() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN NEW.key := NEW.key || '.' || NEW.id; RETURN NEW; END $$;
CREATE TRIGGER a_suffix_key BEFORE INSERT ON idem_records
  FOR EACH ROW EXECUTE FUNCTION suffix_key();
});
my @outcomes;
for my $try (1 .. 2)
{
	my ($r, $o, $e) = $node->psql('postgres', q{
WITH c AS (SELECT * FROM idem_claim('op', 'pay-1', '{"n":1}')),
     d AS (SELECT idem_complete(token, 201, '{"done":1}') FROM c WHERE token IS NOT NULL)
SELECT outcome FROM c LEFT JOIN d ON true});
	push @outcomes, $r == 0 ? $o : "error";
}
is("@outcomes", 'error error',
	'a key whose record a trigger renames is refused, at every retry');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_records WHERE key LIKE 'pay-1%'}),
	'0', 'and nothing of it is written');
# a trigger that skips the insert (RETURN NULL): refused, not a proceed without a record
$node->safe_psql('postgres', q{
DROP TRIGGER a_suffix_key ON idem_records;
CREATE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER a_skip_row BEFORE INSERT ON idem_records
  FOR EACH ROW EXECUTE FUNCTION skip_row();
});
($ret, $out, $err) = $node->psql('postgres',
	q{SELECT outcome FROM idem_claim('op', 'skipped', '{"n":1}')});
like($err, qr/a trigger on idem_records changed or skipped a new idempotency record/,
	'a claim whose row a trigger skips is refused');
note($node->safe_psql('postgres', 'SELECT key, state FROM idem_records ORDER BY id'));

$node->stop;
done_testing();
