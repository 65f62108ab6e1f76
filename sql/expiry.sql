--
-- Expiry you can publish: a late retry of a finished command is answered
-- expired instead of running the command again, cleanup keeps the record
-- as a tombstone (its response purged) until idempotency.tombstone_ttl
-- after its expiry, and only then deletes it.
--
-- Nothing here waits for time to pass: the table's owner moves expires_at
-- into the past (an update that keeps a finished state is not a transition,
-- so the guard allows it).
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default

-- The passes look at the whole table: start from an empty one.
TRUNCATE idem_records;

-- The default window: seven days.
SHOW idempotency.tombstone_ttl;

-- A helper: a finished command whose record expired `ago` in the past.
CREATE FUNCTION pg_temp.finished(k text, ago interval) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  d idem_decision;
BEGIN
  d := idem_claim('orders.create', k, '{"sku": "A-1", "qty": 2}');
  PERFORM idem_complete(d.token, 201, '{"order": "ORD-1"}',
                        '{"Location": "/orders/ORD-1"}', 'ORD-1');
  UPDATE idem_records SET expires_at = clock_timestamp() - ago WHERE id = d.record_id;
  RETURN d.record_id;
END $$;

-- What a record keeps, without its key or times.
CREATE FUNCTION pg_temp.kept(record_id bigint)
RETURNS TABLE (state idem_state, attempt int, response_status int,
               has_headers boolean, has_body boolean, has_raw_body boolean,
               has_sealed boolean, resource_id text, fingerprint_kept boolean)
LANGUAGE sql AS $$
  SELECT state, attempt, response_status, response_headers IS NOT NULL,
         response_body IS NOT NULL, response_raw_body IS NOT NULL,
         response_sealed IS NOT NULL, resource_id,
         fingerprint = idem_fingerprint('{"sku": "A-1", "qty": 2}')
    FROM idem_records WHERE id = record_id
$$;

--
-- 1. A record past its expiry, not yet cleaned up: a late retry is told
-- expired (409, IDEMPOTENCY_KEY_EXPIRED, no token) and nothing is written.
--
SELECT pg_temp.finished('late-retry', '1 second') AS late_id \gset
SELECT xmin AS xmin_before FROM idem_records WHERE id = :late_id \gset
SELECT outcome, token IS NULL AS no_token, record_id = :late_id AS same_record,
       state, attempt, http_status, error_code, headers, body, raw_body,
       resource_id, retry_after
  FROM idem_claim('orders.create', 'late-retry', '{"sku": "A-1", "qty": 2}');
-- A different request gets the same answer: the key is expired whatever
-- it is sent with.
SELECT outcome FROM idem_claim('orders.create', 'late-retry', '{"sku": "B-2"}');
SELECT xmin = :'xmin_before' AS untouched FROM idem_records WHERE id = :late_id;

-- idem_replay shows it the same way.
SELECT outcome, state, http_status, error_code, body IS NULL AS no_body
  FROM idem_replay('orders.create', 'late-retry');

-- 2. Bad on_expired values are refused before anything is read or written.
SELECT outcome FROM idem_claim('orders.create', 'late-retry', on_expired => 'maybe');
SELECT outcome FROM idem_claim('orders.create', 'never-seen', on_expired => 'Proceed');
SELECT outcome FROM idem_claim('orders.create', 'never-seen', on_expired => NULL);
SELECT count(*) AS nothing_written FROM idem_records WHERE key = 'never-seen';
SELECT xmin = :'xmin_before' AS untouched FROM idem_records WHERE id = :late_id;

-- 3. The caller that checked the resource and wants to run the command
-- again says so: a new command, attempt 1, with a token.
SELECT outcome, token IS NOT NULL AS has_token, state, attempt
  FROM idem_claim('orders.create', 'late-retry', '{"sku": "A-1", "qty": 2}',
                  on_expired => 'proceed');
-- on_expired changes nothing for a record that has not expired.
SELECT outcome, attempt
  FROM idem_claim('orders.create', 'late-retry', '{"sku": "A-1", "qty": 2}',
                  on_expired => 'proceed', wait => '0');

