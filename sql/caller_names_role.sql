--
-- A caller that names the calling role would change meaning with a rename:
-- stored as the role itself, it would name another caller once the role
-- is renamed, and a role renamed to one of its callers' names would take
-- that caller's records for its own.  Either way a completed payment would
-- proceed a second time.  From 1.3 such a caller is refused (22023) and
-- the role itself is the default (no caller, or NULL): no second proceed.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY terse
CREATE ROLE regress_rc_pay;
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete TO regress_rc_pay;

-- 1.
SET ROLE regress_rc_pay;
SELECT idem_complete(token, 201, '{"charge": "ch_1"}')
  FROM idem_claim('rc.pay', 'k-explicit', '{"amount": 5}', caller => 'regress_rc_pay');
SELECT outcome FROM idem_claim('rc.pay', 'k-explicit', '{"amount": 5}', caller => 'regress_rc_pay');
RESET ROLE;
ALTER ROLE regress_rc_pay RENAME TO regress_rc_pay_v2;
SET ROLE regress_rc_pay_v2;
SELECT outcome FROM idem_claim('rc.pay', 'k-explicit', '{"amount": 5}', caller => 'regress_rc_pay');
RESET ROLE;

-- 2.
SET ROLE regress_rc_pay_v2;
SELECT idem_complete(token, 201, '{"charge": "ch_web"}')
  FROM idem_claim('rc.pay', 'k-web', '{"amount": 6}', caller => 'regress_rc_web');
RESET ROLE;
ALTER ROLE regress_rc_pay_v2 RENAME TO regress_rc_web;
SET ROLE regress_rc_web;
SELECT outcome FROM idem_claim('rc.pay', 'k-web', '{"amount": 6}', caller => 'regress_rc_web');
RESET ROLE;

DELETE FROM idem_records WHERE operation = 'rc.pay';
REVOKE ALL ON FUNCTION idem_claim, idem_complete FROM regress_rc_web;
DROP ROLE regress_rc_web;
