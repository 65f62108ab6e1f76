--
-- Reconciliation as the application's role: idem_list() shows the calling
-- role's own records in a state, never another role's, and idem_resolve()
-- settles the role's own unknown records, not another role's.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default

-- The SQLSTATE and message of a statement, record ids shown as N.
CREATE FUNCTION pg_temp.error_of(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ' ' || regexp_replace(SQLERRM, '[0-9]+', 'N', 'g');
END $$;

CREATE ROLE regress_list_app;
CREATE ROLE regress_list_other;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_resolve, idem_list
   TO regress_list_app, regress_list_other;

-- Two unknown records of the application, one of another role, under the
-- same operation and key; a lease of a microsecond has ended by the next
-- statement, and the next claim marks the record unknown.
SET ROLE regress_list_app;
SELECT outcome FROM idem_claim('list.charge', 'charge-1', '{"amount": 10}', lease => '1 microsecond');
SELECT outcome FROM idem_claim('list.charge', 'charge-1', '{"amount": 10}');
SELECT outcome FROM idem_claim('list.refund', 'refund-1', lease => '1 microsecond');
SELECT outcome FROM idem_claim('list.refund', 'refund-1');
SELECT token AS done FROM idem_claim('list.charge', 'charge-2') \gset
SELECT idem_complete(:'done', 201);
RESET ROLE;
SET ROLE regress_list_other;
SELECT outcome FROM idem_claim('list.charge', 'charge-1', lease => '1 microsecond');
SELECT outcome FROM idem_claim('list.charge', 'charge-1');
RESET ROLE;

-- 1. The application lists its own unknown records, oldest change first.
SET ROLE regress_list_app;
SELECT tenant, caller, operation, key, state, attempt, recovery_point,
       resource_id, claimed_age >= '0' AS aged, updated_age >= '0' AS updated_aged
  FROM idem_list('unknown');
SELECT operation, key FROM idem_list('unknown', operation => 'list.charge');
SELECT key, state FROM idem_list('succeeded');
SELECT count(*) FROM idem_list('unknown', max_rows => 1);
-- Nothing has been unknown for a day.
SELECT count(*) FROM idem_list('unknown', older_than => '1 day');
SELECT count(*) FROM idem_list('unknown', older_than => '0');
RESET ROLE;

-- The other role sees its one record only.
SET ROLE regress_list_other;
SELECT caller, operation, key, state FROM idem_list('unknown');
SELECT record_id AS other_id FROM idem_list('unknown') \gset
RESET ROLE;

-- 2. Bad arguments: 22004 / 22023, nothing listed.
SET ROLE regress_list_app;
SELECT * FROM idem_list(NULL);
SELECT * FROM idem_list('lost');
SELECT * FROM idem_list('unknown', max_rows => 0);
SELECT * FROM idem_list('unknown', max_rows => NULL);
SELECT * FROM idem_list('unknown', older_than => '-1 hour');
SELECT * FROM idem_list('unknown', operation => '');
RESET ROLE;

-- 3. The application settles its own unknown records, found by idem_list.
SET ROLE regress_list_app;
SELECT record_id AS charge_id FROM idem_list('unknown', 'list.charge') \gset
SELECT record_id AS refund_id FROM idem_list('unknown', 'list.refund') \gset
SELECT idem_resolve(:charge_id, 'succeeded', 201, '{"id": "ch_1"}');
SELECT idem_resolve(:refund_id, 'retryable', 503);
SELECT count(*) FROM idem_list('unknown');
SELECT outcome, http_status, body FROM idem_claim('list.charge', 'charge-1', '{"amount": 10}');
SELECT outcome FROM idem_claim('list.refund', 'refund-1');
-- ... and cannot settle the other role's: to it, the record does not exist.
SELECT pg_temp.error_of(format('SELECT idem_resolve(%s, ''succeeded'', 200)', :other_id));
-- A record that is no longer unknown is refused.
SELECT pg_temp.error_of(format('SELECT idem_resolve(%s, ''failed'', 500)', :charge_id));
RESET ROLE;

-- The other role's record is still unknown.
SET ROLE regress_list_other;
SELECT key, state FROM idem_list('unknown');
RESET ROLE;

-- 4. A role without EXECUTE is refused.
CREATE ROLE regress_list_nobody;
SET ROLE regress_list_nobody;
SELECT * FROM idem_list('unknown');
RESET ROLE;

DELETE FROM idem_records WHERE role IN ('regress_list_app', 'regress_list_other');
REVOKE ALL ON FUNCTION idem_claim, idem_complete, idem_resolve, idem_list
  FROM regress_list_app, regress_list_other;
DROP ROLE regress_list_app, regress_list_other, regress_list_nobody;
