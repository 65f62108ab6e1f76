# IdemTest: the cluster set-up the TAP tests of the idempotency extension
# share.  Found through prove's include path: the Makefile adds -I t.
package IdemTest;

use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;

our @EXPORT = qw(preloaded_node);

# preloaded_node(NAME, conf => TEXT, database => DB, init => {...}):
# a new cluster NAME, initialised (with the options of init), with the
# library in shared_preload_libraries and the lines of conf appended to
# postgresql.conf, started.  With database, that database is created and
# the extension created in it.
sub preloaded_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);

	$node->init(%{ $opts{init} // {} });
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idempotency'\n" . ($opts{conf} // ''));
	$node->start;
	if (my $db = $opts{database})
	{
		$node->safe_psql('postgres', "CREATE DATABASE $db");
		$node->safe_psql($db, 'CREATE EXTENSION idempotency');
	}
	return $node;
}

1;
