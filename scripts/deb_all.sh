#!/usr/bin/env bash
# scripts/deb_all.sh [MAJOR...]: the Debian package of each PostgreSQL
# major version (default: 15 17 18), each built by `make deb` in a fresh
# root of the distribution whose own PostgreSQL it is (15 Debian 12's, 17
# Debian 13's, 18 Debian unstable's; scripts/roots.sh, the package suite's
# cached roots), from a copy of this tree: the .deb files land in
# build-deb/ here.  As root (debootstrap, chroot).  `make deb-all` runs it.
#
#   postgresql-15-idempotency_<version>_amd64.deb   (Debian 12)
#   postgresql-17-idempotency_<version>_amd64.deb   (Debian 13)
#   postgresql-18-idempotency_<version>_amd64.deb   (Debian unstable)
#
# The version is the tree's (scripts/deb_version.sh, with the commit when
# this tree is a git clone), the same in the three.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/roots.sh"

[ "$(id -u)" -eq 0 ] || { echo "deb_all.sh: run as root (debootstrap and chroot)" >&2; exit 1; }
majors=${*:-15 17 18}
version=$(bash "$IDEM_ROOT/scripts/deb_version.sh" "$IDEM_ROOT")
work=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-deb.XXXXXX")
trap 'for r in "$work"/root-*; do idem_root_remove "$r" || true; done; rm -rf --one-file-system "$work"' EXIT
rm -rf "$IDEM_ROOT/build-deb"
mkdir -p "$IDEM_ROOT/build-deb"
for major in $majors; do
    tar=$(idem_package_root_tar "$major")
    root=$work/root-$major
    idem_root_unpack "$tar" "$root"
    mkdir -p "$root/src"
    tar -C "$IDEM_ROOT" --exclude-vcs --exclude=./build-deb --exclude='./build-[0-9]*' \
        --exclude='*.o' --exclude='*.so' --exclude='*.bc' --exclude=node_modules -cf - . \
        | tar -C "$root/src" -xf -
    # the tree's version, commit included (the copy has no .git)
    log "PostgreSQL $major, in a root of Debian $(idem_root_distribution "$major"): make deb, version $version"
    idem_in_root "$root" bash -c 'cd /src && make deb IDEM_DEB_VERSION="$0"' "$version" \
        >"$work/deb-$major.log" 2>&1 \
        || { tail -n 40 "$work/deb-$major.log"; echo "deb_all.sh: make deb failed for PostgreSQL $major" >&2; exit 1; }
    cp "$root"/src/build-deb/*.deb "$IDEM_ROOT/build-deb/"
    idem_root_remove "$root"
done
ls "$IDEM_ROOT"/build-deb/*.deb
