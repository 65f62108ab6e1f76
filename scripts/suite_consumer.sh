# scripts/suite_consumer.sh: the RabbitMQ consumer's end-to-end test
# (examples/consumer/test_consumer.py).  Sourced by scripts/test.sh, whose
# functions and counters (run_client, passed, failed, failed_suites) it uses.
#
# Installs Debian's rabbitmq-server and python3-pika when missing, without
# letting the package start its service, and starts a private broker of its
# own: as the package's rabbitmq user, from a folder of its own (config,
# data, logs, Erlang cookie), listening on 127.0.0.1 only, on free ports for
# AMQP, Erlang distribution and epmd, so that it never meets a broker or an
# epmd of the machine's.  The broker and its epmd run in process groups that
# stop_groups ends: when the test is done, or in test.sh's EXIT trap
# whatever happens.  The test itself runs as the invoking user, as the role
# idem_app on a database of its own (examples/schema.sql and
# examples/consumer/schema.sql), under a time limit.

# Install what is missing, no service started (install_service_packages).
# Where systemd runs, the services of packages installed here are disabled,
# so that they do not start at the next boot either.
consumer_install() {
    local missing=() p status=0
    for p in erlang-base rabbitmq-server python3-pika; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    install_service_packages rabbitmq-server python3-pika || status=$?
    if [ -d /run/systemd/system ]; then
        for p in "${missing[@]}"; do
            case $p in
                rabbitmq-server) as_root systemctl disable --now rabbitmq-server.service >/dev/null 2>&1 || true ;;
                erlang-base) as_root systemctl disable --now epmd.socket epmd.service >/dev/null 2>&1 || true ;;
            esac
        done
    fi
    return "$status"
}

# Run a command as the rabbitmq OS user with only the environment given.
consumer_as_rabbitmq=(runuser -u rabbitmq -- env -i)
[ "$(id -u)" -eq 0 ] || consumer_as_rabbitmq=(sudo -u rabbitmq env -i)
as_rabbitmq() { "${consumer_as_rabbitmq[@]}" "$@"; }

