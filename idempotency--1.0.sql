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
-- One row per (role, tenant, caller, operation, key).  role is the database
-- role that called the idem_* function (current_user at the call): the
-- functions fill it in, never from an argument, so that two roles never see
-- each other's records (a raw INSERT by the owner gets its own name).
-- Scope and key columns use the "C" collation:
-- keys are opaque bytes, byte comparison is the fastest, and expressions
-- such as current_user::text carry "C" too.
--
CREATE TABLE idem_records (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role               text COLLATE "C" NOT NULL DEFAULT current_user,
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
    ON idem_records (role, tenant, caller, operation, key);

-- The worker's two passes: leases to expire, finished records to delete.
CREATE INDEX idem_records_lease
    ON idem_records (locked_until) WHERE state = 'processing';
CREATE INDEX idem_records_expiry
    ON idem_records (expires_at) WHERE state IN ('succeeded', 'failed', 'retryable');

COMMENT ON TABLE idem_records IS
    'Idempotency records: one per (role, tenant, caller, operation, key). Change only through the idem_* functions.';

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

-- Every INSERT and UPDATE of a record obeys the state machine, whoever runs it.
CREATE FUNCTION idem_records_guard() RETURNS trigger
    AS 'MODULE_PATHNAME', 'idem_records_guard'
    LANGUAGE C;

CREATE TRIGGER idem_records_guard
    BEFORE INSERT OR UPDATE ON idem_records
    FOR EACH ROW EXECUTE FUNCTION idem_records_guard();

-- The answer of idem_claim and idem_replay.
CREATE TYPE idem_decision AS (
    outcome        text,        -- proceed | replay | in_progress | mismatch | unknown
    token          text,        -- fencing token of the attempt; proceed only
    record_id      bigint,
    state          idem_state,
    attempt        integer,
    recovery_point text,        -- where a new attempt resumes
    http_status    integer,     -- stored status on replay; 409, 422, 409 otherwise
    headers        jsonb,       -- stored headers on replay
    body           jsonb,       -- stored body on replay
    error_code     text,
    retry_after    integer,     -- seconds; in_progress only
    resource_id    text         -- stored resource id on replay
);

CREATE FUNCTION idem_claim(
    operation       text,
    key             text,
    request         jsonb DEFAULT NULL,
    tenant          text DEFAULT '',
    caller          text DEFAULT current_user,
    ttl             interval DEFAULT NULL,
    lease           interval DEFAULT NULL,
    wait            interval DEFAULT NULL,
    on_lease_expiry text DEFAULT 'unknown')
    RETURNS idem_decision
    AS 'MODULE_PATHNAME', 'idem_claim'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_claim(text, text, jsonb, text, text, interval, interval, interval, text) IS
    'Claim an idempotency key: proceed, replay, in_progress, mismatch or unknown';

CREATE FUNCTION idem_complete(
    token       text,
    http_status integer,
    body        jsonb DEFAULT NULL,
    headers     jsonb DEFAULT NULL,
    resource_id text DEFAULT NULL)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_complete'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idem_fail(
    token       text,
    http_status integer,
    body        jsonb DEFAULT NULL,
    headers     jsonb DEFAULT NULL,
    retryable   boolean DEFAULT false)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_fail'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idem_heartbeat(
    token text,
    lease interval DEFAULT NULL)
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'idem_heartbeat'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idem_checkpoint(
    token          text,
    recovery_point text)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_checkpoint'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idem_replay(
    operation text,
    key       text,
    tenant    text DEFAULT '',
    caller    text DEFAULT current_user)
    RETURNS SETOF idem_decision
    AS 'MODULE_PATHNAME', 'idem_replay'
    LANGUAGE C STABLE PARALLEL RESTRICTED ROWS 1;

CREATE FUNCTION idem_resolve(
    record_id   bigint,
    state       text,
    http_status integer,
    body        jsonb DEFAULT NULL,
    headers     jsonb DEFAULT NULL)
    RETURNS void
    AS 'MODULE_PATHNAME', 'idem_resolve'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idem_derive_key(key text, step text)
    RETURNS text
    AS 'MODULE_PATHNAME', 'idem_derive_key'
    LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- Least privilege.  The functions that read or write records are not
-- SECURITY DEFINER: they run the statements on idem_records as the table's
-- owner, confined to the calling role's records.  Nobody may call them until
-- granted EXECUTE; README.md ("Security") lists the GRANT lines.
-- idem_derive_key reads nothing and stays callable by everyone.
REVOKE ALL ON FUNCTION
    idem_claim(text, text, jsonb, text, text, interval, interval, interval, text),
    idem_complete(text, integer, jsonb, jsonb, text),
    idem_fail(text, integer, jsonb, jsonb, boolean),
    idem_heartbeat(text, interval),
    idem_checkpoint(text, text),
    idem_replay(text, text, text, text),
    idem_resolve(bigint, text, integer, jsonb, jsonb),
    idem_records_guard()
    FROM PUBLIC;


--
-- Background worker and maintenance passes (src/worker.c)
--

-- The worker's two passes, callable from SQL (servers without the preload,
-- pg_cron).  They run in the caller's transaction; NULL means the setting.
CREATE FUNCTION idem_expire_leases(max_rows integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_expire_leases'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_expire_leases(integer) IS
    'Move at most max_rows processing records whose lease ended to unknown or retryable; returns how many.';

CREATE FUNCTION idem_cleanup(batch_size integer DEFAULT NULL,
                             max_batches integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_cleanup(integer, integer) IS
    'Delete expired succeeded, failed and retryable records, batch_size rows per statement, at most max_batches statements; returns how many.';

-- Start the worker of the current database without a restart.
CREATE FUNCTION idem_launch_worker()
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_launch_worker'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION idem_launch_worker() IS
    'Start the idempotency worker of the current database; returns its pid.';

-- What each database's worker has done since it started.
CREATE FUNCTION idem_worker_status(
    OUT database text,
    OUT pid integer,
    OUT started_at timestamptz,
    OUT last_cycle_at timestamptz,
    OUT cycles bigint,
    OUT rows_expired bigint,
    OUT rows_deleted bigint,
    OUT cleanup_batches bigint,
    OUT last_error text,
    OUT last_error_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_worker_status'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;

COMMENT ON FUNCTION idem_worker_status() IS
    'Per database: the idempotency worker''s pid (NULL once it exited), start, last cycle, counters since start and last error.';

REVOKE ALL ON FUNCTION idem_expire_leases(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_cleanup(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_launch_worker() FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_worker_status() FROM PUBLIC;
