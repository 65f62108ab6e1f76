--
-- idem_inbox: a message consumer records each message id in the transaction
-- that applies the message.  proceed the first time, duplicate afterwards,
-- mismatch for the same id with a different message; an abort forgets it.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default
TRUNCATE idem_records;

-- First delivery: proceed.  Redelivery: duplicate, per consumer.
SELECT idem_inbox('ledger', 'msg-1', '{"amount": 10}');
SELECT idem_inbox('ledger', 'msg-1', '{"amount": 10}');
-- The same message id for another consumer is that consumer's first.
SELECT idem_inbox('mailer', 'msg-1', '{"amount": 10}');
SELECT idem_inbox('mailer', 'msg-1', '{"amount": 10}');
-- The canonical message is compared: key order and number spelling do not
-- matter, a different amount does.
SELECT idem_inbox('ledger', 'msg-1', '{"amount": 10.0}');
SELECT idem_inbox('ledger', 'msg-1', '{"amount": 11}');
-- Without a message: only the id counts, and it must always come without.
SELECT idem_inbox('ledger', 'msg-2');
SELECT idem_inbox('ledger', 'msg-2');
SELECT idem_inbox('ledger', 'msg-2', '{}');

-- An inbox record: succeeded at attempt 1, no token, lease or response,
-- the consumer as operation, the role as caller, expiring after the ttl.
SELECT operation, key, tenant, caller = '' AS caller_is_role,
       state, attempt, attempt_token IS NULL AS no_token,
       locked_until IS NULL AS no_lease, response_status, response_body,
       completed_at = created_at AS done_at_once,
       expires_at = created_at + ttl AS expires_after_ttl, ttl
  FROM idem_records WHERE key = 'msg-1' ORDER BY operation;

-- A ttl of the caller's.
SELECT idem_inbox('ledger', 'msg-3', NULL, '2 hours');
SELECT ttl FROM idem_records WHERE key = 'msg-3';

-- An abort forgets the message: the redelivery proceeds.
BEGIN;
SELECT idem_inbox('ledger', 'msg-4', '{"amount": 5}');
ROLLBACK;
SELECT idem_inbox('ledger', 'msg-4', '{"amount": 5}');
-- So does a savepoint rolled back.
BEGIN;
SAVEPOINT s;
SELECT idem_inbox('ledger', 'msg-5');
ROLLBACK TO SAVEPOINT s;
SELECT idem_inbox('ledger', 'msg-5');
COMMIT;
SELECT idem_inbox('ledger', 'msg-5');

-- idem_replay sees an inbox record as a replay without a response.
SELECT outcome, state, http_status, body, error_code
  FROM idem_replay('ledger', 'msg-4');

--
-- Expiry follows the rules of every record: past expires_at, within the
-- tombstone window, the message was done: duplicate (mismatch for another
-- message).  Past the window it is new: proceed, the record reused.
--
UPDATE idem_records SET expires_at = clock_timestamp() - interval '1 hour'
 WHERE operation = 'ledger' AND key = 'msg-4';
SELECT idem_inbox('ledger', 'msg-4', '{"amount": 5}');
SELECT idem_inbox('ledger', 'msg-4', '{"amount": 6}');
SELECT id AS reused_id FROM idem_records WHERE operation = 'ledger' AND key = 'msg-4' \gset
UPDATE idem_records SET expires_at = clock_timestamp() - interval '8 days'
 WHERE id = :reused_id;
SELECT idem_inbox('ledger', 'msg-4', '{"amount": 6}');
SELECT id = :reused_id AS same_record, state, attempt,
       fingerprint = idem_fingerprint('{"amount": 6}') AS new_fingerprint,
       attempt_token IS NULL AS no_token, locked_until IS NULL AS no_lease,
       expires_at > clock_timestamp() AS live_again
  FROM idem_records WHERE operation = 'ledger' AND key = 'msg-4';
SELECT idem_inbox('ledger', 'msg-4', '{"amount": 6}');

-- A consumer name that idem_claim also uses shares its records: a finished
-- claim is a duplicate, a running one in_progress, and a record only
-- idem_claim can settle is refused clearly.
SELECT token AS running FROM idem_claim('shared.op', 'k-run') \gset
SELECT idem_inbox('shared.op', 'k-run');
SELECT token AS done FROM idem_claim('shared.op', 'k-done') \gset
SELECT idem_complete(:'done', 201, '{"id": 1}');
SELECT idem_inbox('shared.op', 'k-done');
UPDATE idem_records SET locked_until = clock_timestamp() - interval '1 second'
 WHERE operation = 'shared.op' AND key = 'k-run';
SELECT idem_inbox('shared.op', 'k-run');

-- The guard lets a record be born succeeded only without a response.
INSERT INTO idem_records (tenant, caller, operation, key, fingerprint, state,
                          attempt, on_lease_expiry, ttl, response_status,
                          created_at, claimed_at, updated_at, expires_at)
VALUES ('', current_user, 'raw', 'k', idem_fingerprint('{}'), 'succeeded', 1,
        'unknown', '1 day', 200, now(), now(), now(), now() + interval '1 day');

-- Bad input: a clear error, nothing written.
SELECT count(*) AS records_before FROM idem_records \gset
SELECT idem_inbox(NULL, 'm');
SELECT idem_inbox('ledger', NULL);
SELECT idem_inbox('', 'm');
SELECT idem_inbox('ledger', '');
SELECT idem_inbox('ledger', repeat('x', 256));
SELECT idem_inbox('ledger', 'm', NULL, '0');
SELECT idem_inbox('ledger', 'm', NULL, '-1 day');
SELECT count(*) = :records_before AS nothing_written FROM idem_records;

-- In a read-only transaction a duplicate is still answered; a new message
-- cannot be recorded.
BEGIN READ ONLY;
SELECT idem_inbox('ledger', 'msg-1', '{"amount": 10}');
SELECT idem_inbox('ledger', 'msg-new');
ROLLBACK;
