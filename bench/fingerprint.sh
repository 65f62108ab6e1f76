#!/usr/bin/env bash
# bench/fingerprint.sh: idem_fingerprint(doc) against sha256(doc::text::bytea).
#
# Starts a throwaway cluster (scripts/lib.sh), stores three request-like
# documents of about 1 KB, 10 KB and 1 MB of JSON text, and runs pgbench
# on three one-line scripts per size, side by side in one run, alternating
# them and repeating the round:
#
#   fingerprint  SELECT idem_fingerprint(doc)                 canonical + SHA-256
#   sha256       SELECT sha256(doc::text::bytea)              jsonb text + SHA-256
#   sha256_utf8  SELECT sha256(convert_to(doc::text, 'UTF8')) the same, without byteain
#   floor        SELECT jsonb_typeof(doc)                     fetch and detoast only
#
# doc::text::bytea goes through byteain, which rejects the backslash of any
# escaped character in the JSON text ("invalid input syntax for type
# bytea"), so the documents have no quote, backslash or control character
# in their strings; sha256_utf8 is the form that works for every document.
#
# Each script reads its document from the same table by primary key, so
# all three pay the same fetch (and, for 1 MB, detoast); "floor" shows that
# shared cost.  Prints the median transactions per second of each and the
# ratio fingerprint/sha256 (above 1: the fingerprint is faster).
#
# Then, less exposed to the noise of a shared machine and to pgbench's own
# per-transaction cost, the CPU time of one call in one backend: the median
# of three timed loops of many calls each.
#
# Environment: PG_CONFIG (as scripts/test.sh), BENCH_SECONDS per pgbench
# run (default 10), BENCH_REPEATS rounds (default 3), BENCH_CLIENTS
# (default 4), BENCH_JOBS pgbench threads (default 2), KEEP_TMP=1.
set -euo pipefail
. "$(dirname "$0")/../scripts/lib.sh"

SECONDS_PER_RUN=${BENCH_SECONDS:-10}
REPEATS=${BENCH_REPEATS:-3}
CLIENTS=${BENCH_CLIENTS:-4}
JOBS=${BENCH_JOBS:-2}

trap cleanup EXIT
install_packages
build_and_install
make_workdir
start_cluster "synchronous_commit = off" "idempotency.database = 'postgres'"

BINDIR=$("$PG_CONFIG" --bindir)
psql_q() { as_postgres "$BINDIR/psql" -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }

log "generating the documents"
psql_q <<'SQL'
CREATE EXTENSION idempotency;

-- A payment/order request with n line items: nested objects, arrays,
-- strings with non-ASCII characters and escapes, integers, decimals,
-- booleans and nulls, keys of several lengths (jsonb's order is not the
-- canonical order).
CREATE FUNCTION bench_doc(n int) RETURNS jsonb LANGUAGE sql AS $$
SELECT jsonb_build_object(
    'order_id', 'ord_' || md5(n::text),
    'currency', 'EUR',
    'customer', jsonb_build_object(
        'id', 81726354,
        'name', 'Zoë Müller-Ødegård',
        'email', 'zoe@example.com',
        'vip', true,
        'address', jsonb_build_object('street', 'Rue de l''Église 12',
                                      'city', 'Genève', 'postcode', '1204',
                                      'country', 'CH')),
    'items', (SELECT jsonb_agg(jsonb_build_object(
                  'sku', 'SKU-' || lpad(i::text, 6, '0'),
                  'name', 'Article ' || i || ' – café crème',
                  'quantity', i % 5 + 1,
                  'unit_price', round(((i * 7.31) % 1000)::numeric, 2),
                  'discount', 0.05,
                  'tax_rate', 0.077,
                  'tags', jsonb_build_array('blue', 'size-' || (i % 4)),
                  'gift', i % 2 = 0,
                  'note', CASE WHEN i % 3 = 0 THEN 'leave at door – fragile' END)
                  ORDER BY i)
                FROM generate_series(1, n) AS i),
    'total', round((n * 123.45)::numeric, 2),
    'metadata', jsonb_build_object('source', 'web', 'attempt', 1,
                                   'session', md5('s' || n)))
$$;

CREATE TABLE bench_docs (name text PRIMARY KEY, doc jsonb NOT NULL);
-- No compression: the benchmark is about hashing, not pglz.
ALTER TABLE bench_docs ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO bench_docs VALUES
    ('1kb', bench_doc(3)),
    ('10kb', bench_doc(45)),
    ('1mb', bench_doc(4800));
VACUUM ANALYZE bench_docs;

-- Microseconds per call of expr over the document size, timed over n calls.
CREATE FUNCTION bench_per_call(size text, expr text, n int) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    EXECUTE format('SELECT count(%s) FROM bench_docs, generate_series(1, %s) WHERE name = %L',
                   expr, n, size);
    RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END;
$$;

-- The median of three bench_per_call.
CREATE FUNCTION bench_median(size text, expr text, n int) RETURNS float8
LANGUAGE sql AS $$
SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY t)
  FROM (SELECT bench_per_call(size, expr, n) AS t FROM generate_series(1, 3)) s
