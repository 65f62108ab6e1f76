--
-- The state machine holds for raw statements too, even the table owner's.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default
SET idempotency.default_lease = '1h';

SELECT (c).token AS token, (c).record_id AS id
  FROM idem_claim('orders.create', 'sm-1', '{"sku": "A"}') c \gset

-- Records are born processing at attempt 1 (or succeeded without any
-- response, token or lease: an idem_inbox record), never finished with an
-- answer.
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state, attempt,
                          on_lease_expiry, ttl, response_status, created_at, claimed_at,
                          updated_at, expires_at)
VALUES ('', 'x', 'orders.create', 'sm-raw', sha256(''), 'succeeded', 1, 'unknown', '1 day',
        201, now(), now(), now(), now() + '1 day');
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state, attempt,
                          on_lease_expiry, ttl, created_at, claimed_at, updated_at, expires_at)
VALUES ('', 'x', 'orders.create', 'sm-raw', sha256(''), 'processing', 3, 'unknown', '1 day',
        now(), now(), now(), now() + '1 day');

-- Scope, key, id and created_at never change.
UPDATE idem_records SET key = 'sm-2' WHERE id = :id;
UPDATE idem_records SET tenant = 'other' WHERE id = :id;
UPDATE idem_records SET caller = NULL WHERE id = :id;
UPDATE idem_records SET created_at = created_at - interval '1 day' WHERE id = :id;

-- processing: a takeover needs the lease to have ended, and is attempt n+1.
UPDATE idem_records SET attempt = 2 WHERE id = :id;
UPDATE idem_records SET attempt = 5, locked_until = now() - interval '1 hour' WHERE id = :id;
-- The fingerprint of a live record never changes.
UPDATE idem_records SET fingerprint = sha256('other') WHERE id = :id;
-- A heartbeat (same state, same attempt) is fine.
UPDATE idem_records SET locked_until = locked_until + interval '1 minute' WHERE id = :id;

-- processing -> succeeded keeps the attempt.
UPDATE idem_records SET state = 'succeeded', attempt = 2 WHERE id = :id;
SELECT idem_complete(:'token', 200, '{"ok": true}');

-- A finished record cannot go back, sideways or forward...
UPDATE idem_records SET state = 'failed' WHERE id = :id;
UPDATE idem_records SET state = 'unknown' WHERE id = :id;
UPDATE idem_records SET state = 'processing', attempt = 1 WHERE id = :id;
-- ... but keeping its state is not a transition (an operator may extend it).
UPDATE idem_records SET expires_at = expires_at + interval '1 day' WHERE id = :id;
UPDATE idem_records SET fingerprint = sha256('other') WHERE id = :id;

-- Once expired, it may be reused for a new command at attempt 1.
UPDATE idem_records SET expires_at = now() - interval '1 second' WHERE id = :id;
UPDATE idem_records SET state = 'processing', attempt = 2 WHERE id = :id;
UPDATE idem_records SET state = 'processing', attempt = 1, fingerprint = sha256('new') WHERE id = :id;
SELECT state, attempt FROM idem_records WHERE id = :id;

-- unknown is left only by a resolution.
UPDATE idem_records SET state = 'unknown' WHERE id = :id;
UPDATE idem_records SET state = 'processing' WHERE id = :id;
UPDATE idem_records SET state = 'retryable' WHERE id = :id;
SELECT state, attempt FROM idem_records WHERE id = :id;

-- retryable: a new attempt is attempt n+1 with the same fingerprint.
UPDATE idem_records SET expires_at = now() + interval '1 day' WHERE id = :id;
UPDATE idem_records SET state = 'processing', attempt = 1 WHERE id = :id;
UPDATE idem_records SET state = 'processing', attempt = 2, fingerprint = sha256('x') WHERE id = :id;
UPDATE idem_records SET state = 'processing', attempt = 2 WHERE id = :id;
SELECT state, attempt FROM idem_records WHERE id = :id;