-- 4. Cleanup.  Past expiry and idempotency.cleanup_grace (10 minutes) the
-- response is purged; the rest stays until tombstone_ttl after the expiry.
SELECT pg_temp.finished('in-grace', '1 minute') AS grace_id \gset
SELECT pg_temp.finished('tombstone', '1 hour') AS tomb_id \gset
SELECT pg_temp.finished('window-over', '7 days 1 hour') AS over_id \gset
-- Sealed responses are purged as well.
SET idempotency.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT pg_temp.finished('sealed', '2 hours') AS sealed_id \gset
RESET idempotency.encryption_key;
SELECT * FROM pg_temp.kept(:sealed_id);

-- One record deleted (window-over), two purged (tombstone, sealed).
SELECT idem_cleanup() AS cleaned;
SELECT key, state FROM idem_records ORDER BY key;

-- The tombstone keeps scope, key, fingerprint, state, status and times.
SELECT * FROM pg_temp.kept(:tomb_id);
SELECT * FROM pg_temp.kept(:sealed_id);
SELECT created_at IS NOT NULL AND completed_at IS NOT NULL
       AND expires_at < now() AS times_kept
  FROM idem_records WHERE id = :tomb_id;
-- The one within grace keeps its response.
SELECT * FROM pg_temp.kept(:grace_id);

-- Tombstones and expired records answer expired; replay shows the tombstone.
SELECT key, c.outcome, c.http_status, c.error_code, c.body
  FROM (VALUES ('in-grace'), ('tombstone'), ('sealed')) AS k(key),
       idem_claim('orders.create', k.key, '{"sku": "A-1", "qty": 2}') c
 ORDER BY key;
SELECT outcome, state, attempt, record_id = :tomb_id AS same_record
  FROM idem_replay('orders.create', 'tombstone');

-- A second run finds nothing more to do: purged records are not picked again.
SELECT idem_cleanup() AS cleaned;

-- 5. Past the tombstone window, a record still in the table (cleanup has
-- not run) is a new command, as without tombstones; replay shows nothing.
SELECT pg_temp.finished('window-over-2', '8 days') AS over2_id \gset
SELECT count(*) AS no_row FROM idem_replay('orders.create', 'window-over-2');
SELECT outcome, attempt, record_id = :over2_id AS same_record
  FROM idem_claim('orders.create', 'window-over-2', '{"other": true}');

-- 6. The purge is one chunked statement over idem_records_unpurged, which
-- holds no tombstone: it never walks the records it already purged.
SET enable_seqscan = off;
EXPLAIN (COSTS OFF)
SELECT p.id FROM idem_records AS p
 WHERE p.state OPERATOR(pg_catalog.=) ANY ('{succeeded,failed,retryable}'::idem_state[])
   AND (p.response_headers IS NOT NULL OR p.response_body IS NOT NULL
        OR p.response_raw_body IS NOT NULL OR p.response_sealed IS NOT NULL
        OR p.resource_id IS NOT NULL)
   AND p.expires_at < now()
 ORDER BY p.expires_at LIMIT 10 FOR UPDATE SKIP LOCKED;
RESET enable_seqscan;

-- 7. The tombstone window is measured from expires_at; with
-- tombstone_ttl 0 an expired record is a new command at once, and cleanup
-- deletes instead of purging, as without tombstones.
SET idempotency.tombstone_ttl = 0;
SELECT outcome, attempt
  FROM idem_claim('orders.create', 'tombstone', '{"sku": "A-1", "qty": 2}');
SELECT pg_temp.finished('no-tombstone', '1 hour') AS none_id \gset
SELECT idem_cleanup() AS cleaned;
SELECT count(*) AS left_over FROM idem_records WHERE id IN (:none_id, :sealed_id);
RESET idempotency.tombstone_ttl;

