# scripts/suite_package.sh: the suite "package" of scripts/test.sh (sourced
# by it).
#
# In a fresh Debian 12 root made with debootstrap under the suite's
# temporary folder, runs the README's "Install the package" lines as
# written, as root (the minimal root has no sudo: `sudo` there runs the
# command itself): they build the package with `make deb` from a copy of
# the tree and install it with `dpkg -i` next to Debian's postgresql-15.
# Then it creates a cluster with Debian's tools (pg_createcluster, owned by
# the postgres OS user, on a free port, the library preloaded), and checks
# the package's version, CREATE EXTENSION and claims there.  The cluster is
# stopped, the root's mounts undone and the root removed whatever happens.
#
# The debootstrapped root, with postgresql-15 and the build tools the README
# names, is kept as a tar file in /var/cache/idempotency/, named by a hash of
# how it is made and of the postgresql-15 version apt offers, so that later
# runs unpack it in seconds; delete the folder to make it again.

IDEM_DEB_CACHE=/var/cache/idempotency
IDEM_DEB_MIRROR=http://deb.debian.org/debian
IDEM_DEB_SECURITY=http://deb.debian.org/debian-security
IDEM_DEB_BASE_PACKAGES="postgresql-15 build-essential debhelper postgresql-server-dev-all libssl-dev"

# The recipe of the cached root: changing it changes the cache's name.
pkg_base_recipe() {
    cat <<EOF
debootstrap --variant=minbase bookworm $IDEM_DEB_MIRROR
sources: bookworm bookworm-updates main $IDEM_DEB_MIRROR; bookworm-security main $IDEM_DEB_SECURITY
policy-rc.d: exit 101; createcluster.d/no-main-cluster.conf: create_main_cluster = false
apt-get install --no-install-recommends $IDEM_DEB_BASE_PACKAGES $(apt-cache policy postgresql-15 2>/dev/null | sed -n 's/^ *Candidate: //p')
EOF
}

# pkg_readme_sh HEADING: the sh blocks of the README's section HEADING (to
# the next heading), as written, their list indentation removed.
pkg_readme_sh() {
    awk -v h="$1" '
        /^ *```/ { fence = !fence; if (insec) { sh = fence && $0 ~ /```sh$/; if (fence) { ind = index($0, "`") - 1 } } next }
        !fence && /^#+ / { insec = (substr($0, index($0, " ") + 1) == h); next }
        insec && sh { print substr($0, ind + 1) }' "$IDEM_ROOT/README.md"
}

# in_root ROOT COMMAND...: COMMAND in the root, as root, with an environment
# of its own (none of the tests' PGHOST, PGPORT or TMPDIR).
in_root() {
    local r=$1
    shift
    chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive "$@"
}

# pkg_mount ROOT / pkg_umount ROOT: /proc and a /dev/shm for the server.
pkg_mount() {
    mkdir -p "$1/proc" "$1/dev/shm"
    mountpoint -q "$1/proc" || mount -t proc proc "$1/proc"
    mountpoint -q "$1/dev/shm" || mount -t tmpfs -o mode=1777,size=256m tmpfs "$1/dev/shm"
}
pkg_umount() {
    local m
    for m in "$1/dev/shm" "$1/proc"; do
        if mountpoint -q "$m"; then umount "$m" || umount -l "$m"; fi
    done
}

