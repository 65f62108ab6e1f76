--
-- A record belongs to a role, not to its name: a renamed role keeps its
-- records (a retry replays, never proceeds again), a new role given a
-- dropped role's name finds none of the dropped role's, and the dropped
-- role's records stay, listed to the owner, until cleanup deletes them.
-- Login roles that rotate share one scope through a group role.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
SET idempotency.default_lease = '1h';
CREATE ROLE regress_rid_app;
GRANT EXECUTE ON FUNCTION idem_claim, idem_claim_text, idem_complete, idem_replay,
                          idem_list, idem_resolve TO PUBLIC;

-- 1. A rename keeps the records.
SET ROLE regress_rid_app;
SELECT token AS paid_token FROM idem_claim('rid.pay', 'k-rename', '{"amount": 5}') \gset
SELECT idem_complete(:'paid_token', 201, '{"charge": "ch_1"}');
-- an attempt still running when the role is renamed
SELECT token AS running_token FROM idem_claim('rid.pay', 'k-running', '{"amount": 6}') \gset
RESET ROLE;
ALTER ROLE regress_rid_app RENAME TO regress_rid_app_v2;
SET ROLE regress_rid_app_v2;
SELECT outcome, http_status, body FROM idem_claim('rid.pay', 'k-rename', '{"amount": 5}');
SELECT outcome, http_status, body FROM idem_claim_text('rid.pay', 'k-rename', '{"amount": 5}');
SELECT outcome, body FROM idem_replay('rid.pay', 'k-rename');
-- the role itself is no caller, or NULL; a caller naming the role is
-- refused, since a rename would change what it names ...
SELECT outcome FROM idem_claim('rid.pay', 'k-rename', '{"amount": 5}', caller => NULL);
SELECT outcome FROM idem_claim('rid.pay', 'k-rename', '{"amount": 5}', caller => 'regress_rid_app_v2');
SELECT outcome FROM idem_replay('rid.pay', 'k-rename', caller => 'regress_rid_app_v2');
-- ... and its old name is just another caller now
SELECT outcome FROM idem_claim('rid.pay', 'k-rename', '{"amount": 5}', caller => 'regress_rid_app');
-- the token of the attempt that ran across the rename still completes it
SELECT idem_complete(:'running_token', 201, '{"charge": "ch_2"}');
SELECT outcome, body FROM idem_claim('rid.pay', 'k-running', '{"amount": 6}');
SELECT key, caller, state FROM idem_list('succeeded', 'rid.pay') ORDER BY key;
RESET ROLE;
SELECT key, role, caller FROM idem_records
 WHERE operation = 'rid.pay' AND role = 'regress_rid_app_v2'::regrole ORDER BY key, caller;

-- 2. A dropped role's records reach nobody, a new role of its name
-- included; they are listed to the owner.
CREATE ROLE regress_rid_gone;
SET ROLE regress_rid_gone;
SELECT token AS gone_token FROM idem_claim('rid.pay', 'k-gone', '{"amount": 7}') \gset
SELECT idem_complete(:'gone_token', 201, '{"card": "4111-secret-of-the-dropped-role"}');
RESET ROLE;
SELECT oid AS gone_oid FROM pg_roles WHERE rolname = 'regress_rid_gone' \gset
DROP ROLE regress_rid_gone;
CREATE ROLE regress_rid_gone;
SET ROLE regress_rid_gone;
SELECT count(*) AS replays_nothing FROM idem_replay('rid.pay', 'k-gone');
SELECT outcome, body FROM idem_claim('rid.pay', 'k-gone', '{"amount": 7}');
SELECT count(*) AS lists_nothing_of_it FROM idem_list('succeeded', 'rid.pay');
-- and the listing of records without a role is the owner's
SELECT count(*) FROM idem_records_without_role();
RESET ROLE;
SELECT key, role_oid = :gone_oid AS the_dropped_roles, former_role, caller, state
  FROM idem_records_without_role();
-- They expire and are deleted like any other record ...
UPDATE idem_records SET expires_at = now() - interval '30 days'
 WHERE role::oid = :gone_oid;
SELECT idem_cleanup() > 0 AS cleaned;
SELECT count(*) AS left_of_it FROM idem_records WHERE role::oid = :gone_oid;
-- ... and the new role's own record is its own.
SELECT key, role, caller, state FROM idem_records WHERE key = 'k-gone';

-- 3. Login roles that rotate (one per instance, say) share one scope
-- through a group role they act as: the retry through the second login
-- replays the answer to the first.
CREATE ROLE regress_rid_payments NOLOGIN;
CREATE ROLE regress_rid_login_a LOGIN IN ROLE regress_rid_payments;
CREATE ROLE regress_rid_login_b LOGIN IN ROLE regress_rid_payments;
ALTER ROLE regress_rid_login_a SET role = 'regress_rid_payments';
ALTER ROLE regress_rid_login_b SET role = 'regress_rid_payments';
\c - regress_rid_login_a
SELECT session_user, current_user;
SELECT token AS group_token FROM idem_claim('rid.pay', 'k-group', '{"amount": 8}') \gset
SELECT idem_complete(:'group_token', 201, '{"charge": "ch_group"}');
\c - regress_rid_login_b
SELECT session_user, current_user;
SELECT outcome, http_status, body FROM idem_claim('rid.pay', 'k-group', '{"amount": 8}');
-- without the group, a login role is a scope of its own
SET ROLE NONE;
SELECT current_user;
SELECT outcome FROM idem_claim('rid.pay', 'k-group', '{"amount": 8}');
\c - postgres
SELECT key, role, caller, state FROM idem_records WHERE key = 'k-group' ORDER BY role::text;

-- Clean up.
DELETE FROM idem_records WHERE operation = 'rid.pay';
REVOKE EXECUTE ON FUNCTION idem_claim, idem_claim_text, idem_complete, idem_replay,
                           idem_list, idem_resolve FROM PUBLIC;
DROP ROLE regress_rid_app_v2, regress_rid_gone, regress_rid_login_a,
          regress_rid_login_b, regress_rid_payments;
