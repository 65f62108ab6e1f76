#!/usr/bin/env bash
# scripts/demo.sh: show the idempotency extension at work on a throwaway
# cluster.
#
# Same set-up as scripts/test.sh (packages, build, install, a cluster run by
# the postgres OS user with the library preloaded and the background worker
# serving the demo database), then runs scripts/demo.sql with psql, echoing
# each statement, and stops the cluster.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster "idempotency.database = 'demo'" "idempotency.naptime = '1s'"

bindir=$("$PG_CONFIG" --bindir)
as_postgres "$bindir/createdb" demo
as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d demo \
    -f "$IDEM_TMP/src/scripts/demo.sql"
