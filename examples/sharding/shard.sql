-- examples/sharding/shard.sql: one shard of the PL/Proxy layout (see
-- docs/scaling.md).
--
-- Run by a superuser in each shard database, with the shard's partition
-- number and the number of partitions:
--     psql -v ON_ERROR_STOP=1 -v partition=0 -v partitions=4 -d shard0 \
--          -f examples/sharding/shard.sql
-- It is one transaction: when a step fails, nothing is kept.
--
-- A shard holds whole tenants: their business rows (payments) and their
-- idempotency records, so that a claim, the business write and the
-- completion are one local transaction.  The functions below are what the
-- proxy database (proxy.sql) calls, with the same names and arguments; each
-- checks first that the tenant belongs to this shard, so that a call that
-- reaches the wrong shard (a stale proxy configuration, a direct call)
-- writes nothing.

BEGIN;

CREATE EXTENSION IF NOT EXISTS idempotency;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_app') THEN
        CREATE ROLE idem_app LOGIN;
    END IF;
END
$$;

-- The application role gets the functions below and nothing on
-- idem_records; the proxy connects to the shard as the role that called it.
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_replay TO idem_app;
-- Its own records and counters, gathered from every shard by the proxy's
-- list() and stat_operations() (a role sees only its own rows of both).
GRANT EXECUTE ON FUNCTION idem_list, idem_stat_operations() TO idem_app;
GRANT SELECT ON idem_stat_operations TO idem_app;

-- Which partition this database is.  PL/Proxy sends a call for a tenant to
-- partition hashtext(tenant) & (partitions - 1).  When tenants are moved
-- (docs/scaling.md, "Resharding"), this row changes with the proxy's
-- configuration.
CREATE TABLE shard_self (
    partition  integer NOT NULL,
    partitions integer NOT NULL CHECK (partitions > 0 AND partitions & (partitions - 1) = 0),
    CHECK (partition >= 0 AND partition < partitions)
);
CREATE UNIQUE INDEX shard_self_one_row ON shard_self ((true));
INSERT INTO shard_self VALUES (:'partition', :'partitions');
GRANT SELECT ON shard_self TO idem_app;

