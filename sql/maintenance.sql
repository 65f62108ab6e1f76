--
-- The background worker's two passes, run from SQL: idem_expire_leases()
-- and idem_cleanup().  No worker serves this database, so nothing changes
-- behind the test's back.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never

-- The passes look at the whole table: start from an empty one.
TRUNCATE idem_records;

-- Records are deleted as soon as they are past expiry and grace: without
-- tombstones, which expiry.sql tests.
SET idempotency.tombstone_ttl = 0;

-- A helper that inserts processing records the way a claim would.
CREATE FUNCTION pg_temp.add(prefix text, n int, policy text, lease interval,
                            ttl interval DEFAULT '1 day')
RETURNS void LANGUAGE sql AS $$
  INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
      attempt, on_lease_expiry, ttl, locked_until, created_at, claimed_at,
      updated_at, expires_at)
  SELECT '', 'app', 'op', prefix || i, sha256(''), 'processing', 1,
      policy::idem_lease_policy, ttl, now() + lease + i * interval '1 second',
      now() - interval '2 hours',
      now() - interval '2 hours', now() - interval '2 hours', now() + ttl
    FROM generate_series(1, n) i
$$;

-- Bad arguments raise; NULL means the server setting.
SELECT idem_expire_leases(max_rows => 0);
SELECT idem_cleanup(batch_size => -1);
SELECT idem_cleanup(max_batches => 0);
SELECT idem_expire_leases(NULL) AS expired, idem_cleanup(NULL, NULL) AS deleted;

--
-- Lease expiry.  Three leases ended with policy unknown, two with policy
-- retry; one lease is still live.
--
SELECT pg_temp.add('lease-u-', 3, 'unknown', '-3 minutes');
SELECT pg_temp.add('lease-r-', 2, 'retry', '-1 minute');
SELECT pg_temp.add('live-', 1, 'unknown', '1 hour');

-- At most max_rows per call, the oldest lease first.
SELECT idem_expire_leases(max_rows => 2) AS expired;
SELECT key, state FROM idem_records WHERE state <> 'processing' ORDER BY key;
SELECT idem_expire_leases() AS expired;
SELECT idem_expire_leases() AS expired;

-- Only state, updated_at and expires_at (= updated_at + ttl) changed.
SELECT key, state, attempt,
       updated_at > claimed_at AS updated,
       expires_at = updated_at + ttl AS expires_after_ttl,
       locked_until < claimed_at AS lease_kept
  FROM idem_records ORDER BY key;

--
-- Cleanup.  Terminal records that expired an hour ago go; one that expired
-- a minute ago stays (idempotency.cleanup_grace is 10min), so do a
-- terminal record not expired yet, the unknown and retryable records just
-- made (their ttl runs from the lease expiry) and the live lease.
--
SELECT pg_temp.add('done-', 5, 'unknown', '1 hour');
SELECT pg_temp.add('failed-', 1, 'unknown', '1 hour');
SELECT pg_temp.add('recent-', 1, 'unknown', '1 hour');
SELECT pg_temp.add('fresh-', 1, 'unknown', '1 hour');
UPDATE idem_records SET state = 'succeeded', response_status = 200, completed_at = now()
 WHERE key ~ '^(done|recent|fresh)-';
UPDATE idem_records SET state = 'failed', response_status = 422, completed_at = now()
 WHERE key ~ '^failed-';
UPDATE idem_records SET expires_at = now() - interval '1 hour'
 WHERE key ~ '^(done|failed)-';
UPDATE idem_records SET expires_at = now() - interval '1 minute'
 WHERE key ~ '^recent-';

-- Batches of 2, at most 2 of them: 4 rows, oldest expiry first.
SELECT idem_cleanup(batch_size => 2, max_batches => 2) AS deleted;
-- The settings: the remaining 2.
SELECT idem_cleanup() AS deleted;
SELECT idem_cleanup() AS deleted;
SELECT key, state FROM idem_records ORDER BY key;

