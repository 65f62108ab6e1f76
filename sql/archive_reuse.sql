--
-- idempotency.cleanup_action = 'archive' and a claim that reuses an expired
-- record before cleanup copied it: the earlier command's full record goes
-- to idem_records_archive in the same statement that starts the new one,
-- once per command; with the archive missing the reuse is refused and the
-- record stays as it was.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default

TRUNCATE idem_records RESTART IDENTITY;
TRUNCATE idem_records_archive;

-- A finished command whose record expired `ago` in the past.
CREATE FUNCTION pg_temp.finished(k text, ago interval) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  d idem_decision;
BEGIN
  d := idem_claim('orders.create', k, '{"sku": "A-1"}');
  PERFORM idem_complete(d.token, 201, NULL,
                        '[["Location", "/orders/1"]]', 'ORD-1',
                        raw_body => '\x7b7d0a');
  UPDATE idem_records SET expires_at = clock_timestamp() - ago WHERE id = d.record_id;
  RETURN d.record_id;
END $$;

-- The archive's copies of a key: the first command's, whole.
CREATE FUNCTION pg_temp.copies(k text)
RETURNS TABLE (state idem_state, attempt int, response_status int,
               response_headers jsonb,
               raw_body bytea, resource_id text)
LANGUAGE sql AS $$
  SELECT state, attempt, response_status, response_headers,
         response_raw_body, resource_id
    FROM idem_records_archive WHERE key = k ORDER BY archived_at
$$;

SET idempotency.cleanup_action = 'archive';

-- 1. on_expired => 'proceed' within cleanup_grace of the expiry: the
-- record still holds its response, and a new command takes it over.
SELECT pg_temp.finished('a-grace', '1 second') AS a_id \gset
SELECT claimed_at AS a_claimed_at FROM idem_records WHERE id = :a_id \gset
CREATE TEMP TABLE a_claim AS
  SELECT * FROM idem_claim('orders.create', 'a-grace', '{"sku": "B-2"}',
                           on_expired => 'proceed');
SELECT outcome, attempt, record_id = :a_id AS same_record FROM a_claim;
SELECT * FROM pg_temp.copies('a-grace');
SELECT count(*) AS same_command FROM idem_records_archive
 WHERE key = 'a-grace' AND claimed_at = :'a_claimed_at';

-- 2. tombstone_ttl = 0: any claim past the expiry is a new command.
SET idempotency.tombstone_ttl = 0;
SELECT pg_temp.finished('b-no-tombstone', '1 second') AS b_id \gset
SELECT outcome, attempt
  FROM idem_claim('orders.create', 'b-no-tombstone', '{"sku": "A-1"}');
SELECT * FROM pg_temp.copies('b-no-tombstone');
RESET idempotency.tombstone_ttl;

-- 3. A tombstone purged while cleanup_action was 'delete' (never copied),
-- claimed past its window: its tombstone is what is left, and is copied.
SET idempotency.cleanup_action = 'delete';
SELECT pg_temp.finished('c-tombstone', '1 hour') AS c_id \gset
SELECT idem_cleanup() AS cleaned;
UPDATE idem_records SET expires_at = clock_timestamp() - interval '8 days'
 WHERE id = :c_id;
SET idempotency.cleanup_action = 'archive';
SELECT outcome, attempt
  FROM idem_claim('orders.create', 'c-tombstone', '{"sku": "A-1"}');
SELECT * FROM pg_temp.copies('c-tombstone');

-- 4. A record the purge already copied is not copied again when reused.
SELECT pg_temp.finished('d-copied', '1 hour') AS d_id \gset
SELECT idem_cleanup() AS cleaned;
SELECT outcome, attempt
  FROM idem_claim('orders.create', 'd-copied', '{"sku": "A-1"}',
                  on_expired => 'proceed');
SELECT count(*) AS copies FROM idem_records_archive WHERE key = 'd-copied';

-- The new command of a reused record is archived in its turn, under the
-- same id, when it is reused again.
SELECT token AS a_token FROM a_claim \gset
SELECT idem_complete(:'a_token', 200, '{"second": true}') IS NOT NULL AS completed;
UPDATE idem_records SET expires_at = clock_timestamp() - interval '1 second'
 WHERE id = :a_id;
SELECT outcome, attempt
  FROM idem_claim('orders.create', 'a-grace', '{"sku": "C-3"}',
                  on_expired => 'proceed');
SELECT response_status, response_body, count(*) OVER () AS copies_of_record
  FROM idem_records_archive WHERE id = :a_id ORDER BY archived_at;

-- 5. The archive missing: the reuse is refused (42P01) and the record
-- keeps its command and response; under its name again the reuse goes on.
SELECT pg_temp.finished('e-missing', '1 second') AS e_id \gset
SELECT xmin AS e_xmin FROM idem_records WHERE id = :e_id \gset
ALTER TABLE idem_records_archive RENAME TO idem_records_archive_moved;
SELECT outcome FROM idem_claim('orders.create', 'e-missing', '{"sku": "A-1"}',
                               on_expired => 'proceed');
SELECT xmin = :'e_xmin' AS untouched, response_status
  FROM idem_records WHERE id = :e_id;
-- A claim that reuses nothing needs no archive.
SELECT outcome FROM idem_claim('orders.create', 'e-new', '{"sku": "A-1"}');
ALTER TABLE idem_records_archive_moved RENAME TO idem_records_archive;
SELECT outcome, attempt
  FROM idem_claim('orders.create', 'e-missing', '{"sku": "A-1"}',
                  on_expired => 'proceed');
SELECT * FROM pg_temp.copies('e-missing');

-- 6. With cleanup_action = 'delete' a reuse copies nothing, as before.
SET idempotency.cleanup_action = 'delete';
SELECT pg_temp.finished('f-delete', '1 second') AS f_id \gset
SELECT outcome FROM idem_claim('orders.create', 'f-delete', '{"sku": "A-1"}',
                               on_expired => 'proceed');
SELECT count(*) AS copies FROM idem_records_archive WHERE key = 'f-delete';
RESET idempotency.cleanup_action;

-- 7. An inbox message past its tombstone window is archived when reused.
SET idempotency.cleanup_action = 'archive';
SELECT idem_inbox('billing', 'msg-1', ttl => '1 hour');
UPDATE idem_records SET expires_at = clock_timestamp() - interval '8 days'
 WHERE key = 'msg-1';
SELECT idem_inbox('billing', 'msg-1', ttl => '1 hour');
SELECT state, count(*) AS copies FROM idem_records_archive
 WHERE key = 'msg-1' GROUP BY state;
RESET idempotency.cleanup_action;

TRUNCATE idem_records;
TRUNCATE idem_records_archive;
