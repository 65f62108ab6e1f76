-- examples/sharding/proxy.sql: the proxy database of the PL/Proxy layout
-- (see docs/scaling.md).
--
-- Run by a superuser in the proxy database, with the connection strings of
-- the four shards (partitions 0 to 3, in order; without user=, PL/Proxy
-- connects as the role that called the proxy function):
--     psql -v ON_ERROR_STOP=1 -d proxy -f examples/sharding/proxy.sql \
--          -v p0='host=db0 dbname=shard0' -v p1='host=db1 dbname=shard1' \
--          -v p2='host=db2 dbname=shard2' -v p3='host=db3 dbname=shard3'
-- It is one transaction: when a step fails, nothing is kept.
--
-- The proxy holds no data.  Each function below has the name, arguments and
-- result columns of the shard function it calls (shard.sql) and says where
-- the call runs: RUN ON hashtext(tenant) for everything that reads or writes
-- one tenant's records, RUN ON ALL for what is gathered from every shard.
-- Each call runs on its shard in a transaction of its own, committed when
-- the call returns: the proxy's own transaction does not span the shards
-- (a ROLLBACK on the proxy takes nothing back).

BEGIN;

CREATE EXTENSION IF NOT EXISTS plproxy;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_app') THEN
        CREATE ROLE idem_app LOGIN;
    END IF;
END
$$;

-- The cluster: four partitions.  PL/Proxy wants a power of two and sends a
-- call to partition hash & 3.
CREATE SERVER tenants FOREIGN DATA WRAPPER plproxy
    OPTIONS (connection_lifetime '1800',
             p0 :'p0', p1 :'p1', p2 :'p2', p3 :'p3');
CREATE USER MAPPING FOR PUBLIC SERVER tenants;
GRANT USAGE ON FOREIGN SERVER tenants TO idem_app;

--
-- One tenant's calls, on the tenant's shard.
--

-- The one-transaction pattern: one call, one transaction on the shard.
CREATE FUNCTION pay(tenant text, key text, amount bigint, currency text,
                    OUT outcome text, OUT http_status integer, OUT payment_id text,
                    OUT body jsonb, OUT error_code text, OUT retry_after integer)
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON hashtext(tenant);
$$;

-- The three-transaction pattern.  The token names a record of the shard
-- that issued it: complete and fail take the tenant with the token, and are
-- routed by it to that shard.
CREATE FUNCTION claim(tenant text, operation text, key text, request jsonb, lease interval,
                      OUT outcome text, OUT token text, OUT http_status integer,
                      OUT body jsonb, OUT resource_id text, OUT error_code text,
                      OUT retry_after integer)
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON hashtext(tenant);
$$;

CREATE FUNCTION complete(tenant text, token text, http_status integer, body jsonb,
                         resource_id text) RETURNS boolean
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON hashtext(tenant);
$$;

CREATE FUNCTION fail(tenant text, token text, http_status integer, body jsonb,
                     retryable boolean) RETURNS boolean
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON hashtext(tenant);
$$;

CREATE FUNCTION replay(tenant text, operation text, key text,
                       OUT outcome text, OUT http_status integer, OUT body jsonb,
                       OUT resource_id text, OUT error_code text)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON hashtext(tenant);
$$;

--
-- Gathered from every shard, in parallel.
--

-- idem_stats of each shard (the caller needs SELECT on idem_stats there).
CREATE FUNCTION shard_stats(OUT shard text, OUT operation text, OUT state text,
                            OUT records bigint, OUT oldest_processing_age interval,
                            OUT expired_awaiting_cleanup bigint)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON ALL;
$$;

-- ... and their sum, per operation and state.
CREATE FUNCTION stats(OUT operation text, OUT state text, OUT records bigint,
                      OUT oldest_processing_age interval,
                      OUT expired_awaiting_cleanup bigint, OUT shards integer)
RETURNS SETOF record
LANGUAGE sql AS $$
    SELECT operation, state, sum(records)::bigint, max(oldest_processing_age),
           sum(expired_awaiting_cleanup)::bigint, count(DISTINCT shard)::integer
      FROM shard_stats()
     GROUP BY operation, state
     ORDER BY operation, state
$$;

-- The calling role's records in a state, from every shard, through
-- idem_list (version 1.1): each shard answers at most max_rows, and list()
-- keeps max_rows of them.
CREATE FUNCTION shard_list(state text, operation text, older_than interval, max_rows integer,
                           OUT shard text, OUT record jsonb)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON ALL;
$$;

CREATE FUNCTION list(state text, operation text DEFAULT NULL,
                     older_than interval DEFAULT NULL, max_rows integer DEFAULT 100,
                     OUT shard text, OUT record jsonb)
RETURNS SETOF record
LANGUAGE sql AS $$
    SELECT shard, record
      FROM shard_list(state, operation, older_than, max_rows)
     ORDER BY shard
     LIMIT max_rows
$$;

-- The counters of idem_stat_operations (version 1.1) from every shard.
-- Where several shards share a server, each reports the whole server's
-- rows: stat_operations() keeps the rows of each shard's own database.
CREATE FUNCTION shard_stat_operations(OUT shard text, OUT counters jsonb)
RETURNS SETOF record
LANGUAGE plproxy AS $$
    CLUSTER 'tenants';
    RUN ON ALL;
$$;

CREATE FUNCTION stat_operations(OUT shard text, OUT counters jsonb)
RETURNS SETOF record
LANGUAGE sql AS $$
    SELECT shard, counters
      FROM shard_stat_operations()
     WHERE coalesce(counters ->> 'database', counters ->> 'datname', shard) = shard
     ORDER BY shard
$$;

REVOKE ALL ON FUNCTION pay, claim, complete, fail, replay, shard_stats, stats,
                       shard_list, list, shard_stat_operations, stat_operations FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pay, claim, complete, fail, replay, shard_list, list TO idem_app;

COMMIT;
