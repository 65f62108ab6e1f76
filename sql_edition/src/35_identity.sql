--
-- Who a call acts for.
--
-- The application role gets EXECUTE on the public functions and nothing
-- else: the functions that read or write records are SECURITY DEFINER,
-- owned by the installing role.  The role a call acts for, the C edition's
-- current_user at the call, is taken by the public function itself, a thin
-- LANGUAGE sql wrapper that PostgreSQL inlines into the caller's query, and
-- passed to the definer function, which accepts it only if the session's
-- user may act as that role (SET ROLE could give it no more) and that role
-- may execute the public function it came through.  So a direct call of a
-- definer function can claim nothing that the public function would not
-- give, and a role that was not granted EXECUTE gets nothing.
--
-- A public function called from inside another SECURITY DEFINER function
-- acts for that function's owner, as in the C edition; it is refused here
-- when the session's user could not become that owner.
--

-- Whether a session of member may act as role: what SET ROLE would allow
-- (membership on 15; membership with the SET option from 16).
CREATE OR REPLACE FUNCTION idem__may_become(member name, role regrole)
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.pg_has_role(member, role,
                              CASE WHEN pg_catalog.current_setting('server_version_num')::integer >= 160000
                                   THEN 'SET' ELSE 'MEMBER' END);

-- The role a call acts for, checked: session_user may become it, and it may
-- execute the public function the call came through.
CREATE OR REPLACE FUNCTION idem__acting_role(role regrole, via regprocedure)
RETURNS regrole
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- (the table first, as in idem__plain_role: 16_table.sql)
    IF NOT idem__table_checked() THEN
        RETURN NULL;
    END IF;
    IF role IS NULL THEN
        -- current_user named no role: a rename of the calling role committed
        -- between the lookup of its name and the lookup of that name (the C
        -- edition takes the role's identity itself, which SQL cannot)
        RAISE EXCEPTION 'could not identify the calling role'
            USING ERRCODE = 'serialization_failure',
                  DETAIL = 'The role was renamed while the call ran.',
                  HINT = 'Retry the call: nothing was written.';
    END IF;
    IF NOT idem__may_become(session_user, role) THEN
        RAISE EXCEPTION 'permission denied to act as role "%"', role
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = pg_catalog.format('Session user "%s" cannot become that role.', session_user),
                  HINT = 'Call the idem_* functions as the role itself, or SET ROLE to it first.';
    END IF;
    IF NOT pg_catalog.has_function_privilege(role, via, 'EXECUTE') THEN
        RAISE EXCEPTION 'permission denied for function %', pg_catalog.split_part(via::text, '(', 1)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN role;
END
$$;

-- The caller a scope stores: the empty string for the role itself (a NULL
-- caller), which no call can name; a caller that names the calling role is
-- refused, since after a rename the same text would name another caller.
CREATE OR REPLACE FUNCTION idem__scope_caller(role regrole, caller text)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF caller IS NULL THEN
        RETURN '';
    END IF;
    PERFORM idem__check_name(caller, 'caller', false);
    IF caller = pg_catalog.pg_get_userbyid(role) THEN
        RAISE EXCEPTION 'caller must not name the calling role'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'A role''s own records are its default scope; a caller names someone calling within the role.',
                  HINT = 'Pass no caller (or NULL) for the role itself.';
    END IF;
    RETURN caller;
END
$$;

-- Whether a role may act on every role's records: the owner of
-- idem_records, a role with its privileges, or a superuser.
CREATE OR REPLACE FUNCTION idem__is_operator(role regrole)
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.pg_has_role(role,
                              (SELECT c.relowner FROM pg_catalog.pg_class AS c
                                WHERE c.oid OPERATOR(pg_catalog.=) 'idem_records'::pg_catalog.regclass),
                              'USAGE');