-- The business table: every row carries its tenant.
CREATE TABLE payments (
    id              text PRIMARY KEY
                    DEFAULT 'pay_' || replace(gen_random_uuid()::text, '-', ''),
    tenant          text NOT NULL,
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payments_tenant ON payments (tenant);
GRANT SELECT, INSERT ON payments TO idem_app;

-- Refuse a tenant that is not this shard's.
CREATE FUNCTION shard_check(tenant text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    self shard_self;
BEGIN
    IF tenant IS NULL THEN
        -- hashtext(NULL) is NULL, which the comparison below would let by
        RAISE EXCEPTION 'tenant must not be null'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO STRICT self FROM shard_self;
    IF (hashtext(tenant) & (self.partitions - 1)) <> self.partition THEN
        RAISE EXCEPTION 'tenant "%" does not belong to this shard', tenant
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = format('This database is partition %s of %s; the tenant hashes to partition %s.',
                                  self.partition, self.partitions,
                                  hashtext(tenant) & (self.partitions - 1)),
                  HINT = 'Call through the proxy database.';
    END IF;
END
$$;

-- Refuse a token sent with another tenant than the one it was claimed for.
-- The token names a record of this shard by its id; shard_token_tenant()
-- reads the record's tenant, which the application role cannot read
-- itself (it has no privilege on idem_records): SECURITY DEFINER, with its
-- search_path pinned to the extension's schema, and answering only about
-- records of a role the session may act as.  A token that names no record
-- of the role passes here, and idem_complete or idem_fail refuses it.
DO $do$
BEGIN
    EXECUTE format($f$
CREATE FUNCTION shard_token_tenant(token text, owner_role text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = %I, pg_temp AS $body$
BEGIN
    IF NOT pg_catalog.pg_has_role(session_user, owner_role, 'MEMBER') THEN
        RAISE EXCEPTION 'permission denied to read the records of role "%%"', owner_role
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF token !~ '^[0-9]{1,18}[.]' THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT r.tenant FROM idem_records r
             WHERE r.id = split_part(token, '.', 1)::bigint AND r.role = pg_catalog.to_regrole(pg_catalog.quote_ident(owner_role)));
END
$body$$f$,
    (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
      WHERE e.extname = 'idempotency'));
END
$do$;

CREATE FUNCTION shard_check_token(tenant text, token text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    claimed_for text := shard_token_tenant(token, current_user::text);
BEGIN
    IF claimed_for IS NOT NULL AND claimed_for IS DISTINCT FROM tenant THEN
        RAISE EXCEPTION 'attempt token belongs to another tenant'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'The token names an attempt claimed for another tenant of this shard.',
                  HINT = 'Send the token with the tenant of its claim.';
    END IF;
END
$$;

--
-- The one-transaction pattern: a payment of the tenant, claimed, written and
-- completed in the one transaction of this call.  Retries of the key replay
-- the stored answer; the payment exists once.
--
CREATE FUNCTION pay(tenant text, key text, amount bigint, currency text,
                    OUT outcome text, OUT http_status integer, OUT payment_id text,
                    OUT body jsonb, OUT error_code text, OUT retry_after integer)
LANGUAGE plpgsql AS $$
DECLARE
    d idem_decision;
BEGIN
    PERFORM shard_check(pay.tenant);
    SELECT * INTO d
      FROM idem_claim('payments.create', pay.key,
                      jsonb_build_object('amount', pay.amount, 'currency', pay.currency),
                      tenant => pay.tenant);
    IF d.outcome = 'proceed' THEN
        INSERT INTO payments (tenant, idempotency_key, amount, currency)
             VALUES (pay.tenant, pay.key, pay.amount, pay.currency)
          RETURNING id INTO payment_id;
        body := jsonb_build_object('id', payment_id, 'amount', pay.amount,
                                   'currency', pay.currency);
        PERFORM idem_complete(d.token, 201, body, resource_id => payment_id);
        outcome := 'proceed';
        http_status := 201;
        RETURN;
    END IF;
    outcome := d.outcome;
    http_status := d.http_status;
    payment_id := d.resource_id;
    body := d.body;
    error_code := d.error_code;
    retry_after := d.retry_after;
END
$$;

--
-- The three-transaction pattern: claim (commits a processing record with a
-- lease), the external call, then complete or fail with the token.  A token
-- is shard-local (it names a record id of this shard's table): the tenant
-- travels with it, and the proxy routes the completion by the tenant.
--
CREATE FUNCTION claim(tenant text, operation text, key text, request jsonb, lease interval,
                      OUT outcome text, OUT token text, OUT http_status integer,
                      OUT body jsonb, OUT resource_id text, OUT error_code text,
                      OUT retry_after integer)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shard_check(claim.tenant);
    SELECT d.outcome, d.token, d.http_status, d.body, d.resource_id, d.error_code, d.retry_after
      INTO claim.outcome, claim.token, claim.http_status, claim.body, claim.resource_id,
           claim.error_code, claim.retry_after
      FROM idem_claim(claim.operation, claim.key, claim.request, tenant => claim.tenant,
                      lease => claim.lease) d;
END
$$;

CREATE FUNCTION complete(tenant text, token text, http_status integer, body jsonb,
                         resource_id text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shard_check(complete.tenant);
    PERFORM shard_check_token(complete.tenant, complete.token);
    PERFORM idem_complete(complete.token, complete.http_status, complete.body,
                          resource_id => complete.resource_id);
    RETURN true;
END
$$;

CREATE FUNCTION fail(tenant text, token text, http_status integer, body jsonb,
                     retryable boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shard_check(fail.tenant);
    PERFORM shard_check_token(fail.tenant, fail.token);
    PERFORM idem_fail(fail.token, fail.http_status, fail.body, retryable => fail.retryable);
    RETURN true;
END
$$;

CREATE FUNCTION replay(tenant text, operation text, key text,
                       OUT outcome text, OUT http_status integer, OUT body jsonb,
                       OUT resource_id text, OUT error_code text)
RETURNS SETOF record
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shard_check(replay.tenant);
    RETURN QUERY
        SELECT d.outcome, d.http_status, d.body, d.resource_id, d.error_code
          FROM idem_replay(replay.operation, replay.key, replay.tenant) d;
END
$$;

--
-- Gathered from every shard by the proxy (RUN ON ALL).
--

-- idem_stats of this shard, for monitoring roles (granted SELECT on
-- idem_stats, which this function reads with the caller's rights).
CREATE FUNCTION shard_stats(OUT shard text, OUT operation text, OUT state text,
                            OUT records bigint, OUT oldest_processing_age interval,
                            OUT expired_awaiting_cleanup bigint)
RETURNS SETOF record
LANGUAGE sql STABLE AS $$
    SELECT current_database()::text, s.operation, s.state::text, s.records,
           s.oldest_processing_age, s.expired_awaiting_cleanup
      FROM idem_stats s
$$;

-- The calling role's records in a state, through idem_list (version 1.1):
-- each record as a jsonb object of idem_list's columns.  Until the
-- extension has idem_list, calling it raises "function idem_list(...) does
-- not exist".  The arguments are passed as untyped literals, so that
-- idem_list's own argument types apply.
CREATE FUNCTION shard_list(state text, operation text, older_than interval, max_rows integer,
                           OUT shard text, OUT record jsonb)
RETURNS SETOF record
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE format(
        'SELECT current_database()::text, to_jsonb(l) FROM idem_list(%L, %L, %L, %L) l',
        state, operation, older_than, max_rows);
END
$$;

-- The counters of idem_stat_operations (version 1.1), each row as a jsonb
-- object of the view's columns.  The view covers the whole server: where
-- several shards share one server, each reports the same rows, and the
-- caller keeps those of the shard's database.
CREATE FUNCTION shard_stat_operations(OUT shard text, OUT counters jsonb)
RETURNS SETOF record
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE
        'SELECT current_database()::text, to_jsonb(s) FROM idem_stat_operations s';
END
$$;

REVOKE ALL ON FUNCTION shard_check, shard_token_tenant, shard_check_token, pay, claim, complete, fail, replay, shard_stats,
                       shard_list, shard_stat_operations FROM PUBLIC;
GRANT EXECUTE ON FUNCTION shard_check, shard_token_tenant, shard_check_token, pay, claim, complete, fail, replay, shard_list
    TO idem_app;

COMMIT;