# pkg_base TARFILE: make the cached root (as root).
pkg_base() {
    local tar=$1 root
    root=$(mktemp -d "$IDEM_DEB_CACHE/root.XXXXXX")
    chmod 755 "$root"    # the root folder of the system, that every user crosses
    log "package: debootstrap of Debian 12 into $root (once; cached as $tar)"
    (
        trap 'pkg_umount "$root"; rm -rf --one-file-system "$root"' EXIT
        trap 'exit 1' INT TERM HUP
        debootstrap --variant=minbase bookworm "$root" "$IDEM_DEB_MIRROR" >"$root.log" 2>&1 \
            || exit 1
        cat >"$root/etc/apt/sources.list" <<EOF
deb $IDEM_DEB_MIRROR bookworm main
deb $IDEM_DEB_MIRROR bookworm-updates main
deb $IDEM_DEB_SECURITY bookworm-security main
EOF
        printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
        chmod 755 "$root/usr/sbin/policy-rc.d"
        # no cluster 15/main from the package's install: the suite makes its
        # own; the rest of Debian's createcluster.conf stays as shipped
        mkdir -p "$root/etc/postgresql-common/createcluster.d"
        echo 'create_main_cluster = false' >"$root/etc/postgresql-common/createcluster.d/no-main-cluster.conf"
        cp /etc/resolv.conf "$root/etc/resolv.conf"
        pkg_mount "$root"
        in_root "$root" apt-get update -qq >>"$root.log" 2>&1 \
            && in_root "$root" \
                apt-get install -y -qq --no-install-recommends $IDEM_DEB_BASE_PACKAGES >>"$root.log" 2>&1 \
            || exit 1
        in_root "$root" apt-get clean
        pkg_umount "$root"
        tar -C "$root" -cf "$tar.part" . && mv "$tar.part" "$tar"
    )
    local status=$?
    if [ "$status" -ne 0 ]; then
        # what failed, and the log kept with the suite's results
        grep -E -B 3 -A 12 '^(E:|dpkg: error|W: Failure)' "$root.log" | tail -n 60
        mv "$root.log" "$IDEM_TMP/package-base.log"
    fi
    rm -f "$root.log" "$tar.part"
    return $status
}

