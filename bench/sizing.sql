--
-- Storage per record and per tombstone (docs/operations.md, "Storage
-- sizing"): 20,000 records with a 1 KB JSON body written through
-- idem_claim and idem_complete, in batches of 1,000 (one transaction each),
-- measured after VACUUM FULL; then purged into tombstones (archiving the
-- full records) and measured again.  Run as a superuser on a test server:
--   psql -X -q -f bench/sizing.sql
-- It creates the database idem_sizing and leaves it for inspection.
--
DROP DATABASE IF EXISTS idem_sizing;
CREATE DATABASE idem_sizing;
\c idem_sizing
CREATE EXTENSION idempotency;
SET idempotency.default_ttl = '1d';
-- One transaction per batch of 1,000 (\gexec runs each statement alone).
SELECT format($q$
SELECT count(idem_complete((idem_claim('payments.create', gen_random_uuid()::text,
                                       jsonb_build_object('amount', i, 'currency', 'EUR'))).token,
                           201,
                           jsonb_build_object('id', 'pay_' || i, 'data', repeat('x', 1000 - 30)),
                           jsonb_build_object('Location', '/payments/pay_' || i,
                                              'Content-Type', 'application/json'),
                           'pay_' || i))
  FROM generate_series(%s, %s) i$q$, b * 1000 + 1, b * 1000 + 1000)
  FROM generate_series(0, 19) b
\gexec
VACUUM (FULL, ANALYZE) idem_records;
SELECT 'records' AS what, count(*) AS n,
       pg_column_size(response_body) AS body_bytes
  FROM idem_records GROUP BY 3 LIMIT 1;
SELECT c.relname, pg_relation_size(c.oid) / (SELECT count(*) FROM idem_records) AS bytes_per_row
  FROM pg_class c WHERE c.relname LIKE 'idem_records%' AND c.relkind IN ('r', 'i', 't')
   OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE relname = 'idem_records')
 ORDER BY 1;
SELECT pg_total_relation_size('idem_records') / count(*) AS total_bytes_per_record FROM idem_records;
-- tombstones
UPDATE idem_records SET expires_at = now() - interval '1 hour' - id * interval '1 second';
SET idempotency.tombstone_ttl = '7d';
SET idempotency.cleanup_action = 'archive';
SELECT idem_cleanup(batch_size => 5000, max_batches => 100) AS purged;
VACUUM (FULL, ANALYZE) idem_records;
SELECT count(*) FILTER (WHERE response_body IS NULL) AS tombstones FROM idem_records;
SELECT c.relname, pg_relation_size(c.oid) / (SELECT count(*) FROM idem_records) AS bytes_per_row
  FROM pg_class c WHERE c.relname LIKE 'idem_records%' AND c.relkind IN ('r', 'i')
 ORDER BY 1;
SELECT pg_total_relation_size('idem_records') / count(*) AS total_bytes_per_tombstone FROM idem_records;
-- the archive: one full copy per record
VACUUM (FULL, ANALYZE) idem_records_archive;
SELECT pg_relation_size('idem_records_archive') / count(*) AS archive_table_bytes,
       pg_total_relation_size('idem_records_archive') / count(*) AS archive_total_bytes_per_record
  FROM idem_records_archive;
