--
-- Version 1.0 installed, records of every state stored, then ALTER
-- EXTENSION UPDATE to 1.1 and on to the default version: every record is
-- kept byte for byte, replays as before, and 1.0 tokens still complete
-- their attempts.  The updated extension's objects equal those of a fresh
-- install of the default version.
--
-- In a database of its own, so that the other tests' extension is untouched.
--
CREATE DATABASE idem_upgrade;
\c idem_upgrade
SET client_min_messages = warning;

CREATE EXTENSION idempotency VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- One record in each state, through the 1.0 API.
SELECT token AS succeeded_token FROM idem_claim('op', 'succeeded', '{"b": 1, "a": [1.50, "x"]}') \gset
SELECT idem_complete(:'succeeded_token', 201, '{"id": "pay_1", "amount": 1.50}',
                     '{"Location": "/payments/pay_1"}', resource_id => 'pay_1');
SELECT token AS failed_token FROM idem_claim('op', 'failed', '{"n": 2}') \gset
SELECT idem_fail(:'failed_token', 422, '{"error": "card declined"}');
SELECT token AS retryable_token FROM idem_claim('op', 'retryable', '{"n": 3}') \gset
SELECT idem_fail(:'retryable_token', 503, retryable => true);
SELECT token AS processing_token FROM idem_claim('op', 'processing', '{"n": 4}', lease => '1h') \gset
SELECT idem_checkpoint(:'processing_token', 'step-2');
-- A lease of a microsecond has ended by the next statement: the next claim
-- marks the record unknown.
SELECT token IS NOT NULL AS claimed FROM idem_claim('op', 'unknown', '{"n": 5}', lease => '1 microsecond');
SELECT outcome FROM idem_claim('op', 'unknown', '{"n": 5}');
-- A finished record past its expiry that cleanup has not deleted yet.
SELECT token AS late_token FROM idem_claim('op', 'expired-before-update', '{"n": 6}') \gset
SELECT idem_complete(:'late_token', 201, '{"id": "late"}');
UPDATE idem_records SET expires_at = now() - interval '1 hour'
 WHERE key = 'expired-before-update';

-- Encryption needs 1.1's columns: under 1.0 a completion refuses clearly
-- instead of storing the response in plaintext.
SET idempotency.encryption_key = '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f';
SELECT token AS sealed_token FROM idem_claim('op', 'needs-1.1', lease => '1h') \gset
SELECT idem_complete(:'sealed_token', 200, '{"secret": 1}');
RESET idempotency.encryption_key;

-- A record of a role dropped before the update: 1.3 finds no role of its
-- name, and keeps it, matched by no role.
CREATE ROLE regress_upgrade_gone;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete TO regress_upgrade_gone;
SET ROLE regress_upgrade_gone;
SELECT token AS gone_token FROM idem_claim('op', 'of-a-dropped-role', '{"n": 8}') \gset
SELECT idem_complete(:'gone_token', 201, '{"secret": "of the dropped role"}');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_claim, idem_complete FROM regress_upgrade_gone;
DROP ROLE regress_upgrade_gone;

SELECT key, state, attempt FROM idem_records ORDER BY key;

-- Every column of every record, as 1.0 stored it.
CREATE FUNCTION pg_temp.records_digest() RETURNS text LANGUAGE sql AS $$
  SELECT md5(string_agg(format('%s', (id, role, tenant, caller, operation, key,
                                      fingerprint, state, attempt, attempt_token,
                                      recovery_point, locked_until, on_lease_expiry,
                                      ttl, response_status, response_headers,
                                      response_body, resource_id, created_at,
                                      claimed_at, updated_at, completed_at,
                                      expires_at)), ',' ORDER BY id))
    FROM idem_records
$$;
SELECT pg_temp.records_digest() AS digest_1_0 \gset

-- Under 1.0's declaration (nine arguments, no on_expired, a decision of
-- twelve columns) the library keeps 1.0's answers for a record past its
-- expiry: idem_replay shows no row, a claim is a new command, attempt 1.
SELECT count(*) AS no_row FROM idem_replay('op', 'expired-before-update');
-- Archiving needs 1.1's table: until the update, cleanup with
-- cleanup_action = 'archive' refuses instead of deleting records uncopied.
SET idempotency.cleanup_action = 'archive';
SELECT idem_cleanup() AS cleaned;
RESET idempotency.cleanup_action;
SELECT count(*) AS still_there FROM idem_records WHERE key = 'expired-before-update';
SELECT token AS expired_token FROM idem_claim('op', 'expired-under-1.0') \gset
SELECT idem_complete(:'expired_token', 200);
UPDATE idem_records SET expires_at = now() - interval '1 second'
 WHERE key = 'expired-under-1.0';
SELECT outcome, attempt FROM idem_claim('op', 'expired-under-1.0');
DELETE FROM idem_records WHERE key = 'expired-under-1.0';

-- The application's grants, as the 1.0 README told users to make them.
CREATE ROLE regress_upgrade_app;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_resolve
   TO regress_upgrade_app;
