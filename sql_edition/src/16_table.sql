--
-- The table as the functions need it.  Its owner may change idem_records,
-- and a change the functions cannot serve is refused before anything is
-- read or written, with the C edition's SQLSTATE and message
-- (src/catalog.c): the table, the types and their labels under their
-- names; the columns of the edition with the types it created and
-- collation "C" for the scope; the scope's unique index under its name,
-- unique on exactly the five columns of the scope in collation "C",
-- immediate, without expression or predicate, and valid; id an identity
-- column with a unique index on it alone.  Then what only the SQL edition
-- needs, since its functions run as their owner, not as the table's: the
-- functions' owner may read and write the table, and no row level
-- security applies to it.
--
-- The C edition keeps what it looked up until an invalidation of the
-- table says it changed.  The SQL edition has no memory of its own that
-- invalidations reach, but the plans of PostgreSQL's plan cache are one:
-- idem__table_checked() is an expression whose plan holds the table and
-- its scope index as constants, made at planning time by
-- idem__checked_relation(), which checks the table before it answers.  A
-- plan holding a relation is planned again when that relation changes
-- (any ALTER TABLE, an index made or dropped on it, its owner, its row
-- level security, the index renamed, rebuilt or marked not valid), so
-- the check runs when the session first plans the expression and after
-- each such change, and the expression costs two look-ups of a relation
-- by its OID otherwise.  (idem__checked_relation() is declared IMMUTABLE
-- so that the planner evaluates it, once, while it plans; were it ever
-- evaluated at each call instead, each call would check the table: slower,
-- never less safe.)  Each definer function's plan of the expression runs
-- the check once: idem__table_fits(), two statements that the session
-- plans once for all of them; only a table that fails it is explained by
-- idem__check_table(), whose many statements are planned then.  A label
-- renamed changes no relation: it is found by the check of a session that
-- plans anew, and until then the plans keep the label's OID, the record's
-- value, as the C edition keeps it.
--

