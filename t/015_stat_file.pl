# The file idem_stat_operations' counters are saved to at a clean shutdown
# is read back at start only when it is whole and of this build's format: a
# truncated file, an entry whose operation is not a terminated name, a file
# of another entry size or of the previous version (entries without their
# encoding) is logged and ignored, and none of its entries is kept.  A
# valid file still loads.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = preloaded_node(
	'stat_file',
	database => 'appdb',
	conf => q{
idempotency.database = 'appdb'
});

my $file = $node->data_dir . '/pg_stat/idem_stat_operations.stat';
my $rows = q{SELECT count(*) FROM idem_stat_operations};

# Two entries, saved by a clean shutdown; keep a copy of the file.
$node->safe_psql('appdb',
	"SELECT idem_claim('file.a', 'k1'); SELECT idem_claim('file.b', 'k1')");
$node->stop;
ok(-e $file, 'a clean shutdown saves the counters');
my $saved = slurp_file($file);
my $header_len = 24;    # header, entry count, evictions, stats_reset
my $n = unpack('l', substr($saved, 4, 4));
is($n, 2, 'the file holds two entries');
my $entry_len = (length($saved) - $header_len) / $n;

# Write a file, start, and return the rows loaded and what the log said.
sub start_with
{
	my ($content) = @_;
	open(my $fh, '>:raw', $file) or die "could not write $file: $!";
	print $fh $content;
	close($fh);
	my $log_offset = -s $node->logfile;
	$node->start;
	my $got = $node->safe_psql('appdb', $rows);
	my $log = slurp_file($node->logfile, $log_offset);
	$node->stop('immediate');    # saves nothing
	unlink($file);
	return ($got, $log);
}

my ($got, $log) = start_with($saved);
is($got, '2', 'a whole file loads');

($got, $log) = start_with(substr($saved, 0, length($saved) - 10));
is($got, '0', 'a truncated file loads no entry');
like($log, qr/ignoring invalid file/, 'a truncated file is logged');

# An entry's operation filled to the end of its buffer: no terminating
# zero.
my $bad = $saved;
my $op_offset = index($saved, 'file.a', $header_len);
substr($bad, $op_offset, 256) = 'x' x 256;
($got, $log) = start_with($bad);
is($got, '0', 'an operation without its terminating zero loads no entry');
like($log, qr/ignoring invalid file/, 'an unterminated operation is logged');

# Entries 8 bytes longer than this build's (a build with one more counter),
# under the same header.
my $longer = substr($saved, 0, $header_len);
for my $i (0 .. $n - 1)
{
	$longer .= substr($saved, $header_len + $i * $entry_len, $entry_len) . "\0" x 8;
}
($got, $log) = start_with($longer);
is($got, '0', 'a file of another entry size loads no entry');
like($log, qr/ignoring invalid file/, 'another entry size is logged');

# The previous version's header ("IDS1": entries without their encoding).
my $old = $saved;
substr($old, 0, 4) = pack('L', 0x49445331);
($got, $log) = start_with($old);
is($got, '0', 'a file of the previous version loads no entry');
like($log, qr/ignoring invalid file/, 'a file of the previous version is logged');

done_testing();
