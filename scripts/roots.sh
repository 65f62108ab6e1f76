# scripts/roots.sh: Debian roots of other distributions, made with
# debootstrap and kept as tar files (sourced by scripts/test.sh through
# scripts/lib.sh's users; needs lib.sh).
#
# PostgreSQL 17 is Debian 13's (trixie), 18 Debian unstable's (sid): their
# binary packages need their own distribution's C library, so on another
# Debian they run in a root of their distribution.  A root is made once
# (debootstrap --variant=minbase, then the packages its recipe names) and
# kept as a tar file in $IDEM_ROOT_CACHE (default /var/cache/idempotency,
# where the package suite keeps its own), named by a hash of its recipe: a
# later run unpacks it in seconds.  Delete the tar file (or the folder) to
# make it again, with the mirror's newer packages.
#
# The Debian mirror is the one this machine's apt uses (its sources files),
# never a name written here: a machine behind a local mirror or a proxy
# makes its roots from there.

IDEM_ROOT_CACHE=${IDEM_ROOT_CACHE:-/var/cache/idempotency}

# idem_apt_mirrors: "ARCHIVE SECURITY", the URIs of the Debian archive and
# of its security archive in this machine's apt sources (one-line .list
# files and deb822 .sources files).  The security archive is the one whose
# suite ends in -security, else the archive's URI with -security appended
# (as Debian's mirrors name it).
idem_apt_mirrors() {
    local files=() f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && files+=("$f")
    done
    [ ${#files[@]} -gt 0 ] || return 1
    awk '
        # deb822: a stanza of Types, URIs, Suites
        FILENAME ~ /\.sources$/ {
            if ($0 ~ /^[ \t]*$/) { flush(); next }
            if (tolower($1) == "types:") { types = $0 }
            if (tolower($1) == "uris:") { uris = $2 }
            if (tolower($1) == "suites:") { suites = ""; for (i = 2; i <= NF; i++) suites = suites " " $i }
            next
        }
        # one line: deb [options] URI SUITE COMPONENTS...
        $1 == "deb" {
            i = 2
            if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            take($i, $(i + 1))
        }
        function flush() {
            if (types ~ /(^|[ \t])deb([ \t]|$)/ && uris != "") {
                n = split(suites, s, " ")
                for (j = 1; j <= n; j++) take(uris, s[j])
            }
            types = uris = suites = ""
        }
        function take(uri, suite) {
            sub(/\/$/, "", uri)
            if (suite ~ /-security$/) { if (sec == "") sec = uri }
            else if (suite ~ /^(oldstable|stable|testing|unstable|sid|bookworm|trixie|forky|duke)(-updates)?$/) {
                if (main == "") main = uri
            }
        }
        END {
            flush()
            if (main == "") exit 1
            if (sec == "") sec = main "-security"
            print main, sec
        }' "${files[@]}"
}

# idem_root_distribution MAJOR: the Debian suite whose own PostgreSQL is
# MAJOR (15 Debian 12's, 17 Debian 13's, 18 unstable's).
idem_root_distribution() {
    case $1 in
        15) echo bookworm ;;
        17) echo trixie ;;
        18) echo sid ;;
        *) return 1 ;;
    esac
}

# idem_root_sources SUITE...: the apt sources of a root, one-line format,
# from the host's mirror: each stable suite with its -updates and
# -security, unstable alone.
idem_root_sources() {
    local mirrors main sec s
    mirrors=$(idem_apt_mirrors) || { log "no Debian archive in this machine's apt sources"; return 1; }
    main=${mirrors% *}
    sec=${mirrors#* }
    for s in "$@"; do
        case $s in
            sid | unstable) echo "deb $main sid main" ;;
            *) echo "deb $main $s main"
               echo "deb $main $s-updates main"
               echo "deb $sec $s-security main" ;;
        esac
    done
}

# idem_root_mount ROOT / idem_root_umount ROOT: /proc and a /dev/shm for
# the servers of the root.
idem_root_mount() {
    mkdir -p "$1/proc" "$1/dev/shm"
    mountpoint -q "$1/proc" || mount -t proc proc "$1/proc"
    mountpoint -q "$1/dev/shm" || mount -t tmpfs -o mode=1777,size=256m tmpfs "$1/dev/shm"
}
idem_root_umount() {
    local m
    for m in "$1/dev/shm" "$1/proc"; do
        if mountpoint -q "$m"; then umount "$m" || umount -l "$m"; fi
    done
}

# idem_in_root ROOT COMMAND...: COMMAND in the root, as root, with an
# environment of its own (none of the caller's PGHOST, PGPORT or TMPDIR).
idem_in_root() {
    local r=$1
    shift
    chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive "$@"
}

