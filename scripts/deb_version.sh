#!/usr/bin/env bash
# scripts/deb_version.sh [TREE]: the Debian version of the package `make deb`
# builds from the source tree TREE (default: this one).
#
# A released tree (CHANGELOG.md's first heading is a version, the control
# file's default_version is that version's) gets the version of
# debian/changelog's first entry: 1.1.0-1, say.  Unreleased work (an
# "## Unreleased" section first in CHANGELOG.md, or a default_version past
# the release's) never carries the last release's number: it gets the next
# version, marked as a development build that sorts before that release and
# after the last one, with the commit when the tree is a git clone:
#   1.2.0~dev+git20261129013300.50f0a46-1   (default_version 1.2 after 1.1.0)
#   1.1.1~dev-1                             (changes after 1.1.0, same SQL version;
#                                            no git: a tree without .git)
set -euo pipefail
tree=${1:-$(cd "$(dirname "$0")/.." && pwd)}

released=$(sed -nE '1s/^[^ ]+ \(([^)]+)\).*/\1/p' "$tree/debian/changelog")
upstream=${released%-*}
sqlversion=$(sed -nE "s/^default_version = '([0-9.]+)'$/\1/p" "$tree/idempotency.control")
first=$(grep -m 1 '^## ' "$tree/CHANGELOG.md" || true)

if [ "$sqlversion" != "${upstream%.*}" ]; then
    next=$sqlversion.0
elif [ "$first" = "## Unreleased" ]; then
    next=${upstream%.*}.$((${upstream##*.} + 1))
else
    echo "$released"
    exit 0
fi
suffix=
if [ -e "$tree/.git" ] && command -v git >/dev/null 2>&1 \
    && commit=$(TZ=UTC git -C "$tree" log -1 --format='%cd.%h' --date=format-local:%Y%m%d%H%M%S 2>/dev/null) \
    && [ -n "$commit" ]; then
    suffix=+git$commit
fi
echo "$next~dev$suffix-1"
