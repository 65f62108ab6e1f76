# scripts/lib.sh: shared by scripts/test.sh and scripts/demo.sh.
#
# Installs what is missing from Debian's packages, builds and installs the
# extension, and runs a throwaway PostgreSQL cluster as the postgres OS user
# (PostgreSQL refuses to run as root).  Sourced, not executed.
#
# Environment:
#   PG_CONFIG   pg_config of the PostgreSQL to build against (default:
#               the distribution's own PostgreSQL, /usr/lib/postgresql/N/bin/
#               pg_config: 15 on Debian 12, 17 on Debian 13, what the package
#               postgresql depends on elsewhere)
#   KEEP_TMP=1  keep the temporary folder (cluster, logs, results) afterwards
#   IDEM_POSTGRES  a program pg_ctl starts instead of postgres (scripts/sanitize.sh
#               runs the server under valgrind that way)

IDEM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# idem_distribution_major: the major version of the distribution's own
# PostgreSQL: 15 on Debian 12 (bookworm), 17 on Debian 13 (trixie); on
# another, the one its package postgresql depends on (postgresql-18 on
# unstable today), or else the newest installed.
idem_distribution_major() {
    local codename= major=
    codename=$( . /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    case $codename in
        bookworm) echo 15; return ;;
        trixie) echo 17; return ;;
    esac
    major=$(apt-cache depends postgresql 2>/dev/null | sed -nE 's/^ *Depends: postgresql-([0-9]+)$/\1/p' | head -n 1)
    if [ -z "$major" ]; then
        major=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -n 1)
    fi
    echo "${major:-15}"
}
IDEM_PG_MAJOR=$(idem_distribution_major)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/$IDEM_PG_MAJOR/bin/pg_config}
export PG_CONFIG
# The major version of $PG_CONFIG (a pg_config named by the caller may not
# be the distribution's), from its path /usr/lib/postgresql/N/bin.
case $PG_CONFIG in
    /usr/lib/postgresql/[0-9]*/bin/pg_config)
        IDEM_PG_MAJOR=${PG_CONFIG#/usr/lib/postgresql/}
        IDEM_PG_MAJOR=${IDEM_PG_MAJOR%%/*} ;;
esac

# (python3-psycopg2: the invariant checker of t/021_invariants.pl and the
# fuzzer of t/025_claim_text_fuzz.pl)
IDEM_PACKAGES="make gcc libc6-dev libssl-dev postgresql-$IDEM_PG_MAJOR postgresql-server-dev-$IDEM_PG_MAJOR postgresql-contrib libipc-run-perl python3 python3-psycopg2"

# What the example clients (examples/python, node, java, go) need: Debian's
# psycopg2 for Debian's python3; node with npm, javac and go (any that is on
# PATH, else Debian's nodejs and npm, default-jdk-headless, golang-go);
# Debian's JDBC driver (/usr/share/java/postgresql.jar) and the sources of
# pgx v4 (/usr/share/gocode), which go builds offline.
IDEM_CLIENT_PACKAGES="python3 python3-psycopg2 libpostgresql-jdbc-java golang-github-jackc-pgx-v4-dev"
# clients/python and its example: psycopg 3, Starlette and FastAPI on
# uvicorn, Flask, pytest (and httpx, for Starlette's test client); uvloop
# and httptools, which uvicorn takes when they are there (its "standard"
# install): a third of the CPU per request of h11 and asyncio's own loop.
IDEM_CLIENT_PACKAGES="$IDEM_CLIENT_PACKAGES python3-psycopg python3-psycopg-pool python3-starlette
    python3-fastapi python3-uvicorn python3-uvloop python3-httptools python3-flask python3-pytest python3-httpx"
# clients/java's servlet Filter: the Servlet API (/usr/share/java/servlet-api.jar).
IDEM_CLIENT_PACKAGES="$IDEM_CLIENT_PACKAGES libservlet-api-java"

log() { printf '==> %s\n' "$*" >&2; }

# Run a command as root: directly when we are root, else through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Run a command as the postgres OS user, keeping the variables it needs.
as_postgres() {
    local envs=(PATH="$PATH" PG_CONFIG="$PG_CONFIG")
    [ -n "${PGHOST:-}" ] && envs+=(PGHOST="$PGHOST")
    [ -n "${PGPORT:-}" ] && envs+=(PGPORT="$PGPORT")
    [ -n "${IDEM_INVARIANT_SECONDS:-}" ] && envs+=(IDEM_INVARIANT_SECONDS="$IDEM_INVARIANT_SECONDS")
    [ -n "${IDEM_FUZZ_CASES:-}" ] && envs+=(IDEM_FUZZ_CASES="$IDEM_FUZZ_CASES")
    [ -n "${IDEM_FUZZ_SEED:-}" ] && envs+=(IDEM_FUZZ_SEED="$IDEM_FUZZ_SEED")
    [ -n "${IDEM_UPGRADE_FROM:-}" ] && envs+=(IDEM_UPGRADE_FROM="$IDEM_UPGRADE_FROM")
    if [ "$(id -un)" = postgres ]; then
        env "${envs[@]}" "$@"
    elif [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- env "${envs[@]}" "$@"
    else
        sudo -u postgres env "${envs[@]}" "$@"
    fi
}

# Install the Debian packages that are missing: those of $IDEM_PACKAGES, or
# of the list given as arguments.
install_packages() {
    local missing=()
    local p
    for p in ${*:-$IDEM_PACKAGES}; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# Install the missing packages of a service the tests start themselves
# (RabbitMQ, Prometheus and its exporter): Debian starts a package's
# service on install unless /usr/sbin/policy-rc.d says no, so when there is
# none, one that refuses every start is put there for the install, and
# removed afterwards (by cleanup, if the install is interrupted).  Debian
# also enables the services at boot: those of every package this install
# added (dependencies too, epmd's say) are disabled again, as systemd units
# and as init scripts.  The packages stay installed.
install_service_packages() {
    local policy=/usr/sbin/policy-rc.d status=0 before p f
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# idempotency scripts/lib.sh: no service starts during its install\nexit 101\n' \
            | as_root tee "$policy" >/dev/null && as_root chmod 755 "$policy" \
            && IDEM_POLICY_RC=$policy
    fi
    before=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }')
    install_packages "$@" || status=$?
    if [ -n "${IDEM_POLICY_RC:-}" ]; then
        as_root rm -f "$IDEM_POLICY_RC"
        IDEM_POLICY_RC=
    fi
    for p in $(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }' \
            | grep -vxF -f <(echo "$before")); do
        for f in $(dpkg -L "$p" 2>/dev/null); do
            case $f in
                /lib/systemd/system/*@.*) ;;
                /lib/systemd/system/*.service | /lib/systemd/system/*.socket | /lib/systemd/system/*.timer)
                    # (systemctl disables a unit also where systemd does not run)
                    as_root systemctl --no-reload disable "${f##*/}" >/dev/null 2>&1 || true ;;
                /etc/init.d/*)
                    as_root update-rc.d "${f##*/}" disable >/dev/null 2>&1 || true ;;
            esac
        done
    done
    return "$status"
}

