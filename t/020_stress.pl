# Many clients retry the same few keys at once: some transactions abort,
# some reuse a key for a different request, and backends are killed with
# SIGKILL in the middle.  Afterwards every key has at most one committed
# side effect, every stored response names that side effect, and nothing is
# left half done.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('stress');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.database = 'postgres'
idempotency.naptime = '100ms'
max_connections = 40
restart_after_crash = on
});
$node->start;

$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                       key text NOT NULL, amount int NOT NULL);

-- One request: claim; on proceed write the payment, linger a little so that
-- others collide with us, and complete with the payment's id.  The caller
-- commits or rolls back.
CREATE FUNCTION stress_step(k int, amount int, w interval) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  c idem_decision;
  pay bigint;
BEGIN
  c := idem_claim('payments.create', 'key-' || k,
                  jsonb_build_object('amount', amount), wait => w);
  IF c.outcome = 'proceed' THEN
    INSERT INTO payments (key, amount) VALUES ('key-' || k, amount)
      RETURNING id INTO pay;
    PERFORM pg_sleep(random() * 0.005);
    PERFORM idem_complete(c.token, 201, jsonb_build_object('payment', pay, 'amount', amount),
                          resource_id => pay::text);
  ELSIF c.outcome = 'replay' AND (c.body->>'amount')::int <> amount THEN
    RAISE EXCEPTION 'replayed the response of a different request';
  END IF;
  RETURN c.outcome;
END $$;
});

# 1 in 8 requests reuses the key for another amount; 1 in 5 transactions
# rolls back after its step; half the clients wait up to 50ms for the key.
my $script = $node->basedir . '/stress.sql';
open(my $fh, '>', $script) or die $!;
print $fh <<'EOF';
\set k random(1, 2000)
\set amount random(1, 8)
\set amount 1 + :amount / 8
\set rollback random(1, 5)
BEGIN;
SELECT stress_step(:k, :amount, CASE WHEN :client_id % 2 = 0 THEN interval '50ms' ELSE interval '0' END);
\if :rollback = 1
ROLLBACK;
\else
COMMIT;
\endif
EOF
close($fh);

# Run pgbench for a while; returns its harness.
sub start_pgbench
{
	my ($seconds) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-c', '16', '-j', '2', '-T', $seconds,
			'-f', $script, $node->connstr('postgres') . ' application_name=stress'
		],
		'>', \$out, '2>', \$err);
	return ($h, \$out, \$err);
}

# What pgbench printed on stderr in every round.
my $all_errors = '';

# Rounds in which a backend serving pgbench is killed with SIGKILL; the
# server restarts all sessions, aborting their transactions.
for my $round (1 .. 3)
{
	my ($h, $out, $err) = start_pgbench(8);
	unless ($node->poll_query_until('postgres',
			"SELECT count(*) >= 8 FROM pg_stat_activity WHERE application_name = 'stress'"))
	{
		$h->finish;
		die "pgbench did not start: $$out $$err";
	}
	my $pid = $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE application_name = 'stress' LIMIT 1");
	kill 'KILL', $pid;
	$h->finish;    # pgbench reports aborted clients: expected
	$all_errors .= $$err;
	$node->poll_query_until('postgres', 'SELECT true') or die "server did not come back";
}

# A round without kills, so that every key gets its chance to finish.
my ($h, $out, $err) = start_pgbench(4);
$h->finish;
$all_errors .= $$err;
like($$out, qr/number of transactions actually processed: [1-9]/,
	'the last round ran transactions');
like($all_errors, qr/terminat|server closed the connection/,
	'the killed rounds lost their connections');
unlike($all_errors, qr/different request/, 'no replay ever answered another request');

is($node->safe_psql('postgres',
	"SELECT count(*) FROM (SELECT key FROM payments GROUP BY key HAVING count(*) > 1) d"),
	'0', 'no key has more than one payment');

is($node->safe_psql('postgres', q{
	SELECT count(*) FROM payments p
	 WHERE NOT EXISTS (SELECT 1 FROM idem_records r
	                    WHERE r.key = p.key AND r.state = 'succeeded'
	                      AND r.resource_id = p.id::text
	                      AND (r.response_body->>'payment')::bigint = p.id)}),
	'0', 'every payment is the stored outcome of its key');

is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idem_records r
	 WHERE r.state = 'succeeded'
	   AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.id::text = r.resource_id)}),
	'0', 'every stored success has its payment');

is($node->safe_psql('postgres',
	"SELECT count(*) FROM idem_records WHERE state <> 'succeeded'"),
	'0', 'no record is left processing, unknown or failed');

ok($node->safe_psql('postgres', 'SELECT count(*) FROM payments') > 0,
	'payments were made');

$node->stop;
done_testing();