# idem_root_tar NAME SUITE "SOURCE SUITES" "PACKAGES" [BASE]: the path of
# the cached root NAME of Debian SUITE, with the apt sources of SOURCE
# SUITES (SUITE first) and PACKAGES (apt-get install
# --no-install-recommends; NAME/SUITE picks a suite's version) installed;
# made when it is missing, from the cached root BASE (a tar file) when it
# is given, else with debootstrap.
# Its services never start (policy-rc.d), postgresql-common makes no
# cluster main, apt does not check a Release file's Valid-Until date (the
# mirror may serve a dated snapshot: the signatures are still checked).
# What went wrong is printed, and the log kept as $IDEM_ROOT_CACHE/NAME.log.
idem_root_tar() {
    local name=$1 suite=$2 sources=$3 packages=$4 base=${5:-} recipe tar root status=0 mirrors
    mirrors=$(idem_apt_mirrors) || { log "no Debian archive in this machine's apt sources"; return 1; }
    recipe="${base:+from ${base##*/}; }debootstrap --variant=minbase $suite ${mirrors% *}
sources: $(idem_root_sources $sources | tr '\n' ';')
policy-rc.d: exit 101; createcluster.d: create_main_cluster = false; Check-Valid-Until false
apt-get install --no-install-recommends $packages"
    tar=$IDEM_ROOT_CACHE/$name-$(echo "$recipe" | sha256sum | cut -c1-16).tar
    if [ -s "$tar" ]; then
        echo "$tar"
        return 0
    fi
    install_packages debootstrap >&2 || return 1
    mkdir -p "$IDEM_ROOT_CACHE"
    root=$(mktemp -d "$IDEM_ROOT_CACHE/root.XXXXXX")
    chmod 755 "$root"    # the root folder of the system, that every user crosses
    log "making the root $name of Debian $suite in $root${base:+ from ${base##*/}} (once; cached as $tar)"
    (
        trap 'idem_root_umount "$root"; rm -rf --one-file-system "$root"' EXIT
        trap 'exit 1' INT TERM HUP
        if [ -n "$base" ]; then
            tar -C "$root" -xpf "$base" >"$root.log" 2>&1 || exit 1
        else
            debootstrap --variant=minbase "$suite" "$root" "${mirrors% *}" >"$root.log" 2>&1 || exit 1
        fi
        idem_root_sources $sources >"$root/etc/apt/sources.list"
        echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99idempotency-valid-until"
        printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
        chmod 755 "$root/usr/sbin/policy-rc.d"
        # no cluster N/main from the server's install: the suites make their
        # own; the rest of Debian's createcluster.conf stays as shipped
        mkdir -p "$root/etc/postgresql-common/createcluster.d"
        echo 'create_main_cluster = false' >"$root/etc/postgresql-common/createcluster.d/no-main-cluster.conf"
        cp /etc/resolv.conf "$root/etc/resolv.conf"
        idem_root_mount "$root"
        idem_in_root "$root" apt-get update -qq >>"$root.log" 2>&1 \
            && idem_in_root "$root" \
                apt-get install -y -qq --no-install-recommends $packages >>"$root.log" 2>&1 \
            || exit 1
        idem_in_root "$root" apt-get clean
        idem_root_umount "$root"
        tar -C "$root" -cf "$tar.part" . && mv "$tar.part" "$tar"
    ) >&2 || status=$?
    if [ "$status" -ne 0 ]; then
        grep -E -B 3 -A 12 '^(E:|dpkg: error|W: Failure)' "$root.log" | tail -n 60 >&2
        mv "$root.log" "$IDEM_ROOT_CACHE/$name.log"
        log "making the root $name failed: $IDEM_ROOT_CACHE/$name.log"
        return 1
    fi
    rm -f "$root.log"
    echo "$tar"
}

# idem_root_unpack TAR DIR: a fresh root in DIR from the cached TAR, /proc
# and /dev/shm mounted, the host's resolv.conf and hosts.
idem_root_unpack() {
    mkdir -p "$2"
    tar -C "$2" -xpf "$1" || return 1
    chmod 755 "$2"
    idem_root_mount "$2"
    cp /etc/resolv.conf /etc/hosts "$2/etc/"
}