-- Negative windows are refused by the setting itself (22023; the message
-- is PostgreSQL's, worded differently by each version).
\set VERBOSITY sqlstate
SET idempotency.tombstone_ttl = -1;
\set VERBOSITY default

-- Application roles cannot change the window they are answered by.
CREATE ROLE regress_expiry_app;
SET ROLE regress_expiry_app;
SET idempotency.tombstone_ttl = 0;
RESET ROLE;
DROP ROLE regress_expiry_app;
-- (in the SQL edition the settings are placeholders and both SETs above
-- succeed: the window is back to its default for what follows)
RESET idempotency.tombstone_ttl;

--
-- 8. idempotency.cleanup_action = 'archive': before a record's response is
-- purged, or the record deleted, its full copy goes to idem_records_archive,
-- once per command.  The extension never deletes from the archive.
--
SELECT extconfig @> ARRAY['idem_records_archive'::regclass::oid] AS dumped_by_pg_dump
  FROM pg_extension WHERE extname = 'idempotency';
SELECT has_table_privilege('public', 'idem_records_archive', 'SELECT') AS public_can_read;

SET idempotency.cleanup_action = 'archive';
SELECT pg_temp.finished('archived', '1 hour') AS arch_id \gset
SELECT pg_temp.finished('archived-gone', '8 days') AS arch_gone_id \gset
SELECT claimed_at AS arch_claimed_at FROM idem_records WHERE id = :arch_id \gset
SELECT idem_cleanup() AS cleaned;

-- The stored row no longer holds the response; the archive holds all of it.
SELECT * FROM pg_temp.kept(:arch_id);
SELECT key, state, response_status, response_headers, response_body, resource_id,
       key <> 'archived' OR claimed_at = :'arch_claimed_at' AS same_command,
       archived_at >= expires_at AS archived_after_expiry
  FROM idem_records_archive ORDER BY key;
SELECT count(*) AS deleted_still_gone FROM idem_records WHERE id = :arch_gone_id;

-- Cleanup again, and the tombstone's deletion once past its window: no
-- second copy of the same command.
UPDATE idem_records SET expires_at = now() - interval '8 days' WHERE id = :arch_id;
SELECT idem_cleanup() AS cleaned;
SELECT key, count(*) AS copies FROM idem_records_archive GROUP BY key ORDER BY key;

-- A record reused for a new command is archived again under the same id.
SELECT pg_temp.finished('reused', '1 hour') AS reused_id \gset
SELECT idem_cleanup() AS cleaned;
SELECT token AS reuse_token
  FROM idem_claim('orders.create', 'reused', '{"sku": "A-1", "qty": 2}',
                  on_expired => 'proceed') \gset
SELECT idem_complete(:'reuse_token', 200, '{"second": true}');
UPDATE idem_records SET expires_at = now() - interval '1 hour' WHERE id = :reused_id;
SELECT idem_cleanup() AS cleaned;
SELECT key, response_body, count(*) OVER (PARTITION BY id) AS copies_of_record
  FROM idem_records_archive WHERE key = 'reused' ORDER BY archived_at;

-- Back to deleting: nothing more is copied.
RESET idempotency.cleanup_action;
SELECT pg_temp.finished('not-archived', '8 days') IS NOT NULL AS added;
SELECT idem_cleanup() AS cleaned;
SELECT count(*) AS not_archived FROM idem_records_archive WHERE key = 'not-archived';

-- Bad values are refused by the setting itself, and only superusers set it.
SET idempotency.cleanup_action = 'keep';
CREATE ROLE regress_archive_app;
SET ROLE regress_archive_app;
SET idempotency.cleanup_action = 'delete';
SELECT count(*) FROM idem_records_archive;
RESET ROLE;
DROP ROLE regress_archive_app;
TRUNCATE idem_records_archive;

--
-- A backlog past both cutoffs is deleted, never purged first: when cleanup
-- stops at max_batches, purge leaves the rest to the next run's deletion
-- instead of rewriting rows that are about to go, and purges the records
-- of its own window.
--
TRUNCATE idem_records;
SELECT count(pg_temp.finished('backlog-' || g, '8 days')) AS backlog
  FROM generate_series(1, 5) AS g;
SELECT pg_temp.finished('in-window', '1 hour') AS window_id \gset
SELECT idem_cleanup(2, 1) AS cleaned;
SELECT count(*) AS backlog_left,
       count(*) FILTER (WHERE response_body IS NULL) AS backlog_purged
  FROM idem_records WHERE key LIKE 'backlog-%';
SELECT * FROM pg_temp.kept(:window_id);
SELECT idem_cleanup(2, 2) AS cleaned;
SELECT count(*) AS backlog_left FROM idem_records WHERE key LIKE 'backlog-%';


--
-- A record past both cutoffs whose deletion is refused (here by a trigger;
-- a foreign key of the application's does the same) is skipped by cleanup
-- with a warning; purge leaves that range to cleanup, so cleanup purges it
-- itself: it does not keep its response past the expiry.  The next run
-- tries the deletion again and does not rewrite the tombstone.
--
TRUNCATE idem_records RESTART IDENTITY;
CREATE FUNCTION pg_temp.refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.key LIKE 'refused-%' THEN
    RAISE EXCEPTION 'deletion refused by the application';
  END IF;
  RETURN OLD;
END $$;
CREATE TRIGGER refuse_delete BEFORE DELETE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_delete();
SELECT pg_temp.finished('refused-1', '8 days') AS refused_id \gset
SELECT count(pg_temp.finished('gone-' || g, '8 days')) AS deletable
  FROM generate_series(1, 3) AS g;
SELECT idem_cleanup(2, 5) AS cleaned;
SELECT key FROM idem_records ORDER BY key;
SELECT * FROM pg_temp.kept(:refused_id);
SELECT xmin AS xmin_tombstone FROM idem_records WHERE id = :refused_id \gset
SELECT idem_cleanup(2, 5) AS cleaned;
SELECT xmin = :'xmin_tombstone' AS not_rewritten
  FROM idem_records WHERE id = :refused_id;
-- With archiving, the refused record is copied once, with its response,
-- before it is purged, and not again at the next run.
SET idempotency.cleanup_action = 'archive';
SELECT pg_temp.finished('refused-2', '8 days') AS refused2_id \gset
SELECT idem_cleanup(2, 5) AS cleaned;
SELECT idem_cleanup(2, 5) AS cleaned;
SELECT count(*) AS copies, bool_and(response_body IS NOT NULL) AS with_response
  FROM idem_records_archive WHERE id = :refused2_id;
SELECT * FROM pg_temp.kept(:refused2_id);
RESET idempotency.cleanup_action;
TRUNCATE idem_records_archive;
DROP TRIGGER refuse_delete ON idem_records;
SELECT idem_cleanup(2, 5) AS cleaned;
SELECT count(*) AS left_over FROM idem_records;


--
-- A trigger may also refuse a deletion silently (a BEFORE DELETE trigger
-- returning NULL): no error, the row just stays.  The records it keeps
-- must not hold the others back: with more of them than a batch holds,
-- cleanup still deletes the rest, and they keep no response either.
--
TRUNCATE idem_records RESTART IDENTITY;
CREATE FUNCTION pg_temp.keep_silently() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.key LIKE 'silent-%' THEN
    RETURN NULL;
  END IF;
  RETURN OLD;
END $$;
CREATE TRIGGER keep_silently BEFORE DELETE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION pg_temp.keep_silently();
SELECT count(pg_temp.finished('silent-' || g, '9 days')) AS silent
  FROM generate_series(1, 3) AS g;
SELECT count(pg_temp.finished('gone-' || g, '8 days')) AS deletable
  FROM generate_series(1, 3) AS g;
SELECT idem_cleanup(2, 5) AS cleaned;
SELECT key, response_body IS NULL AS purged FROM idem_records ORDER BY key;
DROP TRIGGER keep_silently ON idem_records;

--
-- A BEFORE UPDATE trigger may keep a row by returning OLD: the row is
-- written again as it was, and the statement reports it as changed.  A
-- row its pass's statement leaves as due as before is kept, whatever the
-- statement reports: set aside with the WARNING, not counted in what the
-- pass returns or in idem_stat_operations, and not written again batch
-- after batch, whether the batch is full or short.  Purge and lease
-- expiry are both UPDATEs.
--
TRUNCATE idem_records RESTART IDENTITY;
SELECT count(pg_temp.finished('as-is-' || g, '1 hour')) AS kept_as_is
  FROM generate_series(1, 2) AS g;
SELECT count(pg_temp.finished('purgeable-' || g, '1 hour')) AS purgeable
  FROM generate_series(1, 2) AS g;
SELECT outcome FROM idem_claim('orders.create', 'as-is-lease', '{}');
SELECT outcome FROM idem_claim('orders.create', 'lease-ends', '{}');
UPDATE idem_records SET locked_until = now() - interval '2 minutes'
 WHERE key = 'as-is-lease';
UPDATE idem_records SET locked_until = now() - interval '1 minute'
 WHERE key = 'lease-ends';
CREATE FUNCTION pg_temp.keep_as_is() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.key LIKE 'as-is-%' THEN
    RETURN OLD;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER keep_as_is BEFORE UPDATE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION pg_temp.keep_as_is();
CREATE TEMP TABLE counted_before AS
  SELECT sum(records_purged) AS purged, sum(leases_expired_unknown) AS expired
    FROM idem_stat_operations WHERE operation = 'orders.create';
-- full batches of kept rows, then a short one
SELECT idem_cleanup(2, 5) AS cleaned;
SELECT idem_cleanup(1, 5) AS cleaned;
SELECT idem_cleanup(10, 5) AS cleaned;
SELECT idem_expire_leases(1) AS expired;
SELECT idem_expire_leases(5) AS expired;
SELECT key, state, response_body IS NULL AS purged FROM idem_records ORDER BY key;
SELECT sum(s.records_purged) - b.purged AS purged_counted,
       sum(s.leases_expired_unknown) - b.expired AS expired_counted
  FROM idem_stat_operations s, counted_before b
 WHERE s.operation = 'orders.create'
 GROUP BY b.purged, b.expired;
DROP TABLE counted_before;
DROP TRIGGER keep_as_is ON idem_records;

-- Past the cleanup cutoff, a record whose deletion a trigger refuses is
-- purged instead; when the purge is kept as well, the record is left as it
-- is, not counted as a tombstone, and the WARNING says so.
TRUNCATE idem_records RESTART IDENTITY;
SELECT count(pg_temp.finished('kept-old', '9 days')) AS kept_old;
CREATE FUNCTION pg_temp.keep_everything() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    RETURN NULL;
  END IF;
  RETURN OLD;
END $$;
CREATE TRIGGER keep_everything BEFORE UPDATE OR DELETE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION pg_temp.keep_everything();
SELECT idem_cleanup(10, 5) AS cleaned;
SELECT key, response_body IS NULL AS purged FROM idem_records ORDER BY key;
DROP TRIGGER keep_everything ON idem_records;

-- An AFTER trigger that undoes the purge makes the row due again at once:
-- the look at the end of the batch sets it aside instead of purging it
-- again, batch after batch.
TRUNCATE idem_records RESTART IDENTITY;
SELECT count(pg_temp.finished('restored', '1 hour')) AS restored;
CREATE FUNCTION pg_temp.restore_response() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.response_body IS NULL AND OLD.response_body IS NOT NULL
     AND pg_trigger_depth() = 1 THEN
    UPDATE idem_records SET response_body = OLD.response_body WHERE id = NEW.id;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER restore_response AFTER UPDATE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION pg_temp.restore_response();
SELECT idem_cleanup(10, 5) AS cleaned;
SELECT key, response_body IS NULL AS purged FROM idem_records ORDER BY key;
DROP TRIGGER restore_response ON idem_records;


--
-- tombstone_ttl at its maximum (about 68 years) puts the cleanup cutoff in
-- the 1950s, well inside the calendar: a record that expired 60 years ago
-- is purged, one from 1900 is deleted, nothing wraps or fails.
--
TRUNCATE idem_records RESTART IDENTITY;
SET idempotency.tombstone_ttl = 2147483647;
SELECT count(pg_temp.finished('sixty-years', '60 years'));
SELECT count(pg_temp.finished('in-1900', now() - '1900-01-01'::timestamptz));
SELECT idem_cleanup() AS cleaned;
SELECT key, response_body IS NULL AS purged FROM idem_records ORDER BY key;
RESET idempotency.tombstone_ttl;

TRUNCATE idem_records;