# The suite, in a subshell whose EXIT trap stops and removes what it made.
run_package_suite() {
    local start=$SECONDS status=0
    log "suite: package"
    (
        dir=$IDEM_TMP/package
        root=$dir/root
        port=
        fail() { echo "package: $*"; exit 1; }
        stop_all() {
            local pid
            if [ -n "$port" ] && [ -x "$root/usr/bin/pg_ctlcluster" ]; then
                in_root "$root" pg_ctlcluster 15 main stop -m fast >/dev/null 2>&1 \
                    || in_root "$root" pg_ctlcluster 15 main stop -m immediate >/dev/null 2>&1 || true
                # a server that would not stop: the postmaster the suite started
                pid=$(head -n 1 "$root/var/lib/postgresql/15/main/postmaster.pid" 2>/dev/null) || true
                if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/root")" = "$root" ]; then
                    kill -KILL "$pid" 2>/dev/null || true
                fi
            fi
            pkg_umount "$root" 2>/dev/null || true
            if mountpoint -q "$root/proc" || mountpoint -q "$root/dev/shm"; then
                echo "package: $root is still mounted, left in place"
            else
                rm -rf --one-file-system "$root"
            fi
        }
        trap stop_all EXIT
        trap 'exit 1' INT TERM HUP

        install_packages debootstrap || fail "installing debootstrap failed"

        # 1. a fresh Debian 12 root, from the cache
        mkdir -p "$IDEM_DEB_CACHE"
        base=$IDEM_DEB_CACHE/bookworm-postgresql-15-$(pkg_base_recipe | sha256sum | cut -c1-16).tar
        [ -s "$base" ] || pkg_base "$base" || fail "making the Debian 12 root failed"
        mkdir -p "$root"
        tar -C "$root" -xpf "$base" || fail "unpacking $base failed"
        chmod 755 "$root"
        pkg_mount "$root"
        cp /etc/resolv.conf /etc/hosts "$root/etc/"
        echo "package: a fresh Debian 12 root in $((SECONDS - start)) s"

        # 2. the README's lines, in a copy of the tree, as root
        mkdir -p "$root/root/idempotency"
        tar -C "$IDEM_ROOT" --exclude-vcs --exclude=./build-deb --exclude='*.o' --exclude='*.so' \
            --exclude='*.bc' --exclude=node_modules -cf - . | tar -C "$root/root/idempotency" -xf -
        {
            echo 'sudo() { "$@"; }'
            pkg_readme_sh "Install the package"
        } >"$root/root/install.sh"
        grep -q '^make deb' "$root/root/install.sh" && grep -q 'dpkg -i' "$root/root/install.sh" \
            || fail "no make deb and dpkg -i in the README's \"Install the package\""
        in_root "$root" bash -euxc 'cd /root/idempotency && . /root/install.sh' </dev/null >"$dir/install.log" 2>&1 \
            || { tail -n 40 "$dir/install.log"; fail "the README's install lines failed"; }
        echo "package: the README's lines built and installed the package in $((SECONDS - start)) s"
        # the version of debian/changelog, and the control file's default_version
        version=$(sed -nE '1s/^[^ ]+ \(([^)]+)\).*/\1/p' "$IDEM_ROOT/debian/changelog")
        extversion=$(sed -nE "s/^default_version = '(.*)'$/\1/p" "$IDEM_ROOT/idempotency.control")
        v=$(in_root "$root" dpkg-query -W -f='${Version} ${Status}' postgresql-15-idempotency)
        [ "$v" = "$version install ok installed" ] \
            || fail "dpkg-query postgresql-15-idempotency: '$v'"
        echo "package: dpkg-query postgresql-15-idempotency: $v"

        # 3. the cluster 15/main, made with Debian's tools (its package made
        #    none here), on a free port, with another library preloaded; then
        #    the README's steps 2 to 5 as written, as root: `sudo -u postgres`
        #    is runuser, createuser reads app's password from its input
        port=$(free_port) || fail "no free port"
        in_root "$root" pg_createcluster 15 main -p "$port" \
            -o shared_preload_libraries=pg_stat_statements >"$dir/cluster.log" 2>&1 \
            && in_root "$root" pg_ctlcluster 15 main start >>"$dir/cluster.log" 2>&1 \
            || { cat "$dir/cluster.log" "$root"/var/log/postgresql/*.log 2>/dev/null; fail "the cluster did not start"; }
        echo "package: cluster 15/main started on port $port, preloading pg_stat_statements"
        {
            echo 'sudo() { if [ "$1" = -u ]; then local u=$2; shift 2; runuser -u "$u" -- "$@"; else "$@"; fi; }'
            pkg_readme_sh "Preload the library, create the extension"
        } >"$root/root/steps.sh"
        # (setsid: no terminal, where createuser would ask instead)
        printf 'app-password\napp-password\n' | setsid -w chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            PGPORT="$port" PGPASSWORD=app-password bash -euxc 'cd /tmp && . /root/steps.sh' >"$dir/steps.log" 2>&1 \
            || { tail -n 40 "$dir/steps.log"; fail "the README's steps 2 to 5 failed"; }
        psql_in() {
            in_root "$root" runuser -u postgres -- psql -X -q -At -v ON_ERROR_STOP=1 -p "$port" "$@"
        }
        got=$(psql_in -d appdb -c 'SHOW shared_preload_libraries' -c 'SHOW idempotency.database' \
            -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'" 2>&1 | tr '\n' '|')
        want="pg_stat_statements, idempotency|appdb|$extversion|"
        [ "$got" = "$want" ] || { cat "$dir/steps.log"; fail "after the README's steps: got '$got', expected '$want'"; }
        echo "package: the README's steps kept pg_stat_statements, preloaded idempotency, made appdb with the extension $extversion"

        # 4. claims as app, over TCP with its password, as in step 5
        got=$(in_root "$root" env PGPASSWORD=app-password psql -X -q -At -v ON_ERROR_STOP=1 \
            -h localhost -p "$port" -U app -d appdb \
            -c "SELECT outcome FROM idem_claim('package.check', 'k-1', '{\"amount\": 1}')" \
            -c "SELECT 'completed' FROM idem_claim('package.check', 'k-2', '{}') c, idem_complete(c.token, 201, '{}')" \
            -c "SELECT outcome || ' ' || http_status FROM idem_claim('package.check', 'k-2', '{}')" 2>&1 | tr '\n' '|')
        want="proceed|completed|replay 201|"
        [ "$got" = "$want" ] || fail "as app in appdb: got '$got', expected '$want'"
        echo "package: as app over TCP: proceed, then replay 201"

        # 5. the worker serves appdb: a cycle ends there within a minute
        #    (idempotency.naptime is 10 s)
        end=$((SECONDS + 60))
        until [ "$(psql_in -d appdb -c 'SELECT count(*) FROM idem_worker_status() WHERE database = '"'appdb'"' AND cycles > 0' 2>/dev/null)" = 1 ]; do
            [ "$SECONDS" -lt "$end" ] || fail "no worker cycle in appdb after 60 s"
            sleep 0.5
        done
        echo "package: the worker ran a cycle in appdb"
    ) || status=$?
    if [ "$status" -eq 0 ]; then
        echo "package ... ok ($((SECONDS - start)) s)"
        passed=$((passed + 1))
    else
        echo "package ... FAILED ($((SECONDS - start)) s)"
        failed_suites+=(package)
        failed=$((failed + 1))
    fi
}