GRANT SELECT ON idem_stats TO regress_upgrade_app;

-- 1.0 to 1.1, then 1.1 to the default version: every record is kept at
-- each step.
ALTER EXTENSION idempotency UPDATE TO '1.1';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT pg_temp.records_digest() = :'digest_1_0' AS every_record_kept;
ALTER EXTENSION idempotency UPDATE TO '1.2';
SELECT pg_temp.records_digest() = :'digest_1_0' AS every_record_kept;
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- 1.3 keeps a record's role by its identity, and a caller that was the
-- role's own name as the empty string: read back as names, every column of
-- every record is as 1.0 stored it.  The dropped role's record keeps its
-- name in former_role, and belongs to no role.
CREATE FUNCTION pg_temp.records_digest_1_3() RETURNS text LANGUAGE sql AS $$
  SELECT md5(string_agg(format('%s', (id, coalesce(role::text, former_role), tenant,
                                      CASE WHEN caller = '' THEN role::text ELSE caller END,
                                      operation, key,
                                      fingerprint, state, attempt, attempt_token,
                                      recovery_point, locked_until, on_lease_expiry,
                                      ttl, response_status, response_headers,
                                      response_body, resource_id, created_at,
                                      claimed_at, updated_at, completed_at,
                                      expires_at)), ',' ORDER BY id))
    FROM idem_records
$$;
SELECT pg_temp.records_digest_1_3() = :'digest_1_0' AS every_record_kept;
SELECT key, role, former_role, caller, pg_typeof(role) AS role_type
  FROM idem_records ORDER BY key;
SELECT key, role_oid, former_role, caller, state FROM idem_records_without_role();
-- No role reaches it, a new role of the dropped role's name included.
CREATE ROLE regress_upgrade_gone;
GRANT EXECUTE ON FUNCTION idem_claim TO regress_upgrade_gone;
SET ROLE regress_upgrade_gone;
SELECT outcome, body FROM idem_claim('op', 'of-a-dropped-role', '{"n": 8}');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_claim FROM regress_upgrade_gone;
DELETE FROM idem_records WHERE key = 'of-a-dropped-role' AND role = to_regrole('regress_upgrade_gone');
DROP ROLE regress_upgrade_gone;

-- The functions that gained raw_body keep those grants, as grants of the
-- user's (not in pg_init_privs), so that pg_dump still dumps them; 1.2's
-- idem_claim_text is granted to whoever may execute idem_claim, the same way.
SELECT p.oid::regprocedure AS function,
       has_function_privilege('regress_upgrade_app', p.oid, 'EXECUTE') AS app_may_execute,
       i.initprivs::text NOT LIKE '%regress_upgrade_app%' AS grant_is_the_users
  FROM pg_proc p JOIN pg_init_privs i ON i.objoid = p.oid AND i.classoid = 'pg_proc'::regclass
 WHERE p.proname IN ('idem_claim', 'idem_claim_text', 'idem_complete', 'idem_fail', 'idem_resolve')
 ORDER BY p.proname;
-- idem_stats, replaced to add cleanup_overdue, keeps the grant made on it;
-- the objects 1.1 adds are granted to nobody.
SELECT has_table_privilege('regress_upgrade_app', 'idem_stats', 'SELECT') AS stats_grant_kept,
       has_table_privilege('regress_upgrade_app', 'idem_stat_operations', 'SELECT') AS may_read_counters,
       has_function_privilege('regress_upgrade_app', 'idem_stat_operations()', 'EXECUTE') AS may_count,
       has_function_privilege('regress_upgrade_app', 'idem_stat_reset()', 'EXECUTE') AS may_reset,
       has_function_privilege('regress_upgrade_app', 'idem_list(text, text, interval, integer)', 'EXECUTE') AS may_list;
SELECT operation, state, records, expired_awaiting_cleanup, cleanup_overdue FROM idem_stats ORDER BY state;
REVOKE EXECUTE ON FUNCTION idem_claim, idem_claim_text, idem_complete, idem_fail, idem_resolve
  FROM regress_upgrade_app;
REVOKE SELECT ON idem_stats FROM regress_upgrade_app;
DROP ROLE regress_upgrade_app;

-- A new key claimed in a transaction block is written once, as in a fresh
-- install: not in the table before its completion.
BEGIN;
SELECT token AS once_token FROM idem_claim('op', 'written-once', '{"n": 7}') \gset
SELECT count(*) AS written_yet FROM idem_records WHERE key = 'written-once';
SELECT idem_complete(:'once_token', 201, '{"id": 7}');
SELECT state, response_status FROM idem_records WHERE key = 'written-once';
COMMIT;

-- The records answer as before.
SELECT key, outcome, state, attempt, http_status, headers, body, resource_id, error_code
  FROM (VALUES ('succeeded', '{"a": [1.5, "x"], "b": 1}'::jsonb), ('failed', '{"n": 2}'),
               ('processing', '{"n": 4}'), ('unknown', '{"n": 5}')) AS r(key, request),
       idem_claim('op', r.key, r.request)
 ORDER BY key;