# Install what the example clients need and is missing.  node, npm, the JDK
# and go may come from elsewhere (NodeSource, nvm, another JDK): only when a
# command is missing is Debian's package installed.
install_client_packages() {
    local pkgs=$IDEM_CLIENT_PACKAGES
    command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
    command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
    command -v javac >/dev/null 2>&1 || pkgs="$pkgs default-jdk-headless"
    command -v go >/dev/null 2>&1 || pkgs="$pkgs golang-go"
    install_packages $pkgs
}

# cached_postgres MAJOR: the pg_config of the newest finished build of
# PostgreSQL MAJOR that scripts/build_postgres.sh keeps, or nothing.
cached_postgres() {
    local dir found=
    for dir in "${IDEM_PG_CACHE:-/var/cache/idempotency}/postgresql-$1".*; do
        [ -f "$dir/.idempotency-built" ] && [ -x "$dir/bin/pg_config" ] \
            && found=$dir/bin/pg_config
    done
    echo "$found"
}

# pg_config_for MAJOR: the pg_config of PostgreSQL MAJOR on this machine:
# $PG_CONFIG_<MAJOR> when it is set (PG_CONFIG_18=/opt/pg18/bin/pg_config,
# say), else Debian's for the distribution's own version (install_packages
# installs it) or any other installed, else, with IDEM_PG_FROM_SOURCE=1,
# one built from source by scripts/build_postgres.sh (kept, so that only
# the first run builds it); else nothing: scripts/test.sh then runs that
# version in a root of its distribution (scripts/roots.sh).
pg_config_for() {
    local own=PG_CONFIG_$1
    if [ -n "${!own:-}" ]; then
        echo "${!own}"
    elif [ "$1" = "$(idem_distribution_major)" ] || [ -x "/usr/lib/postgresql/$1/bin/pg_config" ]; then
        echo "/usr/lib/postgresql/$1/bin/pg_config"
    elif [ "${IDEM_PG_FROM_SOURCE:-}" = 1 ]; then
        bash "$IDEM_ROOT/scripts/build_postgres.sh" "$1"
    fi
}

# Build and install the extension into the PostgreSQL of $PG_CONFIG.
# with_llvm=no: JIT bitcode is not needed and would require clang.
# The objects are built in the source tree: when they were built against
# another PostgreSQL (the file .built-with says which), they are removed
# first.
build_and_install() {
    local stamp=$IDEM_ROOT/.built-with built_with
    built_with="$PG_CONFIG $("$PG_CONFIG" --version)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$built_with" ]; then
        make -s -C "$IDEM_ROOT" PG_CONFIG="$PG_CONFIG" clean >/dev/null
    fi
    log "building against $("$PG_CONFIG" --version)"
    make -s -C "$IDEM_ROOT" PG_CONFIG="$PG_CONFIG" with_llvm=no >/dev/null
    echo "$built_with" >"$stamp"
    log "installing into $("$PG_CONFIG" --pkglibdir)"
    as_root make -s -C "$IDEM_ROOT" PG_CONFIG="$PG_CONFIG" with_llvm=no install >/dev/null
}