# Wait until 127.0.0.1:$1 accepts connections, for $2 seconds at most, or
# until the process $3 has exited.
consumer_wait_port() {
    local end=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$end" ]; do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}

# Called as an if condition, where set -e does not apply: every step says
# whether it failed.
consumer_start_broker() {
    local dir=$1 amqp_port=$2 dist_port=$3 epmd_port=$4 env
    as_root install -d -o rabbitmq -g rabbitmq -m 700 "$dir/broker" || return
    # A cookie of its own: only this broker's own tools could talk to it.
    as_rabbitmq PATH=/usr/bin:/bin sh -c \
        'umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n" >"$0/.erlang.cookie"' \
        "$dir/broker" || return
    as_rabbitmq PATH=/usr/bin:/bin sh -c 'cat >"$0/rabbitmq.conf"' "$dir/broker" <<EOF || return
listeners.tcp.1 = 127.0.0.1:$amqp_port
loopback_users.guest = true
log.console = true
log.console.level = warning
log.file.level = info
EOF
    as_rabbitmq PATH=/usr/bin:/bin sh -c 'echo "[]." >"$0/enabled_plugins" && : >"$0/rabbitmq-env.conf"' \
        "$dir/broker" || return
    env=(PATH=/usr/bin:/bin LANG=C.UTF-8 HOME="$dir/broker"
         RABBITMQ_NODENAME="idem_consumer_$amqp_port@localhost"
         RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$amqp_port"
         RABBITMQ_DIST_PORT="$dist_port" ERL_EPMD_PORT="$epmd_port" ERL_EPMD_ADDRESS=127.0.0.1
         RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
         RABBITMQ_CONF_ENV_FILE="$dir/broker/rabbitmq-env.conf"
         RABBITMQ_CONFIG_FILE="$dir/broker/rabbitmq.conf"
         RABBITMQ_ENABLED_PLUGINS_FILE="$dir/broker/enabled_plugins"
         RABBITMQ_MNESIA_BASE="$dir/broker/mnesia" RABBITMQ_LOG_BASE="$dir/broker/log"
         RABBITMQ_PID_FILE="$dir/broker/rabbitmq.pid")
    # An epmd of its own, started first in a group of ours: the broker
    # would otherwise start one as a daemon that nothing here would end.
    log "starting epmd on 127.0.0.1:$epmd_port"
    in_own_group timeout -k 5 600 "${consumer_as_rabbitmq[@]}" "${env[@]}" \
        /usr/bin/epmd -port "$epmd_port" -address 127.0.0.1 >"$dir/epmd.out" 2>&1 &
    consumer_wait_port "$epmd_port" 30 $! || { cat "$dir/epmd.out"; return 1; }
    log "starting rabbitmq-server on 127.0.0.1:$amqp_port (distribution $dist_port)"
    in_own_group timeout -k 5 600 "${consumer_as_rabbitmq[@]}" "${env[@]}" \
        /usr/lib/rabbitmq/bin/rabbitmq-server >"$dir/broker.out" 2>&1 &
    consumer_wait_port "$amqp_port" 120 $! || { cat "$dir/broker.out"; return 1; }
}

run_consumer_suite() {
    local dir=$IDEM_TMP/consumer bindir amqp_port dist_port epmd_port before
    bindir=$("$PG_CONFIG" --bindir)
    as_root install -d -o "$(id -u)" -g "$(id -g)" "$dir"
    IDEM_GROUPS=$dir/groups
    before=${#failed_suites[@]}
    if ! consumer_install; then
        log "installing rabbitmq-server and python3-pika failed"
    elif ! amqp_port=$(free_port) || ! dist_port=$(free_port) || ! epmd_port=$(free_port) \
        || [ "$amqp_port" = "$dist_port" ] || [ "$amqp_port" = "$epmd_port" ] \
        || [ "$dist_port" = "$epmd_port" ]; then
        log "no free ports"
    elif ! consumer_start_broker "$dir" "$amqp_port" "$dist_port" "$epmd_port"; then
        log "the broker did not start"
    elif ! as_postgres "$bindir/createdb" idem_consumer \
        || ! as_postgres "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -d idem_consumer \
            -f "$IDEM_TMP/src/examples/schema.sql" -f "$IDEM_TMP/src/examples/consumer/schema.sql"; then
        log "setting up the database idem_consumer failed"
    else
        # CONSUMER_BENCH=1,10,100,1000: first, how fast the consumer drains
        # the queue with these batch sizes (examples/consumer/bench_consumer.py).
        if [ -n "${CONSUMER_BENCH:-}" ] && ! (cd "$IDEM_TMP/src/examples/consumer" &&
            in_own_group timeout -k 10 1200 env "${client_env[@]}" PGDATABASE=idem_consumer \
                AMQP_URL="amqp://guest:guest@127.0.0.1:$amqp_port/%2F" PYTHONDONTWRITEBYTECODE=1 \
                /usr/bin/python3 -u bench_consumer.py --batch-sizes "$CONSUMER_BENCH"); then
            failed_suites+=(consumer-bench)
            failed=$((failed + 1))
        fi
        run_client consumer "$IDEM_TMP/src/examples/consumer" \
            env PGDATABASE=idem_consumer AMQP_URL="amqp://guest:guest@127.0.0.1:$amqp_port/%2F" \
            PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -u test_consumer.py
        [ "${#failed_suites[@]}" -eq "$before" ] || {
            echo "===== $dir/broker.out (last 40 lines)"
            tail -n 40 "$dir/broker.out" || true
        }
        return 0
    fi
    stop_groups
    failed_suites+=(consumer)
    failed=$((failed + 1))
}

run_consumer_suite