# idem_root_remove DIR: stop what runs in the root (a server the tests
# left), undo its mounts and remove it; a root still mounted is left.
idem_root_remove() {
    local p
    [ -d "$1" ] || return 0
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$1" ] && kill -KILL "${p#/proc/}" 2>/dev/null
    done
    idem_root_umount "$1" 2>/dev/null || true
    if mountpoint -q "$1/proc" || mountpoint -q "$1/dev/shm"; then
        log "$1 is still mounted, left in place"
        return 1
    fi
    rm -rf --one-file-system "$1"
}

# The test roots: PostgreSQL MAJOR from its distribution's packages, with
# what scripts/test.sh's regress, isolation and TAP suites need (gdb: for
# t/023_lock_timeout_race.pl), and the
# PostgreSQL before it (from the distribution before, whose packages the
# newer one installs) for t/030_pg_upgrade.pl: Debian 12's 15 in the
# Debian 13 root of 17, Debian 13's 17 in the unstable root of 18.
idem_test_root_old() {
    case $1 in
        17) echo 15 ;;
        18) echo 17 ;;
    esac
}
idem_test_root_tar() {
    local major=$1 suite old oldsuite sources packages base
    suite=$(idem_root_distribution "$major") || { log "no Debian suite carries PostgreSQL $major"; return 1; }
    # from the package suite's root of the same distribution
    base=$(idem_package_root_tar "$major") || return 1
    sources=$suite
    packages="make gcc libc6-dev libssl-dev libipc-run-perl python3 python3-psycopg2 postgresql-contrib gdb
        postgresql-$major-cron
        postgresql-$major postgresql-server-dev-$major"
    old=$(idem_test_root_old "$major")
    if [ -n "$old" ]; then
        oldsuite=$(idem_root_distribution "$old")
        sources="$sources $oldsuite"
        packages="$packages postgresql-$old/$oldsuite postgresql-server-dev-$old/$oldsuite"
    fi
    idem_root_tar "test-$suite-postgresql-$major" "$suite" "$sources" "$(echo $packages)" "$base"
}

# The package suite's roots (scripts/suite_package.sh): a brand-new Debian
# of the distribution whose own PostgreSQL is MAJOR, with what the README's
# "Install the package" lines install (they run there as written), and
# nothing of ours.
IDEM_PACKAGE_ROOT_PACKAGES="postgresql build-essential debhelper postgresql-server-dev-all libssl-dev"
idem_package_root_tar() {
    local suite
    suite=$(idem_root_distribution "$1") || { log "no Debian suite carries PostgreSQL $1"; return 1; }
    idem_root_tar "package-$suite-postgresql-$1" "$suite" "$suite" "$IDEM_PACKAGE_ROOT_PACKAGES"
}

# idem_run_in_root MAJOR LABEL SUITES...: scripts/test.sh's SUITES against
# PostgreSQL MAJOR in a fresh test root (under $IDEM_TMP), holding a copy
# of the tree, as root there (the tests run as the postgres user of the
# root); the extension is built and installed there for MAJOR and for the
# PostgreSQL before it, which t/030_pg_upgrade.pl upgrades from.  Its
# output ends with "LABEL tests: N passed, N failed".  The root is
# removed afterwards, whatever happens.
idem_run_in_root() {
    local major=$1 label=$2 tar dir old status=0
    shift 2
    dir=$IDEM_TMP/root-$major
    tar=$(idem_test_root_tar "$major") || return 1
    (
        trap 'idem_root_remove "$dir"' EXIT
        trap 'exit 1' INT TERM HUP
        idem_root_unpack "$tar" "$dir" || exit 1
        mkdir -p "$dir/src"
        tar -C "$IDEM_ROOT" --exclude-vcs --exclude=./build-deb --exclude='./build-[0-9]*' \
            --exclude='*.o' --exclude='*.so' --exclude='*.bc' --exclude=.built-with \
            --exclude=results --exclude=output_iso --exclude=tmp_check --exclude=node_modules \
            --exclude=__pycache__ -cf - . | tar -C "$dir/src" -xf -
        old=$(idem_test_root_old "$major")
        # the tests' selection and settings, as a run on this machine has them
        local envs=() v
        for v in REGRESS ISOLATION PROVE_TESTS IDEM_INVARIANT_SECONDS IDEM_FUZZ_CASES IDEM_FUZZ_SEED KEEP_TMP; do
            [ -n "${!v:-}" ] && envs+=("$v=${!v}")
        done
        idem_in_root "$dir" env "${envs[@]}" bash -c '
            set -e
            cd /src
            if [ -n "$0" ]; then
                # the PostgreSQL that t/030_pg_upgrade.pl upgrades from, with the extension
                make -s PG_CONFIG=/usr/lib/postgresql/$0/bin/pg_config with_llvm=no IDEM_TEST_PAUSE=1 >/dev/null
                make -s PG_CONFIG=/usr/lib/postgresql/$0/bin/pg_config with_llvm=no IDEM_TEST_PAUSE=1 install >/dev/null
                make -s PG_CONFIG=/usr/lib/postgresql/$0/bin/pg_config clean >/dev/null
                export IDEM_UPGRADE_FROM=/usr/lib/postgresql/$0
            fi
            exec env PG_VERSIONS="$1" IDEM_RUN_LABEL="$2" bash scripts/test.sh "${@:3}"' \
            "$old" "$major" "$label" "$@" </dev/null
    ) || status=$?
    return "$status"
}
