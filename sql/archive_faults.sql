--
-- idempotency.cleanup_action = 'archive' when the archive cannot take a
-- copy: nothing is ever purged or deleted without its copy, and nothing is
-- lost silently.  A missing archive table and an error that is no row's
-- fault (a cancel) end the pass clearly with every record as it was; an
-- error that concerns one row skips that row only.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default

-- The passes look at the whole table: start from empty ones (and ids
-- from 1, as the warnings below name records by id).
TRUNCATE idem_records RESTART IDENTITY;
TRUNCATE idem_records_archive;

-- A finished command whose record expired `ago` in the past, with every
-- kind of stored response: headers, raw body, resource id.
CREATE FUNCTION pg_temp.finished(k text, ago interval) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  d idem_decision;
BEGIN
  d := idem_claim('orders.create', k, '{"sku": "A-1"}');
  PERFORM idem_complete(d.token, 201, NULL, '[["Location", "/orders/1"]]',
                        'ORD-1', raw_body => '\x7b7d0a');
  UPDATE idem_records SET expires_at = clock_timestamp() - ago WHERE id = d.record_id;
  RETURN d.record_id;
END $$;

-- Each command: is its record in the table, does it still hold its
-- response, how many full copies of it the archive holds.
CREATE FUNCTION pg_temp.report()
RETURNS TABLE (key text, in_table boolean, holds_response boolean,
               full_copies bigint)
LANGUAGE sql AS $$
  SELECT k.key, r.id IS NOT NULL, r.response_raw_body IS NOT NULL,
         (SELECT count(*) FROM idem_records_archive a
           WHERE a.key = k.key AND a.state = 'succeeded'
             AND a.response_status = 201
             AND a.response_raw_body = '\x7b7d0a'
             AND a.response_headers = '[["Location", "/orders/1"]]'
             AND a.resource_id = 'ORD-1')
    FROM (SELECT key FROM idem_records
          UNION SELECT key FROM idem_records_archive) AS k
    LEFT JOIN idem_records r USING (key)
   ORDER BY k.key
$$;

SET idempotency.cleanup_action = 'archive';
SELECT pg_temp.finished('a-purged', '1 hour') IS NOT NULL AS added;
SELECT pg_temp.finished('b-deleted', '8 days') IS NOT NULL AS added;

--
-- 1. The archive table renamed away: cleanup refuses (42P01) and neither
-- purges nor deletes; under its name again, it archives and proceeds.
--
ALTER TABLE idem_records_archive RENAME TO idem_records_archive_moved;
SELECT idem_cleanup() AS cleaned;
ALTER TABLE idem_records_archive_moved RENAME TO idem_records_archive;
SELECT * FROM pg_temp.report();
-- Renamed after this session prepared its plans (in this call, which
-- archives a-purged and b-deleted): the same.
SELECT idem_cleanup() AS cleaned;
SELECT pg_temp.finished('c-late', '1 hour') IS NOT NULL AS added;
ALTER TABLE idem_records_archive RENAME TO idem_records_archive_moved;
SELECT idem_cleanup() AS cleaned;
ALTER TABLE idem_records_archive_moved RENAME TO idem_records_archive;
SELECT * FROM pg_temp.report();

-- With cleanup_action = 'delete' the missing archive is not needed.
BEGIN;
ALTER TABLE idem_records_archive RENAME TO idem_records_archive_moved;
SET LOCAL idempotency.cleanup_action = 'delete';
SELECT idem_cleanup() AS cleaned;
ROLLBACK;

-- The archive back: the record is copied, then purged.
SELECT idem_cleanup() AS cleaned;
SELECT * FROM pg_temp.report();

--
-- 2. The archive altered so that no copy fits: a clear error, nothing
-- changed.
--
\set VERBOSITY sqlstate
SELECT pg_temp.finished('d-altered', '1 hour') IS NOT NULL AS added;
BEGIN;
ALTER TABLE idem_records_archive DROP COLUMN response_sealed;
SELECT idem_cleanup() AS cleaned;
ROLLBACK;
\set VERBOSITY terse
SELECT * FROM pg_temp.report();

--
-- 3. A cancel in the middle of a batch (a trigger on the archive raising
-- what a statement_timeout raises): the whole call ends, no record is left
-- half purged and no copy is left behind.
--
CREATE FUNCTION pg_temp.archive_trap() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.key = current_setting('regress.trap_key') THEN
    RAISE EXCEPTION '%', current_setting('regress.trap_message')
      USING ERRCODE = current_setting('regress.trap_code');
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER archive_trap BEFORE INSERT ON idem_records_archive
  FOR EACH ROW EXECUTE FUNCTION pg_temp.archive_trap();
SET regress.trap_key = 'e-cancelled';
SET regress.trap_code = '57014';
SET regress.trap_message = 'canceling statement due to statement timeout';
SELECT pg_temp.finished('e-cancelled', '1 hour') IS NOT NULL AS added;
SELECT idem_cleanup() AS cleaned;
SELECT * FROM pg_temp.report();

-- 4. An error that concerns one row (a check of the archive's owner
-- refusing that copy): that record is skipped with a WARNING naming its id
-- only, and keeps its response; the others are copied and purged.
SET regress.trap_code = '23514';
SET regress.trap_message = 'archive refuses this copy';
SELECT idem_cleanup() AS cleaned;
SELECT * FROM pg_temp.report();

-- The next run, the trap gone, copies and purges it.
DROP TRIGGER archive_trap ON idem_records_archive;
SELECT idem_cleanup() AS cleaned;
SELECT * FROM pg_temp.report();

--
-- 5. The copy is the whole record, every column as it was before the
-- purge, encrypted responses included; and the archive has a column for
-- every column of idem_records, of the same type.
--
SELECT pg_temp.finished('f-plain', '1 hour') AS plain_id \gset
SET idempotency.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT pg_temp.finished('g-sealed', '1 hour') AS sealed_id \gset
RESET idempotency.encryption_key;
CREATE TEMP TABLE before_cleanup AS
  SELECT id, to_jsonb(r) AS rec FROM idem_records r WHERE id IN (:plain_id, :sealed_id);
SELECT idem_cleanup() AS cleaned;
SELECT b.rec->>'key' AS key, b.rec->>'response_sealed' IS NOT NULL AS was_sealed,
       count(a.id) AS copies, bool_and(a.rec = b.rec) AS copy_is_the_record
  FROM before_cleanup b
  LEFT JOIN (SELECT id, to_jsonb(x) - 'archived_at' AS rec
               FROM idem_records_archive x) a USING (id)
 GROUP BY b.rec ORDER BY 1;
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'idem_records'::regclass AND attnum > 0 AND NOT attisdropped
EXCEPT
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'idem_records_archive'::regclass AND attnum > 0 AND NOT attisdropped;

TRUNCATE idem_records;
TRUNCATE idem_records_archive;
