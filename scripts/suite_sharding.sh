# scripts/suite_sharding.sh: the PL/Proxy layout of examples/sharding,
# end to end.  Sourced by scripts/test.sh (after its other suites, whose
# run_client it uses), in the throwaway cluster it started.
#
# Installs Debian's postgresql-15-plproxy when missing (and copies its files
# into the PostgreSQL of $PG_CONFIG when that is not Debian's own), creates
# four shard databases and a proxy database in the cluster (layout.sh), and
# runs examples/sharding/test_sharding.py against them: concurrent clients
# of many tenants through the proxy, one effect per key, one shard per
# tenant.  A fifth shard database, partition 4 of 8 (the half of partition 0
# that doubling the partitions splits off), receives a tenant moved there.  The test runs in a process group of its own, which run_client
# ends whatever happens, with a time limit.

run_sharding() {
    local dir=$IDEM_TMP/src/examples/sharding split=idem_shard4 bindir
    bindir=$("$PG_CONFIG" --bindir)
    IDEM_GROUPS=$IDEM_TMP/sharding.groups
    : >"$IDEM_GROUPS"
    . "$dir/layout.sh"
    if ! sharding_install_plproxy || ! sharding_setup \
        || ! as_postgres "$bindir/createdb" "$split" \
        || ! as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "$split" \
            -v partition=4 -v partitions=8 -f "$dir/shard.sql"; then
        log "setting up the PL/Proxy layout failed"
        echo "FAILED sharding: the PL/Proxy layout could not be set up"
        failed_suites+=(sharding)
        failed=$((failed + 1))
        return 0
    fi
    run_client sharding "$dir" \
        env PGHOST=127.0.0.1 PGPORT="$PGPORT" /usr/bin/python3 -u test_sharding.py \
        --proxy "$SHARDING_PROXY_DB" --shards "$(IFS=,; echo "${SHARDING_SHARD_DBS[*]}")" \
        --split "$split:0"
}

run_sharding