-- Whether the current role (the functions' owner, inside them) holds every
-- privilege the functions use on the table: each asked on its own, since
-- has_table_privilege with a list is true when any one of them is held.
CREATE OR REPLACE FUNCTION idem__may_write_records(tbl regclass)
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.has_table_privilege(tbl, 'SELECT') AND pg_catalog.has_table_privilege(tbl, 'INSERT')
       AND pg_catalog.has_table_privilege(tbl, 'UPDATE') AND pg_catalog.has_table_privilege(tbl, 'DELETE');

-- The error that says what is wrong with the table, if anything: the
-- C edition's checks in its order, then the SQL edition's own.
CREATE OR REPLACE FUNCTION idem__check_table()
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    nsp oid := (SELECT p.pronamespace FROM pg_catalog.pg_proc AS p
                 WHERE p.oid OPERATOR(pg_catalog.=) 'idem__check_table()'::pg_catalog.regprocedure);
    nspname text := (SELECT n.nspname FROM pg_catalog.pg_namespace AS n
                      WHERE n.oid OPERATOR(pg_catalog.=) nsp);
    tbl oid;
    idx oid;
    state_type oid;
    policy_type oid;
    label text;
    c record;
    i record;
    owner_name text;
    fits boolean;
    usable boolean;
BEGIN
    SELECT r.oid INTO tbl FROM pg_catalog.pg_class AS r
     WHERE r.relname OPERATOR(pg_catalog.=) 'idem_records'
       AND r.relnamespace OPERATOR(pg_catalog.=) nsp;
    IF tbl IS NULL THEN
        RAISE EXCEPTION 'table "idem_records" of extension "idempotency" does not exist'
            USING ERRCODE = 'undefined_table',
                  DETAIL = pg_catalog.format('The extension looks for it in schema "%s", under that name.',
                                             nspname),
                  HINT = 'If it was renamed, rename it back.';
    END IF;

    SELECT t.oid INTO state_type FROM pg_catalog.pg_type AS t
     WHERE t.typname OPERATOR(pg_catalog.=) 'idem_state' AND t.typnamespace OPERATOR(pg_catalog.=) nsp;
    SELECT t.oid INTO policy_type FROM pg_catalog.pg_type AS t
     WHERE t.typname OPERATOR(pg_catalog.=) 'idem_lease_policy' AND t.typnamespace OPERATOR(pg_catalog.=) nsp;
    IF state_type IS NULL OR policy_type IS NULL THEN
        RAISE EXCEPTION 'type "%" of extension "idempotency" does not exist',
                        CASE WHEN state_type IS NULL THEN 'idem_state' ELSE 'idem_lease_policy' END
            USING ERRCODE = 'undefined_object',
                  DETAIL = pg_catalog.format('The extension looks for it in schema "%s", under that name.',
                                             nspname),
                  HINT = 'If it was renamed, rename it back.';
    END IF;
    SELECT w.type_name, w.label INTO c
      FROM (VALUES ('idem_state', state_type, 'processing', 1), ('idem_state', state_type, 'succeeded', 2),
                   ('idem_state', state_type, 'failed', 3), ('idem_state', state_type, 'retryable', 4),
                   ('idem_state', state_type, 'unknown', 5),
                   ('idem_lease_policy', policy_type, 'unknown', 6),
                   ('idem_lease_policy', policy_type, 'retry', 7)) AS w (type_name, type_oid, label, n)
     WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_enum AS e
                        WHERE e.enumtypid OPERATOR(pg_catalog.=) w.type_oid
                          AND e.enumlabel OPERATOR(pg_catalog.=) w.label)
     ORDER BY w.n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'type "%" of extension "idempotency" has no label "%"', c.type_name, c.label
            USING ERRCODE = 'undefined_object',
                  HINT = 'If the label was renamed, rename it back.';
    END IF;

    -- a label the edition does not know (one renamed away, its name given
    -- to a new label) held by a record: the record's state is no state the
    -- functions know (a table scan, only while such a label exists)
    IF EXISTS (SELECT FROM pg_catalog.pg_enum AS e
                WHERE (e.enumtypid OPERATOR(pg_catalog.=) state_type
                       AND e.enumlabel OPERATOR(pg_catalog.<>) ALL ('{processing,succeeded,failed,retryable,unknown}'::text[]))
                   OR (e.enumtypid OPERATOR(pg_catalog.=) policy_type
                       AND e.enumlabel OPERATOR(pg_catalog.<>) ALL ('{unknown,retry}'::text[]))) THEN
        EXECUTE pg_catalog.format(
            'SELECT (SELECT t.typname::text FROM pg_catalog.pg_type AS t
                        WHERE t.oid OPERATOR(pg_catalog.=) e.enumtypid) AS type_name, e.oid
               FROM %I.idem_records AS r
               JOIN pg_catalog.pg_enum AS e
                 ON e.enumtypid OPERATOR(pg_catalog.=) $1
                AND e.enumlabel OPERATOR(pg_catalog.=) r.state::text
                AND e.enumlabel OPERATOR(pg_catalog.<>) ALL (''{processing,succeeded,failed,retryable,unknown}''::text[])
             UNION ALL
             SELECT (SELECT t.typname::text FROM pg_catalog.pg_type AS t
                        WHERE t.oid OPERATOR(pg_catalog.=) e.enumtypid), e.oid
               FROM %I.idem_records AS r
               JOIN pg_catalog.pg_enum AS e
                 ON e.enumtypid OPERATOR(pg_catalog.=) $2
                AND e.enumlabel OPERATOR(pg_catalog.=) r.on_lease_expiry::text
                AND e.enumlabel OPERATOR(pg_catalog.<>) ALL (''{unknown,retry}''::text[])
             LIMIT 1', nspname, nspname)
           INTO c USING state_type, policy_type;
        IF c.oid IS NOT NULL THEN
            RAISE EXCEPTION 'a record of extension "idempotency" holds a label of type "%" the extension does not know',
                            c.type_name
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = pg_catalog.format('The label''s OID is %s.', c.oid),
                      HINT = 'Labels of the extension''s types must keep their names; rename them back.';
        END IF;
    END IF;

    -- the columns the edition created, with their types; the scope's text
    -- columns in collation "C" (the first column in the table's order that
    -- is wrong is named)
    SELECT a.attname::text AS name, a.atttypid, a.attcollation, w.wants
      INTO c
      FROM pg_catalog.pg_attribute AS a
      LEFT JOIN (VALUES ('id', 'pg_catalog.int8'::pg_catalog.regtype::oid),
                        ('role', 'pg_catalog.regrole'::pg_catalog.regtype::oid),
                        ('tenant', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('caller', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('operation', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('key', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('fingerprint', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('state', state_type),
                        ('attempt', 'pg_catalog.int4'::pg_catalog.regtype::oid),
                        ('attempt_token', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('recovery_point', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('locked_until', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('on_lease_expiry', policy_type),
                        ('ttl', 'pg_catalog.interval'::pg_catalog.regtype::oid),
                        ('response_status', 'pg_catalog.int4'::pg_catalog.regtype::oid),
                        ('response_headers', 'pg_catalog.jsonb'::pg_catalog.regtype::oid),
                        ('response_body', 'pg_catalog.jsonb'::pg_catalog.regtype::oid),
                        ('resource_id', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('created_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('claimed_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('updated_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('completed_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('expires_at', 'pg_catalog.timestamptz'::pg_catalog.regtype::oid),
                        ('response_raw_body', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('response_sealed', 'pg_catalog.bytea'::pg_catalog.regtype::oid),
                        ('former_role', 'pg_catalog.text'::pg_catalog.regtype::oid),
                        ('request_text_hash', 'pg_catalog.bytea'::pg_catalog.regtype::oid))
                AS w (name, wants) ON w.name OPERATOR(pg_catalog.=) a.attname::text
     WHERE a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attnum OPERATOR(pg_catalog.>) 0
       AND NOT a.attisdropped
       AND (a.atttypid OPERATOR(pg_catalog.<>) w.wants
            OR (a.attname::text OPERATOR(pg_catalog.=) ANY ('{tenant,caller,operation,key}'::text[])
                AND a.atttypid OPERATOR(pg_catalog.=) 'pg_catalog.text'::pg_catalog.regtype::oid
                AND a.attcollation OPERATOR(pg_catalog.<>) 'pg_catalog."C"'::pg_catalog.regcollation::oid))
     ORDER BY a.attnum LIMIT 1;
    IF FOUND AND c.atttypid OPERATOR(pg_catalog.=) c.wants THEN
        RAISE EXCEPTION 'column "%" of table "idem_records" has collation %, not "C"',
                        c.name, c.attcollation::pg_catalog.regcollation
            USING ERRCODE = 'collation_mismatch',
                  DETAIL = 'The idempotency extension finds a key by its bytes, as collation "C" orders and compares them.',
                  HINT = 'Change it back with ALTER TABLE ... ALTER COLUMN ... TYPE text COLLATE "C".';
    ELSIF FOUND THEN
        RAISE EXCEPTION 'column "%" of table "idem_records" has type %, not %',
                        c.name, pg_catalog.format_type(c.atttypid, NULL), pg_catalog.format_type(c.wants, NULL)
            USING ERRCODE = 'datatype_mismatch',
                  DETAIL = pg_catalog.format('The idempotency extension reads and writes it as %s.',
                                             pg_catalog.format_type(c.wants, NULL)),
                  HINT = 'Change its type back with ALTER TABLE ... ALTER COLUMN ... TYPE.';
    END IF;

    -- the scope's unique index, by its name
    SELECT r.oid, r.relkind INTO i FROM pg_catalog.pg_class AS r
     WHERE r.relname OPERATOR(pg_catalog.=) 'idem_records_scope_key'
       AND r.relnamespace OPERATOR(pg_catalog.=) nsp;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'index "idem_records_scope_key" of extension "idempotency" does not exist'
            USING ERRCODE = 'undefined_object',
                  HINT = 'If it was renamed, rename it back.';
    END IF;
    idx := i.oid;
    SELECT x.indrelid OPERATOR(pg_catalog.=) tbl AND x.indisunique AND x.indimmediate
           AND x.indnkeyatts OPERATOR(pg_catalog.=) 5 AND x.indexprs IS NULL AND x.indpred IS NULL
           AND (SELECT pg_catalog.count(DISTINCT a.attname) FILTER (
                       WHERE a.attname::text OPERATOR(pg_catalog.=) ANY ('{role,tenant,caller,operation,key}'::text[])
                         AND k.coll OPERATOR(pg_catalog.=) CASE WHEN a.attname::text OPERATOR(pg_catalog.=) 'role'
                                                                THEN 0::oid
                                                                ELSE 'pg_catalog."C"'::pg_catalog.regcollation::oid END)
                  FROM ROWS FROM (pg_catalog.unnest(x.indkey::pg_catalog.int2[]),
                                  pg_catalog.unnest(x.indcollation::pg_catalog.oid[]))
                       WITH ORDINALITY AS k (attnum, coll, n)
                  JOIN pg_catalog.pg_attribute AS a
                    ON a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attnum OPERATOR(pg_catalog.=) k.attnum
                 WHERE k.n OPERATOR(pg_catalog.<=) 5) OPERATOR(pg_catalog.=) 5,
           x.indisvalid AND x.indisready AND x.indislive
      INTO fits, usable
      FROM pg_catalog.pg_index AS x
     WHERE x.indexrelid OPERATOR(pg_catalog.=) idx;
    IF coalesce(fits, false) AND NOT usable THEN
        RAISE EXCEPTION 'index "idem_records_scope_key" of extension "idempotency" is not valid'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A claim cannot find every record of a key through an index that is still being built or whose build failed.',
                  HINT = 'Wait for CREATE INDEX CONCURRENTLY to finish, or rebuild it with REINDEX INDEX idem_records_scope_key.';
    ELSIF NOT coalesce(fits, false) THEN
        RAISE EXCEPTION 'index "idem_records_scope_key" of extension "idempotency" is not the unique index of the scope and key'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'It must be unique on the columns role, tenant, caller, operation and key, in collation "C", without expressions or a predicate, and not deferrable.',
                  HINT = 'Recreate it as the extension''s installation script does.';
    END IF;

    -- id: an identity column, with a valid, immediate B-tree index unique
    -- on it alone, of the default operator class
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute AS a
                    WHERE a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) 'id'
                      AND NOT a.attisdropped AND a.attidentity OPERATOR(pg_catalog.<>) '') THEN
        RAISE EXCEPTION 'column "id" of table "idem_records" is not an identity column'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The idempotency extension gives a new record the next value of the identity of its id.',
                  HINT = 'Make it one again with ALTER TABLE idem_records ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH n), n past the greatest id.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS x
                     JOIN pg_catalog.pg_class AS r ON r.oid OPERATOR(pg_catalog.=) x.indexrelid
                     JOIN pg_catalog.pg_attribute AS a
                       ON a.attrelid OPERATOR(pg_catalog.=) tbl AND a.attname OPERATOR(pg_catalog.=) 'id'
                      AND NOT a.attisdropped
                    WHERE x.indrelid OPERATOR(pg_catalog.=) tbl AND x.indisunique AND x.indimmediate
                      AND x.indisvalid AND x.indisready AND x.indislive
                      AND x.indnkeyatts OPERATOR(pg_catalog.=) 1
                      AND x.indkey[0] OPERATOR(pg_catalog.=) a.attnum
                      AND r.relam OPERATOR(pg_catalog.=) (SELECT m.oid FROM pg_catalog.pg_am AS m
                                                           WHERE m.amname OPERATOR(pg_catalog.=) 'btree')
                      AND x.indexprs IS NULL AND x.indpred IS NULL
                      AND x.indclass[0] OPERATOR(pg_catalog.=) (
                          SELECT o.oid FROM pg_catalog.pg_opclass AS o
                           WHERE o.opcmethod OPERATOR(pg_catalog.=) r.relam AND o.opcdefault
                             AND o.opcintype OPERATOR(pg_catalog.=) a.atttypid)) THEN
        RAISE EXCEPTION 'table "idem_records" has no unique index on its column "id" alone'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The idempotency extension finds a record by its id through a valid, immediate B-tree index unique on id, without an expression or a predicate.',
                  HINT = 'Create one with CREATE UNIQUE INDEX ON idem_records (id), or make (id) the primary key again.';
    END IF;

    -- The SQL edition's functions act as their owner (this function runs
    -- inside them): the table is theirs to read and write, and no row
    -- level security hides or refuses a row from them.
    IF NOT idem__may_write_records(tbl)
       OR NOT pg_catalog.has_sequence_privilege(
                  pg_catalog.pg_get_serial_sequence(pg_catalog.format('%I.idem_records', nspname), 'id'),
                  'USAGE') THEN
        SELECT pg_catalog.pg_get_userbyid(r.relowner) INTO owner_name
          FROM pg_catalog.pg_class AS r WHERE r.oid OPERATOR(pg_catalog.=) tbl;
        IF owner_name OPERATOR(pg_catalog.<>) current_user THEN
            RAISE EXCEPTION 'the idempotency functions'' owner "%" may not read and write table "idem_records"', current_user
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = pg_catalog.format('The table is owned by "%s". The functions of the SQL edition run as their own owner, not as the table''s.', owner_name),
                      HINT = pg_catalog.format('Give the table back: ALTER TABLE %I.idem_records OWNER TO %I.',
                                               nspname, current_user);
        END IF;
        RAISE EXCEPTION 'the idempotency functions'' owner "%" may not read and write table "idem_records"', current_user
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'The functions of the SQL edition read, insert, update and delete its rows and take ids from its sequence as their owner, who owns the table but lacks a privilege on it.',
                  HINT = pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.idem_records TO %I; GRANT USAGE ON SEQUENCE %s TO %I.',
                                           nspname, current_user,
                                           pg_catalog.pg_get_serial_sequence(pg_catalog.format('%I.idem_records', nspname), 'id'),
                                           current_user);
    END IF;
    IF pg_catalog.row_security_active(tbl) THEN
        RAISE EXCEPTION 'row level security applies to table "idem_records" for the idempotency functions'' owner "%"', current_user
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'The functions of the SQL edition run as their own owner, to whom the table''s policies apply: they would hide records from a claim or refuse its writes.',
                  HINT = 'Keep idem_records owned by the functions'' owner, without FORCE ROW LEVEL SECURITY: the functions keep roles apart themselves.';
    END IF;
END
$$;

-- Whether the table plainly passes the check: what a session plans once
-- (statements without parameters, on one catalog each, keep one plan for
-- the session, shared by every function that checks) and then runs in a
-- fraction of a millisecond.  A table that does not pass, or a label the
-- edition does not know, is for idem__check_table() to explain; its many
-- statements are planned only then.  Built-in OIDs as the C edition names
-- them: collation "C" (950) and the B-tree operator class of bigint
-- (3124, which only a B-tree index has).
CREATE OR REPLACE FUNCTION idem__table_fits()
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tbl constant regclass := pg_catalog.to_regclass('idem_records');
BEGIN
    -- (a table of the session's in pg_temp, which the pinned search_path
    -- lists last, found when the edition's is renamed or dropped, is none)
    IF tbl IS NULL OR pg_catalog.to_regclass('idem_records_scope_key') IS NULL
       OR (SELECT r.relnamespace FROM pg_catalog.pg_class AS r WHERE r.oid OPERATOR(pg_catalog.=) tbl)
          OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()
       OR pg_catalog.to_regtype('idem_state') IS NULL
       OR pg_catalog.to_regtype('idem_lease_policy') IS NULL
       OR NOT idem__may_write_records(tbl)
       OR pg_catalog.row_security_active(tbl) THEN
        RETURN false;
    END IF;
    -- the labels, and no other (by their names: a label added in this
    -- transaction may not be used as a value yet); every column of the
    -- edition, of its type; the scope's texts in "C"; id an identity
    IF (SELECT pg_catalog.string_agg(l.label, ',' ORDER BY l.label COLLATE "C")
          FROM (SELECT CASE WHEN e.enumtypid OPERATOR(pg_catalog.=) pg_catalog.to_regtype('idem_state')
                            THEN 'state:' ELSE 'policy:' END OPERATOR(pg_catalog.||) e.enumlabel::text AS label
                  FROM pg_catalog.pg_enum AS e
                 WHERE e.enumtypid OPERATOR(pg_catalog.=) pg_catalog.to_regtype('idem_state')
                    OR e.enumtypid OPERATOR(pg_catalog.=) pg_catalog.to_regtype('idem_lease_policy')) AS l)
       OPERATOR(pg_catalog.<>) 'policy:retry,policy:unknown,state:failed,state:processing,state:retryable,state:succeeded,state:unknown'
       OR (SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute AS a
         WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records')
           AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
           AND a.atttypid OPERATOR(pg_catalog.=) CASE a.attname::text
                   WHEN 'id' THEN 'pg_catalog.int8'::pg_catalog.regtype::oid
                   WHEN 'role' THEN 'pg_catalog.regrole'::pg_catalog.regtype::oid
                   WHEN 'state' THEN pg_catalog.to_regtype('idem_state')::oid
                   WHEN 'on_lease_expiry' THEN pg_catalog.to_regtype('idem_lease_policy')::oid
                   WHEN 'attempt' THEN 'pg_catalog.int4'::pg_catalog.regtype::oid
                   WHEN 'response_status' THEN 'pg_catalog.int4'::pg_catalog.regtype::oid
                   WHEN 'ttl' THEN 'pg_catalog.interval'::pg_catalog.regtype::oid
                   WHEN 'response_headers' THEN 'pg_catalog.jsonb'::pg_catalog.regtype::oid
                   WHEN 'response_body' THEN 'pg_catalog.jsonb'::pg_catalog.regtype::oid
                   ELSE CASE WHEN a.attname::text OPERATOR(pg_catalog.=) ANY (
                                      '{fingerprint,attempt_token,response_raw_body,response_sealed,request_text_hash}'::text[])
                             THEN 'pg_catalog.bytea'::pg_catalog.regtype::oid
                             WHEN a.attname::text OPERATOR(pg_catalog.=) ANY (
                                      '{locked_until,created_at,claimed_at,updated_at,completed_at,expires_at}'::text[])
                             THEN 'pg_catalog.timestamptz'::pg_catalog.regtype::oid
                             WHEN a.attname::text OPERATOR(pg_catalog.=) ANY (
                                      '{tenant,caller,operation,key,recovery_point,resource_id,former_role}'::text[])
                             THEN 'pg_catalog.text'::pg_catalog.regtype::oid END END
           AND (a.attcollation OPERATOR(pg_catalog.=) 950
                OR a.attname::text OPERATOR(pg_catalog.<>) ALL ('{tenant,caller,operation,key}'::text[]))
           AND (a.attidentity OPERATOR(pg_catalog.<>) '' OR a.attname OPERATOR(pg_catalog.<>) 'id'))
       OPERATOR(pg_catalog.<>) 27 THEN
        RETURN false;
    END IF;
    -- the scope's unique index, each of its five columns named once, text
    -- in "C"; a unique index on id alone
    RETURN (SELECT i.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records')
                   AND i.indisunique AND i.indimmediate AND i.indisvalid AND i.indisready
                   AND i.indislive AND i.indnkeyatts OPERATOR(pg_catalog.=) 5
                   AND i.indexprs IS NULL AND i.indpred IS NULL
                   AND (SELECT pg_catalog.count(DISTINCT a.attname)
                          FROM pg_catalog.pg_attribute AS a
                         WHERE a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                           AND a.attnum OPERATOR(pg_catalog.=) ANY (i.indkey::pg_catalog.int2[])
                           AND a.attname::text OPERATOR(pg_catalog.=) ANY ('{role,tenant,caller,operation,key}'::text[]))
                       OPERATOR(pg_catalog.=) 5
                   AND pg_catalog.array_to_string(i.indcollation::pg_catalog.oid[], ',') OPERATOR(pg_catalog.=) (
                       SELECT pg_catalog.string_agg(CASE WHEN a.attname OPERATOR(pg_catalog.=) 'role' THEN '0'
                                                         ELSE '950' END, ',' ORDER BY u.n)
                         FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS u (attnum, n)
                         JOIN pg_catalog.pg_attribute AS a
                           ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                          AND a.attnum OPERATOR(pg_catalog.=) u.attnum)
              FROM pg_catalog.pg_index AS i
             WHERE i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records_scope_key'))
       AND EXISTS (SELECT FROM pg_catalog.pg_index AS i
                    WHERE i.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('idem_records')
                      AND i.indisunique AND i.indimmediate AND i.indisvalid AND i.indisready
                      AND i.indislive AND i.indnkeyatts OPERATOR(pg_catalog.=) 1
                      AND i.indexprs IS NULL AND i.indpred IS NULL
                      AND i.indclass[0] OPERATOR(pg_catalog.=) 3124
                      AND i.indkey[0] OPERATOR(pg_catalog.=) (
                          SELECT a.attnum FROM pg_catalog.pg_attribute AS a
                           WHERE a.attrelid OPERATOR(pg_catalog.=) i.indrelid
                             AND a.attname OPERATOR(pg_catalog.=) 'id'));
END
$$;

-- The table, or its scope index (scope_index), once the table passed the
-- check: the table's call checks it, the scope index's only looks the
-- index up by the name the check found it under (both are folded while
-- the one expression is planned, which fails if the check does).  See the
-- top of this file for why it is IMMUTABLE.
CREATE OR REPLACE FUNCTION idem__checked_relation(scope_index boolean)
RETURNS regclass
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT scope_index AND NOT coalesce(idem__table_fits(), false) THEN
        PERFORM idem__check_table();
    END IF;
    RETURN pg_catalog.to_regclass(CASE WHEN scope_index THEN 'idem_records_scope_key' ELSE 'idem_records' END);
END
$$;

-- True, once the table passed the check since it last changed.  Inlined
-- into the definer functions' first test.
CREATE OR REPLACE FUNCTION idem__table_checked()
RETURNS boolean
LANGUAGE sql STABLE
RETURN pg_catalog.pg_relation_filenode(idem__checked_relation(false)) IS DISTINCT FROM 0
   AND pg_catalog.pg_relation_filenode(idem__checked_relation(true)) IS DISTINCT FROM 0;

--
-- A statement that rewrites a table (ALTER TABLE ... ALTER COLUMN TYPE, a
-- volatile default, CLUSTER, VACUUM FULL) copies its rows to new storage
-- and discards the old: a record written or changed meanwhile, from an
-- expression the statement evaluates, goes to the old storage and is lost
-- with it (the key would answer proceed again, a record be deleted with
-- its archived copy lost).  The C edition refuses every write of its own
-- while a DDL statement runs in a transaction that holds the table
-- exclusively, which it learns from a hook SQL does not have.  While the
-- rows are copied, the new storage is a relation of the table's schema
-- named pg_temp_ and the table's OID, visible to the rewriting
-- transaction alone: the guard trigger (every INSERT and UPDATE of
-- idem_records) and each batch of the maintenance passes (their DELETEs
-- and the archive's INSERTs) look it up (one look-up of a name) and
-- refuse the write.  A write made before the copy begins (from a
-- table_rewrite event trigger, say) is copied with the rest, and kept.
--
CREATE OR REPLACE FUNCTION idem__refuse_write_during_rewrite(rel regclass)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('%I.%I',
           (SELECT n.nspname FROM pg_catalog.pg_class AS c
              JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
             WHERE c.oid OPERATOR(pg_catalog.=) rel),
           'pg_temp_' || rel::oid::text)) IS NOT NULL THEN
        RAISE EXCEPTION 'cannot write an idempotency record in a DDL statement while this transaction holds table "%" exclusively',
                        (SELECT c.relname FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) rel)
            USING ERRCODE = 'object_in_use',
                  DETAIL = 'The statement may be rewriting the table, and the record would be lost with its old storage.',
                  HINT = 'Claim, complete and clean up keys outside DDL statements, or once the transaction that altered the table has committed.';
    END IF;
END
$$;
