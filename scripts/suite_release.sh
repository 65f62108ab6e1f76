# scripts/suite_release.sh: the suite "release" of scripts/test.sh (sourced
# by it).  Reads files only.
#
# The released version is the same everywhere a user or a packager reads
# it: the first dated heading of CHANGELOG.md (an "## Unreleased" section
# may come before it, and the control file's default_version be the next
# SQL version then), META.json, the control
# file's default_version, debian/changelog, the README (its version line and
# the package's file name), and one licence, the PostgreSQL Licence, in
# LICENSE and every manifest.  The SQL scripts of released versions never
# change: their SHA-256 is recorded here when they are released.

# The SQL scripts of released versions.
IDEM_RELEASED_SQL="
c8a1ecf7c8ad078401d47528904e5c1d12a65258b722daf38258c0637b8b69a4  idempotency--1.0.sql
e34bd1a7252673bea1947187e951bfca019440c50f28c9e9cad7a1352333ea3b  idempotency--1.0--1.1.sql
"

run_release_suite() {
    local r=$IDEM_ROOT version sqlversion defaultversion v f rel_failed=0
    log "suite: release"
    # rel_check NAME EXPECTED ACTUAL
    rel_check() {
        if [ "$2" = "$3" ]; then
            passed=$((passed + 1))
            echo "ok     $1"
        else
            failed=$((failed + 1))
            echo "FAILED $1: expected '$2', got '$3'"
            rel_failed=1
        fi
    }
    # The version is the first heading of CHANGELOG.md: "## X.Y.Z (YYYY-MM-DD)".
    version=$(sed -nE 's/^## ([0-9]+\.[0-9]+\.[0-9]+)( .*)?$/\1/p' "$r/CHANGELOG.md" | head -n 1)
    sqlversion=${version%.*}
    v=$(grep -m 1 '^## [0-9]' "$r/CHANGELOG.md")
    rel_check "CHANGELOG.md: the latest version is dated" \
        1 "$(echo "$v" | grep -cE '^## [0-9.]+ \([0-9]{4}-[0-9]{2}-[0-9]{2}\)$')"
    # Changes not released yet go under "## Unreleased", above the latest
    # version: the default version may then be the next SQL version, which
    # an update script from the released one reaches.
    defaultversion=$sqlversion
    if [ "$(grep -m 1 '^## ' "$r/CHANGELOG.md")" = "## Unreleased" ]; then
        defaultversion=$(sed -nE "s/^default_version = '([0-9]+\.[0-9]+)'$/\1/p" "$r/idempotency.control")
        rel_check "update scripts in DATA lead from the released $sqlversion to the default version" \
            "$defaultversion" "$(rel_update_path "$r" "$sqlversion" "$defaultversion")"
    fi
    rel_check "idempotency.control: default_version is $defaultversion" \
        "default_version = '$defaultversion'" "$(grep '^default_version' "$r/idempotency.control")"
    rel_check "META.json: version $version" "$version $version" \
        "$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))
print(m["version"], m["provides"]["idempotency"]["version"])' "$r/META.json")"
    rel_check "debian/changelog: version $version-1" "$version-1" \
        "$(sed -nE '1s/^[^ ]+ \(([^)]+)\).*/\1/p' "$r/debian/changelog")"
    rel_check "README.md: says version $version" 1 "$(grep -cE "^Version ${version//./\\.}[ ,]" "$r/README.md")"
    v=$(grep -oE 'postgresql-[0-9]+-idempotency_[0-9.]+-[0-9]+_amd64\.deb' "$r/README.md" | sort -u | tr '\n' ' ')
    rel_check "README.md: names the packages postgresql-15 and -17-idempotency_$version-1_amd64.deb" \
        "postgresql-15-idempotency_$version-1_amd64.deb postgresql-17-idempotency_$version-1_amd64.deb " "$v"
    # make deb's version (scripts/deb_version.sh): the release's while the
    # tree is the release, a development version of the next one after it
    v=$(bash "$r/scripts/deb_version.sh" "$r")
    if [ "$defaultversion" = "$sqlversion" ] && [ "$(grep -m 1 '^## ' "$r/CHANGELOG.md")" != "## Unreleased" ]; then
        rel_check "make deb's version is the release's, $version-1" "$version-1" "$v"
    else
        rel_check "make deb's version says the work is unreleased (not $version-1)" 1 \
            "$(echo "$v" | grep -cE "^$defaultversion\.[0-9]+~dev(\+git[0-9]{14}\.[0-9a-f]+)?-1\$")"
    fi
    rel_check "an install path reaches version $defaultversion (idempotency--*$defaultversion.sql in DATA)" 1 \
        "$(rel_data "$r" | grep -cE "^idempotency--([0-9.]+--)?$defaultversion\.sql$")"
    rel_check "the released SQL scripts are unchanged" "" \
        "$(cd "$r" && echo "$IDEM_RELEASED_SQL" | sed '/^$/d' | sha256sum --quiet -c - 2>&1)"
    rel_check "LICENSE: the PostgreSQL Licence" 1 \
        "$(grep -c 'Permission to use, copy, modify, and distribute this software' "$r/LICENSE")"
    v=
    for f in "$r/META.json" "$r"/examples/*/package.json "$r"/test/*/package.json; do
        [ -f "$f" ] || continue
        v="$v$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("license"), end=" ")' "$f")"
    done
    rel_check "META.json and the package.json files: license PostgreSQL" "postgresql " \
        "$(echo "$v" | tr 'A-Z' 'a-z' | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')"
    rel_check "debian/copyright: License: PostgreSQL for the project's files" "PostgreSQL" \
        "$(awk '/^Files: \*$/ { f = 1 } f && /^License:/ { print $2; exit }' "$r/debian/copyright")"
    rel_check "README.md and docs/: every code block the suites do not run begins with a comment excerpt" "" \
        "$(rel_unmarked_blocks "$r")"
    [ "$rel_failed" = 0 ] || failed_suites+=(release)
}

# The files of the Makefile's DATA, one a line (continued lines joined).
rel_data() {
    sed -n '/^DATA *=/{:a;/\\$/{N;s/\\\n//;ba};s/^DATA *= *//;p}' "$1/Makefile" | tr -s ' \t' '\n'
}

# Follow the update scripts of DATA from version $2 towards $3 (one step
# each, at most ten); prints the version reached.
rel_update_path() {
    local v=$2 next i
    for i in 1 2 3 4 5 6 7 8 9 10; do
        [ "$v" = "$3" ] && break
        next=$(rel_data "$1" | sed -nE "s/^idempotency--${v//./\\.}--([0-9.]+)\.sql$/\1/p" | sort -V | tail -n 1)
        [ -n "$next" ] || break
        v=$next
    done
    echo "$v"
}

# The code blocks (with a language) of README.md and docs/*.md that neither
# a suite runs as written (the README's sections named below) nor begin
# with a comment "excerpt", as FILE:LINE.
rel_unmarked_blocks() {
    (cd "$1" && python3 - README.md docs/*.md <<'PY'
import re, sys
run = {"README.md": {"Install the package",                        # package
                     "Preload the library, create the extension",  # package
                     "Walkthrough", "Uninstalling"}}               # walkthrough
for path in sys.argv[1:]:
    heading, fence, first, start = None, None, False, 0
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        m = re.match(r"^ *```(\w*)\s*$", line)
        if m and fence is None:
            fence, first, start = m.group(1), True, n
            continue
        if m:
            fence = None
            continue
        if fence is None:
            h = re.match(r"^#+ (.*)", line)
            if h:
                heading = h.group(1).strip()
            continue
        if first and fence:
            first = False
            if not re.match(r"^ *(#|--|//|;) excerpt\b", line) and heading not in run.get(path, ()):
                print(f"{path}:{start}", end=" ")
PY
    )
}