-- The cleanup statement: one run of the sub-select over the partial index,
-- locking with SKIP LOCKED, then primary key lookups.
SET enable_seqscan = off;
-- (a bitmap scan or a plain index scan, as the statistics of the moment
-- choose, are both fine: only the plain one is shown)
SET enable_bitmapscan = off;
-- (PostgreSQL 17 and later name the sub-select's result "(InitPlan
-- 1).col1" where 15 writes "$1": the plan is shown in 15's words)
CREATE FUNCTION pg_temp.explain(query text) RETURNS SETOF text
LANGUAGE plpgsql AS $f$
DECLARE
  line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
    RETURN NEXT replace(regexp_replace(line, '^(\s*InitPlan 1)$', '\1 (returns $1)'),
                        '(InitPlan 1).col1', '$1');
  END LOOP;
END $f$;
SELECT * FROM pg_temp.explain($$
DELETE FROM public.idem_records AS r
 WHERE r.id = ANY (ARRAY(SELECT c.id FROM public.idem_records AS c
                          WHERE c.state IN ('succeeded', 'failed', 'retryable')
                            AND c.expires_at < now()
                          ORDER BY c.expires_at
                          LIMIT 1000
                          FOR UPDATE SKIP LOCKED))$$) AS "QUERY PLAN";
RESET enable_seqscan;
RESET enable_bitmapscan;

--
-- A record that cannot be processed is skipped with a WARNING naming its
-- id (never its key) and the pass goes on with the others.  Three records
-- hold a ttl that overflows the clock (as 1.0 could store) and the oldest
-- leases, so they come first in every batch; a trigger refuses to delete
-- them once they have expired.
--
TRUNCATE idem_records RESTART IDENTITY;
SELECT pg_temp.add('poison-', 3, 'unknown', '-1 hour');
SELECT pg_temp.add('good-', 3, 'unknown', '-1 minute');
UPDATE idem_records SET ttl = '25000000 mons -740000000 days'
 WHERE key LIKE 'poison-%';

-- Batches of 2: the first two batches meet poison first, yet 2 leases
-- expire; the skipped records do not count against max_rows.
SELECT idem_expire_leases(max_rows => 2) AS expired;
SELECT idem_expire_leases() AS expired;
SELECT id, key, state FROM idem_records ORDER BY id;

CREATE FUNCTION keep_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.key LIKE 'poison-%' THEN
    RAISE EXCEPTION 'record % is kept by a test trigger', OLD.key;
  END IF;
  RETURN OLD;
END $$;
CREATE TRIGGER keep_poison BEFORE DELETE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION keep_poison();
UPDATE idem_records SET state = 'succeeded', response_status = 200,
       completed_at = now();
UPDATE idem_records SET expires_at = now() - interval '1 day' * (10 - id);

-- Cleanup skips them the same way, in batches that meet them first.  The
-- trigger's message quotes the key: the warning names it by its hash prefix
-- instead, the one the application computes as
SELECT left(encode(sha256(convert_to('poison-1', 'UTF8')), 'hex'), 8) AS key_hash;
SELECT idem_cleanup(batch_size => 2, max_batches => 2) AS deleted;
SELECT idem_cleanup() AS deleted;
SELECT id, key, state FROM idem_records ORDER BY id;

-- Both passes in one statement: neither stops the other.
SELECT pg_temp.add('late-', 1, 'unknown', '-1 minute');
SELECT idem_expire_leases() AS expired, idem_cleanup() AS deleted;

-- An error that is no row's fault is raised as it is, not skipped.
CREATE ROLE idem_maint_nopriv;
GRANT EXECUTE ON FUNCTION idem_expire_leases(integer) TO idem_maint_nopriv;
SET ROLE idem_maint_nopriv;
\set VERBOSITY terse
SELECT idem_expire_leases() AS expired;
\set VERBOSITY default
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_expire_leases(integer) FROM idem_maint_nopriv;
DROP ROLE idem_maint_nopriv;

