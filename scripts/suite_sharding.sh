# scripts/suite_sharding.sh: the PL/Proxy layout of examples/sharding,
# end to end.  Sourced by scripts/test.sh (after its other suites, whose
# run_client it uses), in the throwaway cluster it started.
#
# Installs Debian's postgresql-N-plproxy (N the distribution's PostgreSQL) when missing (and copies its files
# into the PostgreSQL of $PG_CONFIG when that is not Debian's own), creates
# four shard databases and a proxy database in the cluster (layout.sh), and
# runs examples/sharding/test_sharding.py against them: concurrent clients
# of many tenants through the proxy, one effect per key, one shard per
# tenant.  A fifth shard database, partition 4 of 8 (the half of partition 0
# that doubling the partitions splits off), receives a tenant moved there.
# The test runs in a process group of its own, which run_client ends
# whatever happens, with a time limit.  Before all that, check_plproxy_copy
# checks how plproxy's files are copied into a tree, on a tree of its own.

# The copy of plproxy's files into a PostgreSQL tree, against a tree of its
# own (a pg_config that names two folders of $IDEM_TMP) holding an older
# plproxy.so: the file is replaced by a complete copy renamed over it, a new
# inode, never rewritten in place, which would change the code under a
# running server of that tree that has it loaded; and no temporary file is
# left beside it.
check_plproxy_copy() {
    local tree=$IDEM_TMP/plproxy-tree so before after left
    rm -rf "$tree"
    mkdir -p "$tree/lib" "$tree/share/extension"
    printf '#!/bin/sh\ncase $1 in --pkglibdir) echo %s/lib ;; --sharedir) echo %s/share ;; --version) echo "PostgreSQL %s" ;; esac\n' \
        "$tree" "$tree" "$IDEM_PG_MAJOR" >"$tree/pg_config"
    chmod 755 "$tree/pg_config"
    echo "an older plproxy.so" >"$tree/lib/plproxy.so"
    before=$(stat -c %i "$tree/lib/plproxy.so")
    so=$(dpkg -L postgresql-$IDEM_PG_MAJOR-plproxy 2>/dev/null | grep '/lib/plproxy\.so$' | head -n 1) || true
    if PG_CONFIG=$tree/pg_config sharding_install_plproxy >/dev/null; then
        after=$(stat -c %i "$tree/lib/plproxy.so")
        left=$(find "$tree/lib" "$tree/share/extension" -name '.*' | wc -l)
        if [ -n "$so" ] && cmp -s "$so" "$tree/lib/plproxy.so" && [ "$before" != "$after" ] \
            && [ -f "$tree/share/extension/plproxy.control" ] && [ "$left" -eq 0 ]; then
            echo "ok     plproxy's files are copied into a tree by renaming a complete copy over the old file"
            passed=$((passed + 1))
            rm -rf "$tree"
            return 0
        fi
    fi
    echo "FAILED plproxy's files are copied into a tree by renaming a complete copy over the old file" \
        "(inode $before -> ${after:-none}, ${left:-?} temporary files left)"
    failed_suites+=(sharding-copy)
    failed=$((failed + 1))
    rm -rf "$tree"
}

run_sharding() {
    local dir=$IDEM_TMP/src/examples/sharding split=idem_shard4 bindir
    bindir=$("$PG_CONFIG" --bindir)
    IDEM_GROUPS=$IDEM_TMP/sharding.groups
    : >"$IDEM_GROUPS"
    . "$dir/layout.sh"
    # the package first: check_plproxy_copy copies its files
    install_packages postgresql-$IDEM_PG_MAJOR-plproxy
    check_plproxy_copy
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
