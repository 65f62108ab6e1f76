# scripts/suite_exporter.sh: the monitoring/ files against real tools, sourced
# by scripts/test.sh (suite "exporter").
#
# promtool (Debian's prometheus package) checks monitoring/alerts.yml and
# runs its unit tests (monitoring/alerts_test.yml).  Then Debian's
# prometheus-postgres-exporter, with monitoring/queries.yaml, runs as the
# OS user nobody on a free port against the throwaway cluster, connecting as
# a monitoring role that has exactly the grants docs/monitoring.md lists
# (its sql block is run as written).  An application role makes a scripted
# run of claims on a fresh operation; /metrics must show exactly its
# outcomes.  The exporter runs in a process group that stop_groups ends,
# here and in cleanup() whatever happens.  Uses passed, failed and
# failed_suites of scripts/test.sh.

run_exporter_suite() {
    local dir=$IDEM_TMP/exporter bindir port pid ok=1 metrics=$IDEM_TMP/exporter/metrics.txt
    local op=exporter.scripted app=idem_exporter_app db=idem_exporter v i
    local runas=()
    bindir=$("$PG_CONFIG" --bindir)
    log "suite: exporter"
    # exp_check NAME EXPECTED ACTUAL
    exp_check() {
        if [ "$2" = "$3" ]; then
            passed=$((passed + 1))
            echo "ok     $1"
        else
            failed=$((failed + 1))
            echo "FAILED $1: expected '$2', got '$3'"
            ok=0
        fi
    }
    # exp_metric NAME LABEL-MATCH: the value of the series of metric NAME
    # whose labels contain every label=value given, from the last scrape.
    exp_metric() {
        local name=$1
        shift
        awk -v name="$name" -v want="$*" '
            index($0, name "{") == 1 {
                n = split(want, w, " ")
                for (i = 1; i <= n; i++) if (index($0, w[i]) == 0) next
                print $NF
            }' "$metrics"
    }
    exp_sql() {
        as_postgres "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"
    }

    # No service starts during the install (install_service_packages); where
    # systemd runs, those this suite installed are also disabled.
    local p had=()
    for p in prometheus prometheus-postgres-exporter; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || had+=("$p")
    done
    if ! install_service_packages prometheus prometheus-postgres-exporter curl; then
        exp_check "prometheus and prometheus-postgres-exporter installed" yes no
        failed_suites+=(exporter)
        return 0
    fi
    if [ ${#had[@]} -gt 0 ] && [ -d /run/systemd/system ]; then
        for p in "${had[@]}"; do as_root systemctl disable --now "$p" >/dev/null 2>&1 || true; done
    fi

    # The alert rules: valid, and firing as their unit tests say.
    v=$(cd "$IDEM_ROOT/monitoring" && promtool check rules alerts.yml 2>&1) || true
    exp_check "promtool check rules monitoring/alerts.yml" "SUCCESS: 6 rules found" \
        "$(echo "$v" | grep -o 'SUCCESS: [0-9]* rules found' || echo "$v")"
    v=$(cd "$IDEM_ROOT/monitoring" && promtool test rules alerts_test.yml 2>&1) || true
    exp_check "promtool test rules monitoring/alerts_test.yml" "SUCCESS" \
        "$(echo "$v" | grep -ow 'SUCCESS' || echo "$v")"

    # The database, the application's role, and the monitoring role with
    # the documented grants, run as written.
    as_root install -d -m 755 "$dir"
    sed -n '/^## Grants of a monitoring role/,/^## /p' "$IDEM_ROOT/docs/monitoring.md" |
        awk '/^```sql$/ { code = 1; next } /^```$/ { if (code) exit; } code' >"$dir/grants.sql"
    cp "$IDEM_ROOT/monitoring/queries.yaml" "$dir/queries.yaml"
    chmod 644 "$dir/grants.sql" "$dir/queries.yaml"
    if ! exp_sql -d postgres -c "CREATE DATABASE $db" -c "CREATE ROLE $app LOGIN" \
        || ! exp_sql -d "$db" -c "CREATE EXTENSION idempotency" \
            -c "GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail TO $app" \
            -c "ALTER ROLE $app SET idempotency.max_key_length = 400" \
        || ! exp_sql -d "$db" -f "$dir/grants.sql"; then
        exp_check "set-up of the database and the documented grants" ok failed
        failed_suites+=(exporter)
        return 0
    fi

    # The scripted run, as the application: proceed 5, replay 2, mismatch
    # 1, in_progress 1, unknown 1; completions 2, retryable failures 1, a
    # lease expired to unknown 1.  Then a proceed of each of two
    # operations longer than 255 bytes that share their first 255.
    if ! as_postgres "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 -U "$app" -d "$db" >/dev/null <<EOF
SELECT token AS t1 FROM idem_claim('$op', 'k1', '{"n": 1}') \\gset
SELECT idem_complete(:'t1', 201, '{"id": 1}');
SELECT outcome FROM idem_claim('$op', 'k1', '{"n": 1}');
SELECT outcome FROM idem_claim('$op', 'k1', '{"n": 1}');
SELECT outcome FROM idem_claim('$op', 'k1', '{"n": 2}');
SELECT outcome FROM idem_claim('$op', 'k2', lease => '1h');
SELECT outcome FROM idem_claim('$op', 'k2');
SELECT token AS t3 FROM idem_claim('$op', 'k3') \\gset
SELECT idem_fail(:'t3', 503, retryable => true);
SELECT token AS t3 FROM idem_claim('$op', 'k3') \\gset
SELECT idem_complete(:'t3', 200);
SELECT outcome FROM idem_claim('$op', 'k4', lease => '1 microsecond');
SELECT outcome FROM idem_claim('$op', 'k4');
SELECT outcome FROM idem_claim(repeat('l', 255) || '-one', 'k1');
SELECT outcome FROM idem_claim(repeat('l', 255) || '-two', 'k1');
EOF
    then
        exp_check "the scripted run of claims" ok failed
        failed_suites+=(exporter)
        return 0
    fi

    # The exporter, as nobody, in a process group of its own.
    if ! port=$(free_port); then
        exp_check "a free port for the exporter" yes no
        failed_suites+=(exporter)
        return 0
    fi
    IDEM_GROUPS=$IDEM_TMP/exporter.groups
    if [ "$(id -u)" -eq 0 ]; then runas=(runuser -u nobody --); else runas=(sudo -u nobody); fi
    in_own_group timeout -k 5 300 "${runas[@]}" env \
        DATA_SOURCE_NAME="host=127.0.0.1 port=$PGPORT user=monitoring dbname=$db sslmode=disable" \
        /usr/bin/prometheus-postgres-exporter \
        --web.listen-address="127.0.0.1:$port" \
        --extend.query-path="$dir/queries.yaml" \
        --disable-settings-metrics >"$dir/exporter.log" 2>&1 &
    pid=$!
    v=no
    for i in $(seq 1 300); do
        if curl -sf "http://127.0.0.1:$port/metrics" >"$metrics" 2>/dev/null \
            && grep -q '^idem_stat_operations_proceed{' "$metrics"; then
            v=yes
            break
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    exp_check "prometheus-postgres-exporter serves /metrics on 127.0.0.1:$port as nobody" yes "$v"
    # from /proc: procps (pgrep, ps) is not on every Debian system
    v=other
    for d in /proc/[0-9]*; do
        if tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -q -- "--web.listen-address=127.0.0.1:$port" \
            && [ "$(stat -c %U "$d" 2>/dev/null)" = nobody ]; then
            v=nobody
            break
        fi
    done
    exp_check "  ... running as nobody" nobody "$v"

    if [ "$ok" = 1 ]; then
        local labels="database=\"$db\" role=\"$app\" operation=\"$op\""
        for v in proceed:5 replay:2 in_progress:1 mismatch:1 unknown:1 expired:0 rate_limited:0 \
                 completions:2 failures:0 retryable_failures:1 stale_tokens:0 \
                 leases_expired_unknown:1 leases_expired_retryable:0; do
            exp_check "  ... idem_stat_operations_${v%%:*} = ${v#*:}" "${v#*:}" \
                "$(exp_metric "idem_stat_operations_${v%%:*}" $labels)"
        done
        v=$(exp_metric idem_stat_operations_claim_seconds $labels)
        exp_check "  ... idem_stat_operations_claim_seconds is positive" yes \
            "$(awk -v x="${v:-0}" 'BEGIN { print (x > 0) ? "yes" : "no" }')"
        exp_check "  ... idem_stats_records of the unknown state = 1" 1 \
            "$(exp_metric idem_stats_records "operation=\"$op\"" 'state="unknown"')"
        exp_check "  ... idem_stats_records of the succeeded state = 2" 2 \
            "$(exp_metric idem_stats_records "operation=\"$op\"" 'state="succeeded"')"
        exp_check "  ... idem_stat_operations_info_evictions = 0" 0 \
            "$(exp_metric idem_stat_operations_info_evictions)"
        # Two operations of 257 bytes sharing their first 255: two rows of
        # the view under one cut name, one metric.
        exp_check "  ... idem_stat_operations_proceed of the two long operations = 2" 2 \
            "$(exp_metric idem_stat_operations_proceed "database=\"$db\"" "role=\"$app\"" \
                "operation=\"$(printf 'l%.0s' $(seq 255))\"")"
        v=$(grep -ciE 'level=(error|warn).*idem' "$dir/exporter.log" || true)
        exp_check "  ... no idem query refused or failed (exporter log)" 0 "$v"
    fi
    stop_groups
    if [ "$ok" = 0 ]; then
        failed_suites+=(exporter)
        echo "===== $dir/exporter.log (last 40 lines)"
        tail -n 40 "$dir/exporter.log" 2>/dev/null || true
        echo "===== idem metrics scraped"
        grep '^idem_' "$metrics" 2>/dev/null | head -n 60 || true
    fi
}
