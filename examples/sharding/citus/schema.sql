-- examples/sharding/citus/schema.sql: the Citus layout (docs/scaling.md,
-- "Citus"; README.md beside this file).
--
-- Run by a superuser on the coordinator, in the database Citus serves, once
-- the workers are added (citus_add_node) and the idempotency library is in
-- shared_preload_libraries on every node:
--     psql -v ON_ERROR_STOP=1 -d appdb -f examples/sharding/citus/schema.sql
--
-- idem_records stays an ordinary table on each node: the extension's
-- functions write it directly, through none of the hooks by which Citus
-- routes writes, and refuse to run when it is a Citus table of any kind.
-- The business tables are distributed by tenant, and every function that
-- claims is delegated to the node of the tenant's shard, where it checks
-- first that the tenant's shard is placed there and that this node holds
-- the records of that shard's tenants.

-- CREATE EXTENSION on the coordinator creates it on every worker too;
-- Citus makes no shell of an extension's tables, so each node has its own
-- idem_records.
CREATE EXTENSION IF NOT EXISTS idempotency;

-- Two roles (Citus creates them on every node): idem_app, the
-- application's, and idem_layout, which owns the layout's functions and
-- which they run as (SECURITY DEFINER).  The application gets EXECUTE on
-- pay, claim, complete and fail only: it cannot call the extension's
-- functions on any node, so every claim passes the placement check below.
-- The records are idem_layout's; the tenant, part of their scope, is what
-- keeps one tenant's records from another's.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_app') THEN
        CREATE ROLE idem_app LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_layout') THEN
        CREATE ROLE idem_layout NOLOGIN;
    END IF;
END
$$;

SELECT run_command_on_all_nodes($$
    REVOKE ALL ON FUNCTION idem_claim, idem_complete, idem_fail, idem_replay FROM PUBLIC, idem_app
$$);
SELECT run_command_on_all_nodes($$
    GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_replay TO idem_layout
$$);

-- Each node numbers its records from its own range: group g from
-- g * 10^15 + 1 (never lowered).  A token names a record by its id, so the
-- records of a shard moved by hand keep their ids, and their open
-- attempts' tokens, on the new node, beside that node's own (README.md,
-- "Moving a shard with its records").
SELECT run_command_on_all_nodes($$
    SELECT setval(pg_get_serial_sequence('idem_records', 'id'),
                  greatest((SELECT groupid FROM pg_dist_local_group)::bigint * 1000000000000000,
                           (SELECT coalesce(max(id), 0) FROM idem_records), 1))
$$);

-- The business table, distributed by tenant: every unique index holds it.
CREATE TABLE payments (
    tenant          text NOT NULL,
    id              text NOT NULL
                    DEFAULT 'pay_' || replace(gen_random_uuid()::text, '-', ''),
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);
SELECT create_distributed_table('payments', 'tenant');
GRANT SELECT ON payments TO idem_app;
GRANT SELECT, INSERT ON payments TO idem_layout;

-- Where the records of each shard's tenants are: the node (its group) whose
-- idem_records they were written to.  Filled here from the placements of
-- the payments shards; a shard moved to another node (the rebalancer,
-- citus_move_shard_placement, citus_drain_node) or split into new shards
-- leaves it behind, and the check below refuses its tenants on every node
-- until the shard is back where its records are.  A reference table: every
-- node reads it locally.
CREATE TABLE records_home (
    shardid bigint PRIMARY KEY,
    groupid integer NOT NULL
);
SELECT create_reference_table('records_home');
INSERT INTO records_home (shardid, groupid)
SELECT p.shardid, p.groupid
  FROM pg_dist_placement p JOIN pg_dist_shard s USING (shardid)
 WHERE s.logicalrelid = 'payments'::regclass;
GRANT SELECT ON records_home TO idem_layout;