# Make a temporary folder owned by postgres holding a copy of the source
# tree (the test harnesses write their results next to their inputs).
make_workdir() {
    IDEM_TMP=$(mktemp -d "${TMPDIR:-/tmp}/idempotency.XXXXXX")
    mkdir "$IDEM_TMP/src"
    tar -C "$IDEM_ROOT" --exclude=.git --exclude=results --exclude=output_iso \
        --exclude=tmp_check --exclude=node_modules --exclude=__pycache__ \
        -cf - . | tar -C "$IDEM_TMP/src" -xf -
    as_root chown -R postgres: "$IDEM_TMP"
    # like /tmp: the postgres OS user creates the cluster and its socket
    # here, the invoking user (root, or one with sudo) the suites' outputs
    as_root chmod 1777 "$IDEM_TMP"
}

# A TCP port nobody listens on, below the kernel's range of ephemeral
# ports (32768 and up by default): a port there may be the local end of a
# connection, which a connect() does not see and a listener cannot bind.
free_port() {
    local port low
    low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$low" -gt 21000 ] 2>/dev/null || low=32768
    for port in $(shuf -i 20000-$((low - 1)) -n 50); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
    done
    return 1
}

# Start a throwaway cluster with the library preloaded.  Extra
# postgresql.conf lines come as arguments.  Sets PGHOST and PGPORT.
start_cluster() {
    local bindir conf line
    bindir=$("$PG_CONFIG" --bindir)
    PGPORT=$(free_port)
    PGHOST=$IDEM_TMP
    export PGHOST PGPORT
    log "starting a throwaway cluster in $IDEM_TMP/data on port $PGPORT"
    as_postgres "$bindir/initdb" -D "$IDEM_TMP/data" -A trust -U postgres \
        --no-sync -E UTF8 --locale=C >"$IDEM_TMP/initdb.log" 2>&1 \
        || { cat "$IDEM_TMP/initdb.log"; return 1; }
    conf="$IDEM_TMP/data/postgresql.conf"
    {
        echo "port = $PGPORT"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$IDEM_TMP'"
        echo "shared_preload_libraries = 'idempotency'"
        echo "fsync = off"
        for line in "$@"; do echo "$line"; done
    } | as_postgres tee -a "$conf" >/dev/null
    IDEM_CLUSTER_STARTED=1
    as_postgres env PGCTLTIMEOUT=600 "$bindir/pg_ctl" ${IDEM_POSTGRES:+-p "$IDEM_POSTGRES"} \
        -D "$IDEM_TMP/data" -l "$IDEM_TMP/server.log" -w start >/dev/null \
        || { cat "$IDEM_TMP/server.log"; return 1; }
}

# Run a command in a process group of its own, recorded in the file
# $IDEM_GROUPS, so that stop_groups can end whatever it leaves running (the
# example services), whatever happens.
in_own_group() {
    setsid bash -c 'echo $$ >>"$0"; exec "$@"' "${IDEM_GROUPS:?}" "$@"
}

# End what is left of the process groups in_own_group started.
stop_groups() {
    local g left=()
    [ -n "${IDEM_GROUPS:-}" ] && [ -s "$IDEM_GROUPS" ] || return 0
    for g in $(cat "$IDEM_GROUPS"); do
        if kill -TERM -- "-$g" 2>/dev/null; then left+=("$g"); fi
    done
    if [ ${#left[@]} -gt 0 ]; then
        sleep 1
        for g in "${left[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
    fi
    : >"$IDEM_GROUPS"
}

# The clusters a suite starts besides start_cluster's, stopped by cleanup.
IDEM_STOP_CLUSTERS=()

# Stop the cluster and remove the temporary folder.  Installed as an EXIT
# trap, so it runs whatever happened before.
cleanup() {
    local status=$?
    stop_groups
    [ -z "${IDEM_POLICY_RC:-}" ] || as_root rm -f "$IDEM_POLICY_RC"
    if [ -n "${IDEM_CLUSTER_STARTED:-}" ]; then
        as_postgres "$("$PG_CONFIG" --bindir)/pg_ctl" -D "$IDEM_TMP/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    # the suites' other clusters: "PG_CTL|DATADIR" each
    local c
    for c in "${IDEM_STOP_CLUSTERS[@]}"; do
        as_postgres "${c%%|*}" -D "${c#*|}" -m fast -w stop >/dev/null 2>&1 || true
    done
    if [ -n "${IDEM_TMP:-}" ] && [ -d "$IDEM_TMP" ]; then
        if [ "$status" -ne 0 ] || [ -n "${KEEP_TMP:-}" ]; then
            log "kept $IDEM_TMP (server log: $IDEM_TMP/server.log)"
        else
            as_root rm -rf "$IDEM_TMP"
        fi
    fi
    exit "$status"
}
