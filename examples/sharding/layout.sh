# examples/sharding/layout.sh: sets up the PL/Proxy layout of
# docs/scaling.md in a running throwaway cluster.  Sourced, after
# scripts/lib.sh, by scripts/suite_sharding.sh and examples/sharding/bench.sh.
#
# The four shards and the proxy are five databases of one cluster:
# PL/Proxy reaches a shard through a libpq connection string, the same for a
# database of this cluster as for one on another host, and one cluster keeps
# the test quick and light.  What separate servers would add (their own WAL,
# memory and failures) is outside what the layout tests: routing, one
# tenant's records on one shard, tokens going back to their shard.

SHARDING_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHARDING_PROXY_DB=idem_proxy
SHARDING_SHARD_DBS=(idem_shard0 idem_shard1 idem_shard2 idem_shard3)

# Install Debian's postgresql-N-plproxy (N the major version of $PG_CONFIG)
# when missing, and make sure the
# PostgreSQL of $PG_CONFIG has its files: the package installs them into
# the system PostgreSQL's folders, which are $PG_CONFIG's own for Debian's
# server but not for a PostgreSQL installed elsewhere, into which they are
# copied when missing or different.  A file is replaced by a complete copy
# renamed over it, never rewritten in place: a running server of that tree
# may have the old plproxy.so loaded, and a second run copying at the same
# time sees the old file or the new one, never half of it.
sharding_install_plproxy() {
    local pkglibdir extdir f dest tmp package
    package=postgresql-$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')-plproxy
    install_packages "$package" || return
    pkglibdir=$("$PG_CONFIG" --pkglibdir)
    extdir=$("$PG_CONFIG" --sharedir)/extension
    for f in $(dpkg -L "$package"); do
        case $f in
            */lib/plproxy.so) dest=$pkglibdir ;;
            */extension/plproxy*) dest=$extdir ;;
            *) continue ;;
        esac
        [ -f "$f" ] || continue
        if ! cmp -s "$f" "$dest/${f##*/}"; then
            log "copying ${f##*/} into $dest"
            tmp=$(as_root mktemp "$dest/.${f##*/}.XXXXXX") || return
            if ! as_root install -m 644 "$f" "$tmp" || ! as_root mv -f "$tmp" "$dest/${f##*/}"; then
                as_root rm -f "$tmp"
                return 1
            fi
        fi
    done
}

# Create the shard and proxy databases in the cluster of $PGHOST:$PGPORT
# and run shard.sql and proxy.sql in them.  The proxy reaches the shards
# over TCP on 127.0.0.1.
sharding_setup() {
    local bindir i
    bindir=$("$PG_CONFIG" --bindir)
    for i in "${!SHARDING_SHARD_DBS[@]}"; do
        as_postgres "$bindir/createdb" "${SHARDING_SHARD_DBS[$i]}" || return
        as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "${SHARDING_SHARD_DBS[$i]}" \
            -v partition="$i" -v partitions="${#SHARDING_SHARD_DBS[@]}" \
            -f "$SHARDING_DIR/shard.sql" || return
    done
    as_postgres "$bindir/createdb" "$SHARDING_PROXY_DB" || return
    as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d "$SHARDING_PROXY_DB" \
        -v p0="host=127.0.0.1 port=$PGPORT dbname=${SHARDING_SHARD_DBS[0]}" \
        -v p1="host=127.0.0.1 port=$PGPORT dbname=${SHARDING_SHARD_DBS[1]}" \
        -v p2="host=127.0.0.1 port=$PGPORT dbname=${SHARDING_SHARD_DBS[2]}" \
        -v p3="host=127.0.0.1 port=$PGPORT dbname=${SHARDING_SHARD_DBS[3]}" \
        -f "$SHARDING_DIR/proxy.sql" || return
}