-- The rebalancer leaves the shards of payments' colocation group where
-- they are: a shard of the group is allowed only on the node where it is
-- placed (the others' shards go where the rebalancer wants).  Its records
-- would stay behind if it moved.  The default strategy of the rebalancer
-- and of citus_drain_node, which then warns that it may not move these
-- shards; citus_move_shard_placement, called by hand, does not ask it.
-- To move a shard with its records: README.md, "Moving a shard with its
-- records".
CREATE FUNCTION records_pinned(shardid bigint, nodeid integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
               SELECT 1 FROM pg_dist_shard s JOIN pg_dist_partition p USING (logicalrelid)
                WHERE s.shardid = $1
                  AND p.colocationid = (SELECT colocationid FROM pg_dist_partition
                                         WHERE logicalrelid = 'payments'::regclass))
        OR EXISTS (
               SELECT 1 FROM pg_dist_placement pl JOIN pg_dist_node n USING (groupid)
                WHERE pl.shardid = $1 AND n.nodeid = $2)
$$;
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION records_pinned(bigint, integer) SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END
$do$;
SELECT citus_add_rebalance_strategy('pin_records', 'citus_shard_cost_1', 'citus_node_capacity_1',
                                    'records_pinned', 0);
SELECT citus_set_default_rebalance_strategy('pin_records');

-- The shard's distribution metadata, locked in share mode until the end of
-- the transaction, as Citus's own writes to a shard lock it: a shard move
-- takes it exclusively for its last phase, so the move waits for a claim
-- that passed the check below, and a claim that starts during that phase
-- waits for it and then sees the shard's new placement.  Citus lets only
-- the shard's owner take it: SECURITY DEFINER, owned by the superuser
-- running this file.
CREATE FUNCTION tenant_shard_lock(shard bigint) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT lock_shard_metadata(5, ARRAY[shard])
$$;

-- Refuse, with 22023 and before anything is written, a call for a tenant
-- whose payments shard is not placed on this node, or whose records are
-- not on this node.  The messages reach the application role: they name
-- what it can read itself (the shard, pg_dist_placement, the local group),
-- never records_home's rows, which are not its (the operator reads where
-- the records are there).
CREATE FUNCTION tenant_check(tenant text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    shard bigint;
    here integer;
    placed integer;
    home integer;
BEGIN
    IF tenant IS NULL THEN
        RAISE EXCEPTION 'tenant must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    shard := get_shard_id_for_distribution_column('payments', tenant);
    PERFORM tenant_shard_lock(shard);
    SELECT groupid INTO STRICT here FROM pg_dist_local_group;
    SELECT min(groupid) INTO placed FROM pg_dist_placement WHERE shardid = shard;
    IF placed IS DISTINCT FROM here THEN
        RAISE EXCEPTION 'tenant "%" is not placed on this node', tenant
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('Its shard %s is placed on group %s; this node is group %s.',
                                  shard, placed, here),
                  HINT = 'Call the function on the coordinator with the tenant as a constant, so that Citus delegates it to the tenant''s node.';
    END IF;
    SELECT groupid INTO home FROM records_home WHERE shardid = shard;
    IF home IS DISTINCT FROM here THEN
        RAISE EXCEPTION 'the idempotency records of tenant "%" are not on this node', tenant
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('Its shard %s is placed on this node, group %s; its records are not: idem_records does not move with a shard.',
                                  shard, placed),
                  HINT = 'Move the shard back to the node of its records (examples/sharding/citus/README.md).';
    END IF;
END
$$;

-- The check's names are resolved in pg_catalog and this schema only, with
-- pg_temp last: by the caller's search_path, where pg_temp comes first,
-- temporary tables named pg_dist_placement, pg_dist_local_group or
-- records_home would make it pass on a node that is not the tenant's.
DO $do$
BEGIN
    EXECUTE format('ALTER FUNCTION tenant_check(text) SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END
$do$;

-- Refuse a token sent with another tenant than the one it was claimed for.
-- The token names a record of this node by its id; tenant_of_token() reads
-- the tenant of that record of idem_layout, which idem_layout cannot read
-- itself: SECURITY DEFINER, with its search_path pinned to the extension's
-- schema, and idem_layout's alone.  A token that names no record of
-- idem_layout passes here, and idem_complete or idem_fail refuses it.
DO $do$
BEGIN
    EXECUTE format($f$
CREATE FUNCTION tenant_of_token(token text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %I, pg_temp AS $body$
BEGIN
    IF token !~ '^[0-9]{1,18}[.]' THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT r.tenant FROM idem_records r
             WHERE r.id = split_part(token, '.', 1)::bigint AND r.role = 'idem_layout'::regrole);
END
$body$$f$,
    (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
      WHERE e.extname = 'idempotency'));
END
$do$;

CREATE FUNCTION tenant_check_token(tenant text, token text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    claimed_for text := tenant_of_token(token);
BEGIN
    IF claimed_for IS NOT NULL AND claimed_for IS DISTINCT FROM tenant THEN
        RAISE EXCEPTION 'attempt token belongs to another tenant'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The token names an attempt claimed for another tenant of this node.',
                  HINT = 'Send the token with the tenant of its claim.';
    END IF;
END
$$;

-- The layout's functions are in two parts.  pay_delegated, claim_delegated,
-- complete_delegated and fail_delegated do the work: Citus delegates them
-- to the tenant's node, where they run as idem_layout.  pay, claim,
-- complete and fail, which the application calls, are one-line SQL
-- functions that PostgreSQL inlines while planning the call, before Citus
-- looks at it: the call becomes one of the delegated function, with the
-- tenant passed through tenant_required().  That function is immutable, so
-- the planner evaluates it on a constant tenant; on a NULL tenant it raises
-- 22004 there, before Citus's delegation, which ends the backend on a NULL
-- distribution argument (Citus 13.2.2), before any check of EXECUTE.

CREATE FUNCTION tenant_required(tenant text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF tenant IS NULL THEN
        RAISE EXCEPTION 'tenant must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN tenant;
END
$$;

-- What pay and claim answer (a named type: PostgreSQL does not inline a
-- function that returns record, nor folds a STRICT one that does).
CREATE TYPE pay_result AS (outcome text, http_status integer, payment_id text, body jsonb,
                           error_code text, retry_after integer);
CREATE TYPE claim_result AS (outcome text, token text, http_status integer, body jsonb,
                             resource_id text, error_code text, retry_after integer);

-- The arguments of each call but the tenant, in one value that is never
-- NULL itself (a row of NULLs is not a NULL): the delegated functions take
-- the tenant and that value, and are STRICT.  The planner then replaces a
-- call of one with a NULL constant tenant by NULL, before Citus sees it:
-- whoever calls them directly, with or without EXECUTE on them, never
-- reaches Citus's delegation with a NULL distribution argument, while the
-- other arguments may still be NULL (a body, a resource id, a lease).
CREATE TYPE pay_call AS (key text, amount bigint, currency text);
CREATE TYPE claim_call AS (operation text, key text, request jsonb, lease interval);
CREATE TYPE complete_call AS (token text, http_status integer, body jsonb, resource_id text);
CREATE TYPE fail_call AS (token text, http_status integer, body jsonb, retryable boolean);

--
-- The one-transaction pattern: a payment of the tenant, claimed, written and
-- completed in the one transaction of this call, on the tenant's node.
--
CREATE FUNCTION pay_delegated(tenant text, call pay_call)
RETURNS pay_result
LANGUAGE plpgsql STRICT AS $$
DECLARE
    d idem_decision;
    r pay_result;
BEGIN
    PERFORM tenant_check(pay_delegated.tenant);
    SELECT * INTO d
      FROM idem_claim('payments.create', call.key,
                      jsonb_build_object('amount', call.amount,
                                         'currency', call.currency),
                      tenant => pay_delegated.tenant);
    IF d.outcome = 'proceed' THEN
        INSERT INTO payments (tenant, idempotency_key, amount, currency)
             VALUES (pay_delegated.tenant, call.key, call.amount,
                     call.currency)
          RETURNING id INTO r.payment_id;
        r.body := jsonb_build_object('id', r.payment_id, 'amount', call.amount,
                                     'currency', call.currency);
        PERFORM idem_complete(d.token, 201, r.body, resource_id => r.payment_id);
        r.outcome := 'proceed';
        r.http_status := 201;
        RETURN r;
    END IF;
    r.outcome := d.outcome;
    r.http_status := d.http_status;
    r.payment_id := d.resource_id;
    r.body := d.body;
    r.error_code := d.error_code;
    r.retry_after := d.retry_after;
    RETURN r;
END
$$;

--
-- The three-transaction pattern: claim (commits a processing record with a
-- lease), the external call, then complete or fail with the token.  The
-- token names a record of the tenant's node: the tenant travels with it,
-- and Citus delegates the completion by the tenant.
--
CREATE FUNCTION claim_delegated(tenant text, call claim_call) RETURNS claim_result
LANGUAGE plpgsql STRICT AS $$
DECLARE
    r claim_result;
BEGIN
    PERFORM tenant_check(claim_delegated.tenant);
    SELECT d.outcome, d.token, d.http_status, d.body, d.resource_id, d.error_code, d.retry_after
      INTO r.outcome, r.token, r.http_status, r.body, r.resource_id, r.error_code, r.retry_after
      FROM idem_claim(call.operation, call.key, call.request,
                      tenant => claim_delegated.tenant, lease => call.lease) d;
    RETURN r;
END
$$;

CREATE FUNCTION complete_delegated(tenant text, call complete_call) RETURNS boolean
LANGUAGE plpgsql STRICT AS $$
BEGIN
    PERFORM tenant_check(complete_delegated.tenant);
    PERFORM tenant_check_token(complete_delegated.tenant, call.token);
    PERFORM idem_complete(call.token, call.http_status,
                          call.body, resource_id => call.resource_id);
    RETURN true;
END
$$;

CREATE FUNCTION fail_delegated(tenant text, call fail_call) RETURNS boolean
LANGUAGE plpgsql STRICT AS $$
BEGIN
    PERFORM tenant_check(fail_delegated.tenant);
    PERFORM tenant_check_token(fail_delegated.tenant, call.token);
    PERFORM idem_fail(call.token, call.http_status, call.body,
                      retryable => call.retryable);
    RETURN true;
END
$$;

-- The delegated functions run as idem_layout, whoever calls them, with
-- their names resolved in pg_catalog, this schema and the extension's only
-- (pg_temp last): the caller's search_path cannot put a table or function
-- of its own in their way.
DO $do$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['pay_delegated(text, pay_call)',
                             'claim_delegated(text, claim_call)',
                             'complete_delegated(text, complete_call)',
                             'fail_delegated(text, fail_call)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, %I, %I, pg_temp',
                       f, current_schema(),
                       (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                         WHERE e.extname = 'idempotency'));
        EXECUTE format('ALTER FUNCTION %s OWNER TO idem_layout', f);
    END LOOP;
END
$do$;

-- Citus creates every function above on each node too.  These four are
-- delegated by the tenant, in its shard's colocation group;
-- force_delegation: also inside a transaction block, which then runs on
-- the tenant's node until it ends.
SELECT create_distributed_function('pay_delegated(text, pay_call)', 'tenant',
                                   colocate_with => 'payments', force_delegation => true);
SELECT create_distributed_function('claim_delegated(text, claim_call)', 'tenant',
                                   colocate_with => 'payments', force_delegation => true);
SELECT create_distributed_function('complete_delegated(text, complete_call)', 'tenant',
                                   colocate_with => 'payments', force_delegation => true);
SELECT create_distributed_function('fail_delegated(text, fail_call)', 'tenant',
                                   colocate_with => 'payments', force_delegation => true);

-- What the application calls.  Inlined, so: LANGUAGE sql, one SELECT of
-- one call, neither SECURITY DEFINER nor SET nor STRICT.
CREATE FUNCTION pay(tenant text, key text, amount bigint, currency text) RETURNS pay_result
LANGUAGE sql AS $$
    SELECT pay_delegated(tenant_required(tenant), ROW(key, amount, currency)::pay_call)
$$;
CREATE FUNCTION claim(tenant text, operation text, key text, request jsonb, lease interval)
RETURNS claim_result
LANGUAGE sql AS $$
    SELECT claim_delegated(tenant_required(tenant), ROW(operation, key, request, lease)::claim_call)
$$;
CREATE FUNCTION complete(tenant text, token text, http_status integer, body jsonb,
                         resource_id text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT complete_delegated(tenant_required(tenant), ROW(token, http_status, body, resource_id)::complete_call)
$$;
CREATE FUNCTION fail(tenant text, token text, http_status integer, body jsonb,
                     retryable boolean) RETURNS boolean
LANGUAGE sql AS $$
    SELECT fail_delegated(tenant_required(tenant), ROW(token, http_status, body, retryable)::fail_call)
$$;

-- The helpers are idem_layout's to call; the application calls pay,
-- claim, complete and fail, and, through them, tenant_required and the
-- delegated functions (an inlined call is checked as the caller's).
REVOKE ALL ON FUNCTION tenant_shard_lock, tenant_check, tenant_of_token, tenant_check_token,
                       tenant_required, pay_delegated, claim_delegated, complete_delegated,
                       fail_delegated, pay, claim, complete, fail FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tenant_shard_lock, tenant_check, tenant_of_token, tenant_check_token
   TO idem_layout;
GRANT EXECUTE ON FUNCTION tenant_required, pay_delegated, claim_delegated, complete_delegated,
                          fail_delegated, pay, claim, complete, fail TO idem_app;
