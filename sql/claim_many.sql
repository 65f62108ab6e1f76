--
-- idem_claim_many: one decision per key, in input order, each as idem_claim
-- would answer it; a bulk retry replays the items that succeeded and
-- proceeds only for the others.
--
-- (errors print without their CONTEXT lines, which differ between the
-- C and SQL editions)
\set SHOW_CONTEXT never
\set VERBOSITY default
TRUNCATE idem_records;

-- A first bulk command of three items: all proceed, in input order.
CREATE TEMP TABLE first_call AS
SELECT * FROM idem_claim_many('orders.import', ARRAY['o-3', 'o-1', 'o-2'],
                              ARRAY['{"sku": "C"}', '{"sku": "A"}', '{"sku": "B"}']::jsonb[]);
SELECT key, outcome, token IS NOT NULL AS has_token, state, attempt
  FROM first_call;

-- Item o-1 succeeds, o-2 fails stably, o-3 fails before any side effect.
SELECT idem_complete(token, 201, '{"order": "ORD-1"}') FROM first_call WHERE key = 'o-1';
SELECT idem_fail(token, 409, '{"error": "out of stock"}') FROM first_call WHERE key = 'o-2';
SELECT idem_fail(token, 503, NULL, retryable => true) FROM first_call WHERE key = 'o-3';

-- The bulk retry, with one new item: the succeeded and failed items replay,
-- the retryable one and the new one proceed.  WITH ORDINALITY numbers the
-- rows in input order.
SELECT n, key, outcome, token IS NOT NULL AS has_token, attempt, http_status, body
  FROM idem_claim_many('orders.import', ARRAY['o-1', 'o-2', 'o-3', 'o-4'],
                       ARRAY['{"sku": "A"}', '{"sku": "B"}', '{"sku": "C"}',
                             '{"sku": "D"}']::jsonb[])
       WITH ORDINALITY AS c(key, outcome, token, record_id, state, attempt,
                            recovery_point, http_status, headers, body,
                            error_code, retry_after, resource_id, raw_body, n);

-- Same key with a different request: mismatch, item by item.
SELECT key, outcome, http_status, error_code
  FROM idem_claim_many('orders.import', ARRAY['o-1', 'o-5'],
                       ARRAY['{"sku": "Z"}', '{"sku": "E"}']::jsonb[]);

-- Without requests: each item is claimed with none (as idem_claim without
-- one).  A key repeated within the call: the first position proceeds, the
-- later ones are in_progress (the record is processing, by this very call),
-- even with a wait.
SELECT key, outcome, token IS NOT NULL AS has_token, error_code
  FROM idem_claim_many('mail.send', ARRAY['m-1', 'm-2', 'm-1', 'm-1'],
                       wait => '10s');
-- Repeated with a different request: a mismatch.
SELECT key, outcome, error_code
  FROM idem_claim_many('mail.send2', ARRAY['m-1', 'm-1'],
                       ARRAY['{"to": "a"}', '{"to": "b"}']::jsonb[]);
SELECT operation, key, count(*) FROM idem_records
 WHERE operation LIKE 'mail.%' GROUP BY 1, 2 ORDER BY 1, 2;

-- An empty call answers nothing.
SELECT count(*) FROM idem_claim_many('orders.import', '{}');

-- 1,000 items in one call, in order.
SELECT count(*) AS answered,
       count(*) FILTER (WHERE outcome = 'proceed') AS proceeded,
       bool_and(key = 'bulk-' || n) AS in_input_order
  FROM idem_claim_many('bulk.op', ARRAY(SELECT 'bulk-' || g FROM generate_series(1, 1000) g))
       WITH ORDINALITY AS c(key, outcome, token, record_id, state, attempt,
                            recovery_point, http_status, headers, body,
                            error_code, retry_after, resource_id, raw_body, n);

-- Bad input: a clear error, and nothing written (not even the valid items
-- before the bad one).
SELECT count(*) AS records_before FROM idem_records \gset
SELECT * FROM idem_claim_many('bad', ARRAY['b-1', 'b-2'], ARRAY['{}']::jsonb[]);
SELECT * FROM idem_claim_many('bad', ARRAY['b-1', NULL]);
SELECT * FROM idem_claim_many('bad', ARRAY['b-1', 'b-2'], ARRAY['{}', NULL]::jsonb[]);
SELECT * FROM idem_claim_many('bad', ARRAY[['b-1'], ['b-2']]);
SELECT * FROM idem_claim_many('bad', ARRAY['b-1', '']);
SELECT * FROM idem_claim_many('bad', ARRAY['b-1', repeat('x', 256)]);
SELECT * FROM idem_claim_many('bad', NULL);
SELECT * FROM idem_claim_many(NULL, ARRAY['b-1']);
SELECT * FROM idem_claim_many('bad', ARRAY['b-1'], ttl => '0');
SELECT * FROM idem_claim_many('bad', ARRAY['b-1'], on_lease_expiry => 'never');
SELECT count(*) = :records_before AS nothing_written FROM idem_records;

-- Arrays numbered from another bound than 1 pair each key with its own
-- request: a completed key claimed again with another request is a
-- mismatch, and the new key's record has its own request's fingerprint.
SELECT token AS t FROM idem_claim('bounds.pay', 'x', '{"amount": 100}') \gset
SELECT idem_complete(:'t', 200, '{"paid": 100}');
SELECT key, outcome, http_status, body
  FROM idem_claim_many('bounds.pay', '[0:1]={y,x}'::text[],
                       '[0:1]={"{\"amount\": 5}","{\"amount\": 999}"}'::jsonb[]);
SELECT outcome FROM idem_claim('bounds.pay', 'y', '{"amount": 5}');
SELECT outcome FROM idem_claim('bounds.pay', 'y', '{"amount": 999}');
SELECT key, outcome
  FROM idem_claim_many('bounds.pay', '[5:6]={x,z}'::text[],
                       '[-3:-2]={"{\"amount\": 100}","{\"amount\": 7}"}'::jsonb[]);
SELECT fingerprint = idem_fingerprint('{"amount": 7}') AS own_fingerprint
  FROM idem_records WHERE operation = 'bounds.pay' AND key = 'z';
DELETE FROM idem_records WHERE operation = 'bounds.pay';
