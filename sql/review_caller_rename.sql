--
-- Review reproducer: from 1.3 a caller equal to the calling role's current
-- name is stored as '' (src/security.c, idem_scope_caller), so what an
-- explicit caller means changes when the role is renamed.
--
-- 1. An application that names its caller explicitly, the name being its
--    role's (caller => 'regress_rc_pay'), has its records stored with
--    caller ''.  After the role is renamed (credential rotation), the same
--    call names caller 'regress_rc_pay', which is no longer the role's
--    name: another scope, and the retry of a completed payment proceeds a
--    second time.  Under 1.2 the caller was kept as given.
-- 2. A role renamed to the name of one of its own explicit callers merges
--    that caller's scope into its own: the retry of the caller's completed
--    payment proceeds a second time.
--
-- Expected (what this test asks for): no second 'proceed' in either case.
--
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
