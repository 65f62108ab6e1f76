#!/usr/bin/env bash
# scripts/build_postgres.sh: build a PostgreSQL major version from the
# source package of Debian's unstable suite, and print the path of its
# pg_config.  Only a fallback: scripts/test.sh runs 17 and 18 from Debian's
# binary packages in a root of their distribution (scripts/roots.sh), and
# calls this only with IDEM_PG_FROM_SOURCE=1, for a version installed
# neither here nor in a root.
#
#   bash scripts/build_postgres.sh 18
#
# The build is kept under $IDEM_PG_CACHE/postgresql-<version> (default
# /var/cache/idempotency), keyed by the full version (18.6, say): a later run
# on the same machine finds it and builds nothing.  It holds the server,
# contrib (pgcrypto), the PGXS files, the TAP test modules and
# pg_isolation_regress, so that the extension's suites run against it as
# against Debian's own packages.
#
# The source is fetched with apt-get through a sources list of its own in a
# temporary folder (the system's apt sources are left as they are), checked
# against the signatures of Debian's archive keyring.
#
# Environment:
#   IDEM_PG_CACHE   where builds are kept (default /var/cache/idempotency)
#   IDEM_PG_MIRROR  the Debian mirror (default: the one of this machine's
#                   apt sources)
#   IDEM_PG_JOBS    make -j (default: the number of processors)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/roots.sh"

major=${1:?usage: build_postgres.sh MAJOR_VERSION}
cache=${IDEM_PG_CACHE:-/var/cache/idempotency}
mirror=${IDEM_PG_MIRROR:-$(idem_apt_mirrors | cut -d' ' -f1)}
[ -n "$mirror" ] || { echo "build_postgres.sh: no Debian archive in this machine's apt sources; set IDEM_PG_MIRROR" >&2; exit 1; }
jobs=${IDEM_PG_JOBS:-$(nproc)}

# A finished build has its pg_config and the mark written last.
found=$(cached_postgres "$major")
if [ -n "$found" ]; then
    echo "$found"
    exit 0
fi

install_packages make gcc libc6-dev libssl-dev zlib1g-dev bison flex perl \
    libipc-run-perl bzip2 xz-utils gpgv

work=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-pg.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/cache" "$work/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror unstable main" \
    >"$work/sources.list"
# (lists and caches in the temporary folder too: nothing of the system's
# apt state is written, and a user with sudo runs it as well as root)
# A mirror that serves a dated snapshot of unstable serves a Release file
# past its Valid-Until: the signature and the checksums are still checked.
apt_private=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
    -o "Dir::Cache::archives=$work/archives" -o "APT::Sandbox::User=$(id -un)"
    -o "Acquire::Check-Valid-Until=false")

log "fetching the source of postgresql-$major from Debian unstable"
apt-get "${apt_private[@]}" -qq update >&2
(cd "$work/src" && apt-get "${apt_private[@]}" -qq --download-only source "postgresql-$major" >&2)
tarball=$(ls "$work/src"/postgresql-"$major"_*.orig.tar.* | head -n 1)
version=$(basename "$tarball" | sed -E 's/^postgresql-[0-9]+_([^.]+\.[^.]+)\.orig\..*$/\1/')
prefix=$cache/postgresql-$version
log "building PostgreSQL $version into $prefix (several minutes)"

tar -C "$work/src" -xf "$tarball"
srcdir=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name "postgresql-$major*" | head -n 1)
cd "$srcdir"
# The TAP modules (PostgreSQL::Test::Cluster) and pg_isolation_regress
# are what PGXS's prove_installcheck and installcheck use.
./configure --prefix="$prefix" --with-openssl --without-icu --without-readline \
    --enable-tap-tests >"$work/configure.log" 2>&1 \
    || { tail -n 40 "$work/configure.log" >&2; exit 1; }
as_root rm -rf "$prefix"
as_root install -d -o "$(id -u)" -g "$(id -g)" "$prefix"
for dir in . contrib src/test/isolation src/test/perl; do
    make -s -j"$jobs" -C "$dir" >"$work/make.log" 2>&1 \
        || { tail -n 40 "$work/make.log" >&2; exit 1; }
    make -s -C "$dir" install >"$work/install.log" 2>&1 \
        || { tail -n 40 "$work/install.log" >&2; exit 1; }
done
echo "$version" >"$prefix/.idempotency-built"
log "built PostgreSQL $version"
echo "$prefix/bin/pg_config"