-- idem_claim_text answers the same from the records 1.0 stored.
SELECT key, outcome, state, http_status, body
  FROM (VALUES ('succeeded', '{"b": 1, "a": [1.50, "x"]}'), ('failed', '{"n": 2}'),
               ('failed', '{"n": 3}')) AS r(key, request),
       idem_claim_text('op', r.key, r.request, '')
 ORDER BY key, outcome;
SELECT outcome, attempt, recovery_point
  FROM idem_claim('op', 'retryable', '{"n": 3}', lease => '1h');
-- A record that expired before the update is a tombstone now, as the
-- CHANGELOG says: a late retry is answered expired, idem_replay shows it.
SELECT outcome, token IS NULL AS no_token, http_status, error_code, body
  FROM idem_claim('op', 'expired-before-update', '{"n": 6}');
SELECT outcome, state, body FROM idem_replay('op', 'expired-before-update');

-- A token issued by 1.0 completes its attempt; an unknown record resolves.
SELECT idem_complete(:'processing_token', 200, '{"done": true}');
SELECT outcome, state, http_status, body FROM idem_replay('op', 'processing');
SELECT idem_resolve(id, 'succeeded', 200, '{"reconciled": true}')
  FROM idem_records WHERE key = 'unknown';
SELECT outcome, state, body FROM idem_replay('op', 'unknown');

--
-- The extension's objects after the update equal a fresh install's: every
-- member with its definition, privileges and comment, and the table's
-- columns, indexes, constraints and triggers.
--
CREATE FUNCTION pg_temp.extension_objects() RETURNS SETOF text LANGUAGE sql AS $$
  SELECT pg_describe_object(d.classid, d.objid, 0) || ' = ' ||
         coalesce(CASE d.classid
           WHEN 'pg_proc'::regclass THEN
             (SELECT pg_get_functiondef(p.oid) || ' acl ' || coalesce(p.proacl::text, '-')
                FROM pg_proc p WHERE p.oid = d.objid)
           WHEN 'pg_class'::regclass THEN
             (SELECT c.relkind::text || ' acl ' || coalesce(c.relacl::text, '-') || ' columns ' ||
                     coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
                                                 ' ' || a.attnotnull || ' ' || a.attidentity::text ||
                                                 ' ' || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-') ||
                                                 ' ' || coalesce(co.collname, '-'),
                                                 ', ' ORDER BY a.attnum)
                                 FROM pg_attribute a
                                 LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                                 LEFT JOIN pg_collation co ON co.oid = a.attcollation
                                WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '-') ||
                     CASE WHEN c.relkind = 'v' THEN ' view ' || pg_get_viewdef(c.oid) ELSE '' END ||
                     ' indexes ' || coalesce((SELECT string_agg(pg_get_indexdef(i.indexrelid), '; ' ORDER BY 1)
                                                FROM pg_index i WHERE i.indrelid = c.oid), '-') ||
                     ' constraints ' || coalesce((SELECT string_agg(k.conname || ' ' || pg_get_constraintdef(k.oid), '; ' ORDER BY k.conname)
                                                    FROM pg_constraint k WHERE k.conrelid = c.oid), '-') ||
                     ' triggers ' || coalesce((SELECT string_agg(pg_get_triggerdef(t.oid), '; ' ORDER BY t.tgname)
                                                 FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal), '-')
                FROM pg_class c WHERE c.oid = d.objid)
           WHEN 'pg_type'::regclass THEN
             (SELECT t.typtype::text || ' ' ||
                     coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                 FROM pg_enum e WHERE e.enumtypid = t.oid), '') ||
                     coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                                 FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0
                                  AND NOT a.attisdropped), '')
                FROM pg_type t WHERE t.oid = d.objid)
         END, '') ||
         ' comment ' || coalesce(obj_description(d.objid, d.classid::regclass::name), '-')
    FROM pg_depend d
   WHERE d.refclassid = 'pg_extension'::regclass
     AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
     AND d.deptype = 'e'
  UNION ALL
  SELECT 'extension config ' || extconfig::regclass[]::text || ' ' || coalesce(array_to_string(extcondition, ','), '')
    FROM pg_extension WHERE extname = 'idempotency'
$$;
CREATE TEMP TABLE updated_objects AS SELECT * FROM pg_temp.extension_objects() AS o(object);
SELECT count(*) > 20 AS objects_listed FROM updated_objects;

DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
CREATE TEMP TABLE fresh_objects AS SELECT * FROM pg_temp.extension_objects() AS o(object);

-- Nothing differs either way.
(SELECT 'only after update' AS side, object FROM updated_objects
 EXCEPT SELECT 'only after update', object FROM fresh_objects)
UNION ALL
(SELECT 'only in a fresh install', object FROM fresh_objects
 EXCEPT SELECT 'only in a fresh install', object FROM updated_objects);

\c contrib_regression
DROP DATABASE idem_upgrade;
