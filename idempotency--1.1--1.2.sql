/* idempotency--1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

--
-- Version 1.2.  idempotency--1.0.sql and idempotency--1.0--1.1.sql are
-- never changed: a new install runs them and then this script, and an
-- installed 1.1 reaches 1.2 through this script alone (sql/upgrade.sql
-- checks that both end with the same objects).  Calls written for 1.1
-- keep working unchanged.
--

--
-- idem_claim_text: idem_claim with every option at its default and the
-- request as JSON text, for the call that client libraries make on every
-- request (src/claim.c).  Four arguments, and the request fingerprinted
-- from its text (src/canonical.c): the same fingerprint as the jsonb's,
-- and text that jsonb refuses is refused with the same error.  A name of
-- its own, not an overload of idem_claim: idem_claim('op', 'k', '{...}')
-- with an untyped literal keeps resolving to idem_claim(..., jsonb, ...).
--
CREATE FUNCTION idem_claim_text(
    operation text,
    key       text,
    request   text,
    tenant    text DEFAULT '')
    RETURNS idem_decision
    AS 'MODULE_PATHNAME', 'idem_claim_text'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_claim_text(text, text, text, text) IS
    'Claim an idempotency key with a request given as JSON text and the default options: idem_claim''s answer';

--
-- Not callable by PUBLIC, as every function that reads or writes records.
-- It claims what idem_claim claims: the roles that may execute idem_claim
-- when the extension is updated may execute it too, as grants of the
-- user's, not of the extension (pg_init_privs keeps what a fresh install
-- records), so that pg_dump dumps them as it dumps those on idem_claim.
--
REVOKE ALL ON FUNCTION idem_claim_text(text, text, text, text) FROM PUBLIC;

DO $update$
DECLARE
    fresh_init_privs aclitem[];
    grant_item record;
    claim_text regprocedure := 'idem_claim_text(text, text, text, text)'::regprocedure;
BEGIN
    SELECT initprivs INTO fresh_init_privs FROM pg_catalog.pg_init_privs
     WHERE objoid = claim_text AND classoid = 'pg_catalog.pg_proc'::regclass;
    FOR grant_item IN
        SELECT a.grantee, a.is_grantable
          FROM pg_catalog.pg_proc p,
               pg_catalog.aclexplode(p.proacl) AS a
         WHERE p.oid = 'idem_claim(text, text, jsonb, text, text, interval, interval, interval, text, text)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', claim_text,
                       CASE WHEN grant_item.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_catalog.pg_get_userbyid(grant_item.grantee)) END,
                       CASE WHEN grant_item.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    UPDATE pg_catalog.pg_init_privs SET initprivs = fresh_init_privs
     WHERE objoid = claim_text AND classoid = 'pg_catalog.pg_proc'::regclass;
END
$update$;

-- PostgreSQL 17 and later also record the roles named in pg_init_privs in
-- pg_shdepend: the grants made above, no longer initial privileges, leave
-- those entries too, as in idempotency--1.0--1.1.sql.
DELETE FROM pg_catalog.pg_shdepend d
 WHERE d.dbid = (SELECT oid FROM pg_catalog.pg_database
                  WHERE datname = pg_catalog.current_database())
   AND d.classid = 'pg_catalog.pg_proc'::regclass
   AND d.objid = 'idem_claim_text(text, text, text, text)'::regprocedure
   AND d.deptype = 'i'
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_init_privs i,
                               pg_catalog.aclexplode(i.initprivs) a
                    WHERE i.objoid = d.objid AND i.classoid = d.classid
                      AND d.refobjid IN (a.grantee, a.grantor));