DROP TRIGGER keep_poison ON idem_records;
DROP FUNCTION keep_poison();
TRUNCATE idem_records;

-- A trigger may quote the key escaped: as a literal, an identifier, a
-- field of a row or a JSON string.  Those forms of it are replaced too.
TRUNCATE idem_records RESTART IDENTITY;
SELECT pg_temp.add('esc''a"p\e,', 4, 'unknown', '1 hour');
CREATE FUNCTION keep_quoted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '%', CASE OLD.id
    WHEN 1 THEN 'kept: ' || quote_literal(OLD.key)
    WHEN 2 THEN 'kept: ' || quote_ident(OLD.key)
    WHEN 3 THEN 'kept: ' || ROW(OLD.id, OLD.key)::text
    ELSE 'kept: ' || to_json(OLD.key)::text END;
END $$;
CREATE TRIGGER keep_quoted BEFORE DELETE ON idem_records
  FOR EACH ROW EXECUTE FUNCTION keep_quoted();
UPDATE idem_records SET state = 'succeeded', response_status = 200,
       completed_at = now(), expires_at = now() - interval '1 day';
SELECT idem_cleanup() AS deleted;
DROP TRIGGER keep_quoted ON idem_records;
DROP FUNCTION keep_quoted();
TRUNCATE idem_records;

--
-- The kept plans name the extension's schema: after a rename they are
-- prepared again under the new name.
--
SELECT idem_expire_leases() AS expired;
BEGIN;
ALTER SCHEMA public RENAME TO idem_renamed;
SET LOCAL search_path = idem_renamed;
SELECT pg_temp.add('renamed-', 1, 'unknown', '-1 minute');
SELECT idem_expire_leases() AS expired, idem_cleanup() AS deleted;
ROLLBACK;
SELECT idem_expire_leases() AS expired;

--
-- No worker serves this database; only superusers (and roles granted
-- EXECUTE) may run the passes or start and inspect workers.
--
SELECT count(*) AS workers FROM idem_worker_status()
 WHERE database = current_database();
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_run
  FROM pg_proc p
 WHERE p.proname IN ('idem_expire_leases', 'idem_cleanup', 'idem_launch_worker',
                     'idem_worker_status')
 ORDER BY 1;

TRUNCATE idem_records;

--
-- The passes run as a superuser in the worker: operators someone created in
-- a schema ahead of pg_catalog on the search_path are never used.
--
CREATE SCHEMA trap;
CREATE TABLE trap.calls (what text);
CREATE FUNCTION trap.enum_eq(idem_state, idem_state) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO trap.calls VALUES ('enum =');
  RETURN $1 OPERATOR(pg_catalog.=) $2;
END $$;
CREATE FUNCTION trap.ts_lt(timestamptz, timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO trap.calls VALUES ('timestamptz <');
  RETURN $1 OPERATOR(pg_catalog.<) $2;
END $$;
CREATE OPERATOR trap.= (FUNCTION = trap.enum_eq, LEFTARG = idem_state, RIGHTARG = idem_state);
CREATE OPERATOR trap.< (FUNCTION = trap.ts_lt, LEFTARG = timestamptz, RIGHTARG = timestamptz);
SELECT pg_temp.add('trap-', 2, 'unknown', interval '-1 minute');
UPDATE idem_records SET state = 'succeeded' WHERE key = 'trap-2';
UPDATE idem_records SET expires_at = now() - interval '1 day' WHERE key = 'trap-2';
SET search_path = trap, pg_catalog, public;
-- The trap works on an unqualified query ...
SELECT count(*) AS processing FROM idem_records
 WHERE state = 'processing' AND locked_until < now() + interval '1 day';
SELECT count(*) > 0 AS trap_fired FROM trap.calls;
TRUNCATE trap.calls;
-- ... and the passes never spring it.
SELECT idem_expire_leases() AS expired, idem_cleanup() AS deleted;
SELECT count(*) AS trap_calls FROM trap.calls;
RESET search_path;
DROP SCHEMA trap CASCADE;
