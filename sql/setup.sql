--
-- The extension installs its objects and nothing else.
--
CREATE EXTENSION idempotency;

-- Every object the extension owns, by kind.  The types PostgreSQL makes
-- with another object, a table's or view's row type and a type's array
-- type, are left out: PostgreSQL 18 records them as members too, 15 does not.
SELECT pg_describe_object(classid, objid, objsubid) AS object
  FROM pg_depend d
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND deptype = 'e'
   AND NOT EXISTS (SELECT FROM pg_type t
                    WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
                      AND (EXISTS (SELECT FROM pg_type e WHERE e.typarray = t.oid)
                           OR EXISTS (SELECT FROM pg_class c
                                       WHERE c.oid = t.typrelid AND c.relkind <> 'c')))
 ORDER BY 1;

-- Scope and key columns compare bytes ("C"), so that an expression such as
-- current_user::text can use the unique index; role holds the role's
-- identity (regrole), which has no collation.
SELECT attname, collname
  FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
 WHERE attrelid = 'idem_records'::regclass AND attnum > 0
 ORDER BY attnum;

SELECT indexrelid::regclass AS index, indisunique AS is_unique,
       pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indrelid = 'idem_records'::regclass
 ORDER BY indexrelid::regclass::text;

EXPLAIN (COSTS OFF)
SELECT * FROM idem_records
 WHERE role = to_regrole(current_user::text) AND tenant = '' AND caller = ''
   AND operation = 'payments.create' AND key = 'k1';

-- The record states, in order.
SELECT enum_range(NULL::idem_state);
SELECT enum_range(NULL::idem_lease_policy);

-- Records are dumped with the application's data.
SELECT extconfig::regclass[] FROM pg_extension WHERE extname = 'idempotency';

-- Nobody but the owner reads the table.
SELECT has_table_privilege('public', 'idem_records', 'SELECT') AS public_can_read;
-- ... and nobody may call the functions that touch records until granted:
-- only the pure functions (no record read or written) are open to PUBLIC.
SELECT p.oid::regprocedure AS open_to_public
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND d.deptype = 'e'
   AND has_function_privilege('public', p.oid, 'EXECUTE')
   AND p.proname NOT IN ('idem_derive_key', 'idem_canonical', 'idem_fingerprint')
 ORDER BY p.proname;
SELECT has_function_privilege('public', 'idem_claim(text,text,jsonb,text,text,interval,interval,interval,text,text)',
                              'EXECUTE') AS public_can_claim;

-- The settings and their defaults, whatever the server's configuration.
SELECT name, boot_val, unit, context FROM pg_settings
 WHERE name LIKE 'idempotency.%' ORDER BY name;

-- An empty table gives empty statistics.
SELECT * FROM idem_stats;
