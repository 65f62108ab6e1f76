/* idempotency--1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

--
-- Record states.  The allowed transitions between them are enforced by the
-- idem_records_guard trigger below, from one table compiled into the library.
--
CREATE TYPE idem_state AS ENUM
    ('processing', 'succeeded', 'failed', 'retryable', 'unknown');

-- What happens to a processing record whose lease ends without an outcome.
CREATE TYPE idem_lease_policy AS ENUM ('unknown', 'retry');

--
-- One row per (tenant, caller, operation, key).  Scope and key columns use
-- the "C" collation: keys are opaque bytes, byte comparison is the fastest,
-- and expressions such as current_user::text carry "C" too.
--
CREATE TABLE idem_records (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant             text COLLATE "C" NOT NULL,
    caller             text COLLATE "C" NOT NULL,
    operation          text COLLATE "C" NOT NULL,
    key                text COLLATE "C" NOT NULL,
    fingerprint        bytea NOT NULL,
    state              idem_state NOT NULL,
    attempt            integer NOT NULL,
    attempt_token      bytea,
    recovery_point     text,
    locked_until       timestamptz,
    on_lease_expiry    idem_lease_policy NOT NULL,
    ttl                interval NOT NULL,
    response_status    integer,
    response_headers   jsonb,
    response_body      jsonb,
    resource_id        text,
    created_at         timestamptz NOT NULL,
    claimed_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    completed_at       timestamptz,
    expires_at         timestamptz NOT NULL,
    CONSTRAINT idem_records_fingerprint_length CHECK (octet_length(fingerprint) = 32),
    CONSTRAINT idem_records_attempt_positive CHECK (attempt >= 1),
    CONSTRAINT idem_records_status_range CHECK (response_status BETWEEN 100 AND 599),
    CONSTRAINT idem_records_headers_object CHECK (jsonb_typeof(response_headers) = 'object')
);

CREATE UNIQUE INDEX idem_records_scope_key
    ON idem_records (tenant, caller, operation, key);

-- The worker's two passes: leases to expire, finished records to delete.
CREATE INDEX idem_records_lease
    ON idem_records (locked_until) WHERE state = 'processing';
CREATE INDEX idem_records_expiry
    ON idem_records (expires_at) WHERE state IN ('succeeded', 'failed', 'retryable');

COMMENT ON TABLE idem_records IS
    'Idempotency records: one per (tenant, caller, operation, key). Change only through the idem_* functions.';

-- Records are application data: pg_dump must keep them.
SELECT pg_catalog.pg_extension_config_dump('idem_records', '');
SELECT pg_catalog.pg_extension_config_dump('idem_records_id_seq', '');

REVOKE ALL ON idem_records FROM PUBLIC;

--
-- Counts per operation and state, for dashboards and alerts.
--
CREATE VIEW idem_stats AS
SELECT operation,
       state,
       count(*) AS records,
       max(clock_timestamp() - claimed_at)
           FILTER (WHERE state = 'processing') AS oldest_processing_age,
       count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'retryable')
                          AND expires_at < clock_timestamp()) AS expired_awaiting_cleanup
  FROM idem_records
 GROUP BY operation, state;

REVOKE ALL ON idem_stats FROM PUBLIC;

--
-- Canonical JSON and the request fingerprint (src/canonical.c)
--

-- RFC 8785 canonical text of a value, numbers kept exact (README).
CREATE FUNCTION idem_canonical(value jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION idem_canonical(jsonb) IS
    'RFC 8785 canonical JSON text of a jsonb value, with numbers kept exact';

-- SHA-256 of the canonical text: the request fingerprint of idem_claim.
CREATE FUNCTION idem_fingerprint(value jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_fingerprint'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION idem_fingerprint(jsonb) IS
    'SHA-256 of idem_canonical(value) in UTF-8: the request fingerprint';


--
-- Claims, completion and replay (src/claim.c, src/state_machine.c)
--


--
-- Background worker and maintenance passes (src/worker.c)
--

