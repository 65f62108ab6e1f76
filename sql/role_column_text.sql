--
-- The owner changes idem_records.role of an installed 1.3 back to text.
-- Served as a table of 1.2, the default caller would be the role's name
-- again while every stored record's caller is '' (and a role whose name
-- needs quotes would be stored quoted): a retry of a completed payment
-- would proceed a second time.  The library takes the role column's type
-- from the version installed, so the table is refused (42804) as after any
-- other change of a column's type, until the type is changed back.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
CREATE ROLE regress_rt_app;
CREATE ROLE "Regress Weird";
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete TO regress_rt_app, "Regress Weird";
SET ROLE regress_rt_app;
SELECT idem_complete(token, 201, '{"charge": "ch_1"}')
  FROM idem_claim('rt.pay', 'k-1', '{"amount": 5}');
RESET ROLE;
SET ROLE "Regress Weird";
SELECT idem_complete(token, 201, '{"charge": "ch_w"}')
  FROM idem_claim('rt.pay', 'k-1', '{"amount": 5}');
RESET ROLE;

ALTER TABLE idem_records ALTER COLUMN role TYPE text COLLATE "C" USING role::text;

CREATE FUNCTION pg_temp.second_payment() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    o text;
BEGIN
    SELECT outcome INTO o FROM idem_claim('rt.pay', 'k-1', '{"amount": 5}');
    RETURN CASE WHEN o = 'proceed' THEN 'proceed: a second payment' ELSE 'no second payment' END;
EXCEPTION WHEN object_not_in_prerequisite_state OR datatype_mismatch THEN
    RETURN 'no second payment';
END
$$;
GRANT EXECUTE ON FUNCTION pg_temp.second_payment() TO PUBLIC;
SET ROLE regress_rt_app;
SELECT pg_temp.second_payment();
RESET ROLE;
SET ROLE "Regress Weird";
SELECT pg_temp.second_payment();
RESET ROLE;

-- put things back for the tests that follow
DELETE FROM idem_records WHERE operation = 'rt.pay';
ALTER TABLE idem_records ALTER COLUMN role TYPE regrole USING role::regrole;
ALTER TABLE idem_records ALTER COLUMN role
    SET DEFAULT pg_catalog.to_regrole(pg_catalog.quote_ident(current_user));
REVOKE ALL ON FUNCTION idem_claim, idem_complete FROM regress_rt_app, "Regress Weird";
DROP ROLE regress_rt_app;
DROP ROLE "Regress Weird";
