# scripts/suite_package.sh: the suite "package" of scripts/test.sh (sourced
# by it, after scripts/roots.sh).
#
# For each of PostgreSQL 15, 17 and 18 (IDEM_PACKAGE_VERSIONS), in a fresh
# root of the Debian whose own PostgreSQL it is (15 Debian 12's, 17 Debian
# 13's, 18 unstable's), made with debootstrap under the suite's temporary
# folder, runs the README's "Install the package" lines as written, as
# root (the minimal root has no sudo: `sudo` there runs the command
# itself): they build the package with `make deb` from a copy of the tree
# and install it with `dpkg -i` next to Debian's PostgreSQL.  Then it
# creates a cluster with Debian's tools (pg_createcluster, owned by the
# postgres OS user, on a free port, another library preloaded), runs the
# README's steps 2 to 5 as written, and checks the package's version,
# CREATE EXTENSION, claims and the worker there.  The cluster is stopped,
# the root's mounts undone and the root removed whatever happens.
#
# The debootstrapped roots, with Debian's PostgreSQL and the build tools
# the README names, are kept as tar files in /var/cache/idempotency/
# (scripts/roots.sh), so that later runs unpack them in seconds; delete the
# folder to make them again.

IDEM_PACKAGE_VERSIONS=${IDEM_PACKAGE_VERSIONS:-15 17 18}

# pkg_readme_sh HEADING: the sh blocks of the README's section HEADING (to
# the next heading), as written, their list indentation removed.
pkg_readme_sh() {
    awk -v h="$1" '
        /^ *```/ { fence = !fence; if (insec) { sh = fence && $0 ~ /```sh$/; if (fence) { ind = index($0, "`") - 1 } } next }
        !fence && /^#+ / { insec = (substr($0, index($0, " ") + 1) == h); next }
        insec && sh { print substr($0, ind + 1) }' "$IDEM_ROOT/README.md"
}

# The suite: each version's part in a subshell whose EXIT trap stops and
# removes what it made.
run_package_suite() {
    local major
    for major in $IDEM_PACKAGE_VERSIONS; do
        run_package_version "$major"
    done
}

