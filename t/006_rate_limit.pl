# idempotency.max_new_keys_per_second under concurrency: 8 clients create
# new keys as fast as they can for about 3 seconds, and the records created
# stay within 10% of the rate.  A reload changes the rate for the next run,
# and 0 turns the limit off.
#
# No assertion depends on how fast the machine is: the clients measure the
# window they ran in (T, from the database's clock), and the number of
# records is compared with what a bucket of one second's burst allows in T:
#
#     proceeds <= burst + rate x T x 1.1      (the limit holds)
#     proceeds >= rate x T x 0.9              (the limit lets the rate through)
#
# The second bound assumes the clients ask for more than the rate, which each
# run checks first (some claims were answered rate_limited).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('rate_limit');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempotency'
idempotency.database = 'postgres'
idempotency.max_new_keys_per_second = 200
});
$node->start;

$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE rl_app LOGIN;
GRANT EXECUTE ON FUNCTION idem_claim TO rl_app;

-- One client: new keys, one transaction each, until `seconds` have passed.
-- Returns the window it ran in (epoch seconds) and what it was answered.
CREATE PROCEDURE hammer(seconds float8, tag text,
                        OUT started float8, OUT ended float8,
                        OUT proceeds int, OUT limited int)
LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz := clock_timestamp();
  o text;
  i int := 0;
BEGIN
  proceeds := 0;
  limited := 0;
  started := extract(epoch FROM t0);
  WHILE clock_timestamp() < t0 + seconds * interval '1 second' LOOP
    i := i + 1;
    SELECT outcome INTO o FROM idem_claim('rl.create', tag || '-' || i, '{}');
    IF o = 'proceed' THEN
      proceeds := proceeds + 1;
    ELSIF o = 'rate_limited' THEN
      limited := limited + 1;
    ELSE
      RAISE EXCEPTION 'claim % answered %', tag || '-' || i, o;
    END IF;
    COMMIT;
    PERFORM pg_sleep(0.001);
  END LOOP;
  ended := extract(epoch FROM clock_timestamp());
END $$;
GRANT EXECUTE ON PROCEDURE hammer TO rl_app;
});

# Run 8 clients at once for $seconds; returns (T, proceeds, limited).
sub run_clients
{
	my ($run, $seconds) = @_;
	my (@harness, @out, @err);
	for my $c (0 .. 7)
	{
		($out[$c], $err[$c]) = ('', '');
		push @harness,
		  IPC::Run::start(
			[
				'psql', '-XAtq', '-F', ' ', '-v', 'ON_ERROR_STOP=1',
				'-d', $node->connstr('postgres') . ' user=rl_app',
				'-c', "CALL hammer($seconds, '$run-$c', NULL, NULL, NULL, NULL)"
			],
			'>', \$out[$c], '2>', \$err[$c]);
	}
	my ($first, $last, $proceeds, $limited);
	for my $c (0 .. 7)
	{
		$harness[$c]->finish;
		die "client $c of run $run failed: $err[$c]" if $harness[$c]->result;
		my ($started, $ended, $p, $l) = split ' ', $out[$c];
		$first = $started if !defined $first || $started < $first;
		$last = $ended if !defined $last || $ended > $last;
		$proceeds += $p;
		$limited += $l;
	}
	my $records = $node->safe_psql('postgres',
		"SELECT count(*) FROM idem_records WHERE key LIKE '$run-%'");
	is($records, $proceeds, "$run: one record per claim that proceeded");
	return ($last - $first, $proceeds, $limited);
}

# Check a run at $rate against the bounds above.
sub check_rate
{
	my ($run, $rate, $t, $proceeds, $limited) = @_;
	my $max = $rate + $rate * $t * 1.1;
	my $min = $rate * $t * 0.9;
	note sprintf("%s: %d proceeded, %d rate_limited in %.2f s at %d/s (bounds %.0f .. %.0f)",
		$run, $proceeds, $limited, $t, $rate, $min, $max);
	ok($t >= 2.5, "$run: the clients ran for about 3 s");
	ok($limited > 0, "$run: the clients asked for more than the rate");
	ok($proceeds <= $max,
		"$run: proceeds $proceeds <= burst + rate x T x 1.1 = " . int($max));
	ok($proceeds >= $min,
		"$run: proceeds $proceeds >= rate x T x 0.9 = " . int($min));
}

# Wait until new sessions read the reloaded value.
sub set_rate
{
	my ($rate) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET idempotency.max_new_keys_per_second = $rate");
	$node->reload;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT current_setting('idempotency.max_new_keys_per_second') = '$rate'"),
		"the reload sets the rate to $rate");
}

check_rate('r200', 200, run_clients('r200', 3));

# A reload changes the rate of the buckets already in use.
set_rate(50);
check_rate('r50', 50, run_clients('r50', 3));

# 0 turns the limit off.
set_rate(0);
my ($t, $proceeds, $limited) = run_clients('off', 1);
is($limited, 0, 'off: no claim is rate_limited');
ok($proceeds > 0, 'off: claims proceed');

$node->stop;
done_testing();
