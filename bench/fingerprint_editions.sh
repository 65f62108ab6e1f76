#!/usr/bin/env bash
# bench/fingerprint_editions.sh: the SQL edition's idem_fingerprint against
# the C edition's and against sha256 of the jsonb text, per call.
#
# Starts a throwaway cluster (scripts/lib.sh) with the C edition in schema
# c and the SQL edition's canonical functions in schema sqled
# (test/editions/canonical_schemas.sh), and stores three request-like
# documents of
# about 300 bytes, 1 KB and 10 KB of JSON text.  For each expression and
# document, one backend runs a loop of calls in one statement; the time the
# backend spent on a CPU (/proc/PID/schedstat, so that other work on a
# shared machine does not count) divided by the number of calls, the best
# of three loops, is printed in microseconds.
#
#   c.idem_fingerprint(doc)                   the C edition
#   sqled.idem_fingerprint(doc)               the SQL edition
#   sqled.idem__fingerprint(doc)              the SQL edition, as its claims
#                                             call it (no search_path of its
#                                             own to set and reset)
#   sha256(convert_to(doc::text, 'UTF8'))     jsonb text + SHA-256
#
# Environment: PG_CONFIG (as scripts/test.sh), BENCH_CALLS (calls per loop
# for the C edition and sha256; the SQL edition makes a tenth of them,
# default 20000), KEEP_TMP=1.
set -euo pipefail
. "$(dirname "$0")/../scripts/lib.sh"
. "$(dirname "$0")/../test/editions/canonical_schemas.sh"

CALLS=${BENCH_CALLS:-20000}

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster

BINDIR=$("$PG_CONFIG" --bindir)
psql_q() { as_postgres "$BINDIR/psql" -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }

install_canonical_schemas
psql_q <<'SQL'
-- A payment request with n order lines: a handful of scalar members, one
-- nested object, and an array of objects that grows with n.
CREATE TABLE docs (name text PRIMARY KEY, doc jsonb NOT NULL);
ALTER TABLE docs ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO docs
SELECT name, jsonb_build_object(
           'amount', 1250, 'currency', 'EUR', 'capture', true,
           'customer_id', 'cus_9s6XKzkNRiz8i3', 'description', 'Order #10231',
           'payment_method', 'pm_card_visa', 'receipt_email', 'zoe@example.com',
           'metadata', jsonb_build_object('order_id', 'ord_5f2c9e1a', 'channel', 'web', 'attempt', 1))
       || CASE WHEN n = 0 THEN '{}'::jsonb ELSE jsonb_build_object('lines',
              (SELECT jsonb_agg(jsonb_build_object('sku', 'SKU-' || i, 'name', 'Article ' || i || ' – café',
                                                   'quantity', i % 5 + 1, 'unit_price', round(i * 7.31, 2),
                                                   'tax_rate', 0.077, 'gift', i % 2 = 0))
                 FROM generate_series(1, n) AS i)) END
  FROM (VALUES ('300b', 0), ('1kb', 5), ('10kb', 70)) AS s(name, n);
SELECT name, octet_length(doc::text) AS jsonb_text_bytes,
       octet_length(convert_to(c.idem_canonical(doc), 'UTF8')) AS canonical_bytes,
       c.idem_canonical(doc) = sqled.idem_canonical(doc) AS same_canonical_text
  FROM docs ORDER BY octet_length(doc::text);
SQL

# Microseconds of CPU per call of $1 on document $2, $3 calls a loop.
per_call() {
    local expr=$1 doc=$2 calls=$3 best='' pid before after
    # (search_path: the helpers run under their caller's, as in a claim)
    coproc PSQL { as_postgres env PGOPTIONS="-c search_path=public,sqled" \
                      "$BINDIR/psql" -U postgres -X -q -A -t 2>&1; }
    echo "SELECT pg_backend_pid();" >&"${PSQL[1]}"
    read -r pid <&"${PSQL[0]}"
    loop() {
        echo "SELECT count($expr) FROM docs, generate_series(1, $1) WHERE name = '$doc';" >&"${PSQL[1]}"
        read -r _ <&"${PSQL[0]}"
    }
    loop 20
    for _ in 1 2 3; do
        before=$(cut -d' ' -f1 "/proc/$pid/schedstat")
        loop "$calls"
        after=$(cut -d' ' -f1 "/proc/$pid/schedstat")
        t=$(( (after - before) / calls ))
        if [ -z "$best" ] || [ "$t" -lt "$best" ]; then best=$t; fi
    done
    echo '\q' >&"${PSQL[1]}"
    wait "$PSQL_PID" 2>/dev/null || true
    awk -v ns="$best" 'BEGIN { printf "%.2f", ns / 1000 }'
}

echo
echo "CPU time per call in one backend (microseconds, best of 3 loops)"
echo
echo "| document | C edition | SQL edition | SQL / C | SQL edition, idem__fingerprint | sha256(convert_to(doc::text, 'UTF8')) | SQL / sha256 |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for doc in 300b 1kb 10kb; do
    c=$(per_call "c.idem_fingerprint(doc)" "$doc" "$CALLS")
    s=$(per_call "sqled.idem_fingerprint(doc)" "$doc" $((CALLS / 10)))
    i=$(per_call "sqled.idem__fingerprint(doc)" "$doc" $((CALLS / 10)))
    h=$(per_call "sha256(convert_to(doc::text, 'UTF8'))" "$doc" "$CALLS")
    awk -v d="$doc" -v c="$c" -v s="$s" -v i="$i" -v h="$h" \
        'BEGIN { printf "| %s | %.2f | %.2f | %.1f | %.2f | %.2f | %.1f |\n", d, c, s, s / c, i, h, s / h }'
done