# run_package_version MAJOR: the package of PostgreSQL MAJOR in a fresh
# root of its distribution.
run_package_version() {
    local start=$SECONDS status=0 major=$1 name distro
    name="package (PostgreSQL $1)"
    distro=$(idem_root_distribution "$major")
    case $distro in
        bookworm) distro="Debian 12" ;;
        trixie) distro="Debian 13" ;;
        sid) distro="Debian unstable" ;;
    esac
    log "suite: $name"
    (
        dir=$IDEM_TMP/package-$major
        root=$dir/root
        port=
        fail() { echo "package $major: $*"; exit 1; }
        stop_all() {
            local pid
            if [ -n "$port" ] && [ -x "$root/usr/bin/pg_ctlcluster" ]; then
                idem_in_root "$root" pg_ctlcluster "$major" main stop -m fast >/dev/null 2>&1 \
                    || idem_in_root "$root" pg_ctlcluster "$major" main stop -m immediate >/dev/null 2>&1 || true
                # a server that would not stop: the postmaster the suite started
                pid=$(head -n 1 "$root/var/lib/postgresql/$major/main/postmaster.pid" 2>/dev/null) || true
                if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/root")" = "$root" ]; then
                    kill -KILL "$pid" 2>/dev/null || true
                fi
            fi
            idem_root_remove "$root" || echo "package $major: $root is still mounted, left in place"
        }
        trap stop_all EXIT
        trap 'exit 1' INT TERM HUP

        # 1. a fresh root of the distribution, from the cache
        mkdir -p "$dir"
        base=$(idem_package_root_tar "$major") || fail "making the $distro root failed"
        idem_root_unpack "$base" "$root" || fail "unpacking $base failed"
        echo "package $major: a fresh $distro root in $((SECONDS - start)) s"

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
        idem_in_root "$root" bash -euxc 'cd /root/idempotency && . /root/install.sh' </dev/null >"$dir/install.log" 2>&1 \
            || { tail -n 40 "$dir/install.log"; fail "the README's install lines failed"; }
        echo "package $major: the README's lines built and installed the package in $((SECONDS - start)) s"
        # the version scripts/deb_version.sh gives the tree (a copy without
        # .git: no commit in it), and the control file's default_version
        version=$(bash "$IDEM_ROOT/scripts/deb_version.sh" "$root/root/idempotency")
        extversion=$(sed -nE "s/^default_version = '(.*)'$/\1/p" "$IDEM_ROOT/idempotency.control")
        v=$(idem_in_root "$root" dpkg-query -W -f='${Version} ${Status}' "postgresql-$major-idempotency")
        [ "$v" = "$version install ok installed" ] \
            || fail "dpkg-query postgresql-$major-idempotency: '$v', expected '$version install ok installed'"
        echo "package $major: dpkg-query postgresql-$major-idempotency: $v"
        # one package (and its debug symbols), of this distribution's PostgreSQL
        v=$(cd "$root/root/idempotency/build-deb" && ls -- *.deb | grep -v -- '-dbgsym_' | tr '\n' ' ')
        [ "$v" = "postgresql-$major-idempotency_${version}_amd64.deb " ] \
            || fail "make deb built '$v', expected postgresql-$major-idempotency_${version}_amd64.deb alone"

        # 3. the cluster MAJOR/main, made with Debian's tools (its package made
        #    none here), on a free port, with another library preloaded; then
        #    the README's steps 2 to 5 as written, as root: `sudo -u postgres`
        #    is runuser, createuser reads app's password from its input
        port=$(free_port) || fail "no free port"
        idem_in_root "$root" pg_createcluster "$major" main -p "$port" \
            -o shared_preload_libraries=pg_stat_statements >"$dir/cluster.log" 2>&1 \
            && idem_in_root "$root" pg_ctlcluster "$major" main start >>"$dir/cluster.log" 2>&1 \
            || { cat "$dir/cluster.log" "$root"/var/log/postgresql/*.log 2>/dev/null; fail "the cluster did not start"; }
        echo "package $major: cluster $major/main started on port $port, preloading pg_stat_statements"
        {
            echo 'sudo() { if [ "$1" = -u ]; then local u=$2; shift 2; runuser -u "$u" -- "$@"; else "$@"; fi; }'
            pkg_readme_sh "Preload the library, create the extension"
        } >"$root/root/steps.sh"
        # (setsid: no terminal, where createuser would ask instead)
        printf 'app-password\napp-password\n' | setsid -w chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            PGPORT="$port" PGPASSWORD=app-password bash -euxc 'cd /tmp && . /root/steps.sh' >"$dir/steps.log" 2>&1 \
            || { tail -n 40 "$dir/steps.log"; fail "the README's steps 2 to 5 failed"; }
        psql_in() {
            idem_in_root "$root" runuser -u postgres -- psql -X -q -At -v ON_ERROR_STOP=1 -p "$port" "$@"
        }
        got=$(psql_in -d appdb -c 'SHOW shared_preload_libraries' -c 'SHOW idempotency.database' \
            -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'" 2>&1 | tr '\n' '|')
        want="pg_stat_statements, idempotency|appdb|$extversion|"
        [ "$got" = "$want" ] || { cat "$dir/steps.log"; fail "after the README's steps: got '$got', expected '$want'"; }
        echo "package $major: the README's steps kept pg_stat_statements, preloaded idempotency, made appdb with the extension $extversion"

        # 4. claims as app, over TCP with its password, as in step 5
        got=$(idem_in_root "$root" env PGPASSWORD=app-password psql -X -q -At -v ON_ERROR_STOP=1 \
            -h localhost -p "$port" -U app -d appdb \
            -c "SELECT outcome FROM idem_claim('package.check', 'k-1', '{\"amount\": 1}')" \
            -c "SELECT 'completed' FROM idem_claim('package.check', 'k-2', '{}') c, idem_complete(c.token, 201, '{}')" \
            -c "SELECT outcome || ' ' || http_status FROM idem_claim('package.check', 'k-2', '{}')" 2>&1 | tr '\n' '|')
        want="proceed|completed|replay 201|"
        [ "$got" = "$want" ] || fail "as app in appdb: got '$got', expected '$want'"
        echo "package $major: as app over TCP: proceed, then replay 201"

        # 5. the worker serves appdb: a cycle ends there within a minute
        #    (idempotency.naptime is 10 s)
        end=$((SECONDS + 60))
        until [ "$(psql_in -d appdb -c 'SELECT count(*) FROM idem_worker_status() WHERE database = '"'appdb'"' AND cycles > 0' 2>/dev/null)" = 1 ]; do
            [ "$SECONDS" -lt "$end" ] || fail "no worker cycle in appdb after 60 s"
            sleep 0.5
        done
        echo "package $major: the worker ran a cycle in appdb"
    ) || status=$?
    if [ "$status" -eq 0 ]; then
        echo "$name, $distro ... ok ($((SECONDS - start)) s)"
        passed=$((passed + 1))
    else
        echo "$name, $distro ... FAILED ($((SECONDS - start)) s)"
        failed_suites+=("package-$major")
        failed=$((failed + 1))
    fi
}