$$;
SQL

psql_q -c "SELECT name, octet_length(doc::text) AS jsonb_text_bytes,
                  octet_length(convert_to(idem_canonical(doc), 'UTF8')) AS canonical_bytes,
                  pg_column_size(doc) AS stored_bytes
             FROM bench_docs ORDER BY octet_length(doc::text)"

# One pgbench script per (size, variant).
SCRIPTS=$IDEM_TMP/bench
as_postgres mkdir -p "$SCRIPTS"
for size in 1kb 10kb 1mb; do
    echo "SELECT idem_fingerprint(doc) FROM bench_docs WHERE name = '$size';" |
        as_postgres tee "$SCRIPTS/fingerprint_$size.sql" >/dev/null
    echo "SELECT sha256(doc::text::bytea) FROM bench_docs WHERE name = '$size';" |
        as_postgres tee "$SCRIPTS/sha256_$size.sql" >/dev/null
    echo "SELECT sha256(convert_to(doc::text, 'UTF8')) FROM bench_docs WHERE name = '$size';" |
        as_postgres tee "$SCRIPTS/sha256_utf8_$size.sql" >/dev/null
    echo "SELECT jsonb_typeof(doc) FROM bench_docs WHERE name = '$size';" |
        as_postgres tee "$SCRIPTS/floor_$size.sql" >/dev/null
done

RESULTS=$IDEM_TMP/bench/results.txt
as_postgres touch "$RESULTS"
log "pgbench: $REPEATS rounds of ${SECONDS_PER_RUN}s per script, $CLIENTS clients, $JOBS threads"
for round in $(seq 1 "$REPEATS"); do
    for size in 1kb 10kb 1mb; do
        # Alternate the order within a round so neither side always runs
        # first on a warm or cold machine.
        if [ $((round % 2)) -eq 1 ]; then
            variants="fingerprint sha256 sha256_utf8 floor"
        else
            variants="sha256_utf8 sha256 fingerprint floor"
        fi
        for variant in $variants; do
            tps=$(as_postgres "$BINDIR/pgbench" -U postgres -n -M prepared \
                -c "$CLIENTS" -j "$JOBS" -T "$SECONDS_PER_RUN" \
                -f "$SCRIPTS/${variant}_$size.sql" postgres 2>&1 |
                awk '/^tps = / { print $3; exit }')
            [ -n "$tps" ] || { log "pgbench failed for $variant $size"; exit 1; }
            printf '%s %s %s %s\n' "$round" "$size" "$variant" "$tps" |
                as_postgres tee -a "$RESULTS" >/dev/null
            log "round $round $size $variant: $tps tps"
        done
    done
done

# Medians and ratios.
echo
echo "Median transactions per second of $REPEATS runs of ${SECONDS_PER_RUN}s," \
     "$CLIENTS clients, $(nproc) cores; ratio = idem_fingerprint / the other"
echo
awk '
function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++)
        for (j = i + 1; j <= n; j++)
            if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ runs[$2 " " $3] = runs[$2 " " $3] " " $4 }
END {
    printf "| document | idem_fingerprint | sha256(doc::text::bytea) | ratio | sha256(convert_to(doc::text, \x27UTF8\x27)) | ratio | floor: fetch only |\n"
    printf "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    split("1kb 10kb 1mb", sizes, " ")
    for (s = 1; s <= 3; s++) {
        size = sizes[s]
        fp = median(runs[size " fingerprint"])
        sh = median(runs[size " sha256"])
        su = median(runs[size " sha256_utf8"])
        fl = median(runs[size " floor"])
        printf "| %s | %.0f | %.0f | %.2f | %.0f | %.2f | %.0f |\n", size, fp, sh, fp / sh, su, fp / su, fl
    }
}' "$RESULTS"

echo
echo "CPU time per call in one backend (microseconds, median of 3 loops)"
echo
psql_q -A -F ' | ' -P footer=off <<'SQL' | sed -e 's/^/| /' -e 's/$/ |/' -e '2i| --- | ---: | ---: | ---: | ---: | ---: |'
SELECT size AS document,
       round(fp::numeric, 2) AS idem_fingerprint,
       round(sh::numeric, 2) AS "sha256(doc::text::bytea)",
       round((sh / fp)::numeric, 2) AS "speed-up",
       round(su::numeric, 2) AS "sha256(convert_to(doc::text, 'UTF8'))",
       round((su / fp)::numeric, 2) AS "speed-up"
  FROM (VALUES ('1kb', 100000, 1), ('10kb', 10000, 2), ('1mb', 100, 3)) AS s(size, n, ord),
       LATERAL (SELECT bench_median(size, 'idem_fingerprint(doc)', n) AS fp,
                       bench_median(size, 'sha256(doc::text::bytea)', n) AS sh,
                       bench_median(size, 'sha256(convert_to(doc::text, ''UTF8''))', n) AS su) t
 ORDER BY ord;
SQL
