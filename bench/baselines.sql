-- bench/baselines.sql: what the extension is measured against.
--
-- floor_records and peer_records have the shape of idem_records (same
-- columns, "C" scope columns, same indexes), without its trigger.
--
-- The floor is what the storage itself costs: a bare INSERT of the claim
-- row and an UPDATE with the response (new keys), a bare SELECT by the
-- unique key (replays).
--
-- The HOT floor, floor_hot_records, has the same columns and only two
-- indexes: the unique key (the same as idem_records') and expires_at, which the claim row's INSERT
-- sets for good.  Its UPDATE with the response changes no indexed column
-- (and no column of an index predicate), so PostgreSQL makes it a HOT
-- update: no new index entries.  Its fingerprint is sha256 of the raw
-- request text (new_floor_hot.sql, replay_floor_hash.sql).
--
-- The peer is the same algorithm written in PL/pgSQL the way a careful user
-- would: INSERT ... ON CONFLICT DO NOTHING RETURNING, then SELECT ... FOR
-- UPDATE, fingerprint sha256(request::text::bytea).  (That fingerprint is
-- neither canonical nor total: ::bytea rejects any request text with a
-- backslash, i.e. a string holding a quote or a newline.  The benchmark's
-- requests have none.)

CREATE TABLE floor_records (LIKE idem_records INCLUDING ALL);
CREATE TABLE peer_records (LIKE idem_records INCLUDING ALL);
CREATE TABLE floor_hot_records (LIKE idem_records INCLUDING DEFAULTS
                                INCLUDING IDENTITY INCLUDING CONSTRAINTS);
-- Its unique index is idem_records' own, column for column (key first).
CREATE UNIQUE INDEX floor_hot_records_scope_key
    ON floor_hot_records (key, operation, caller, tenant, role);
CREATE INDEX floor_hot_records_expiry ON floor_hot_records (expires_at);

-- The business table every new-key transaction writes to.
CREATE TABLE payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                       amount numeric NOT NULL, currency text NOT NULL);

CREATE FUNCTION peer_claim(p_operation text, p_key text, p_request jsonb,
                           p_tenant text DEFAULT '',
                           p_caller text DEFAULT '',
                           p_ttl interval DEFAULT '1 day',
                           p_lease interval DEFAULT '30 seconds')
RETURNS TABLE (outcome text, record_id bigint, attempt int, http_status int,
               headers jsonb, body jsonb)
LANGUAGE plpgsql AS $$
DECLARE
  fp bytea := sha256(p_request::text::bytea);
  r peer_records%ROWTYPE;
  new_id bigint;
BEGIN
  INSERT INTO peer_records AS p (tenant, caller, operation, key, fingerprint,
                                 state, attempt, locked_until, on_lease_expiry,
                                 ttl, created_at, claimed_at, updated_at,
                                 expires_at)
  VALUES (p_tenant, p_caller, p_operation, p_key, fp, 'processing', 1,
          clock_timestamp() + p_lease, 'unknown', p_ttl, now(), now(), now(),
          now() + p_ttl)
  ON CONFLICT (role, tenant, caller, operation, key) DO NOTHING
  RETURNING p.id INTO new_id;
  IF new_id IS NOT NULL THEN
    RETURN QUERY SELECT 'proceed', new_id, 1, NULL::int, NULL::jsonb, NULL::jsonb;
    RETURN;
  END IF;

  SELECT * INTO r FROM peer_records p
   WHERE p.role = to_regrole(current_user::text) AND p.tenant = p_tenant AND p.caller = p_caller
     AND p.operation = p_operation AND p.key = p_key
     FOR UPDATE;

  IF r.state IN ('succeeded', 'failed', 'retryable') AND r.expires_at <= now() THEN
    UPDATE peer_records SET fingerprint = fp, state = 'processing', attempt = 1,
           locked_until = clock_timestamp() + p_lease, response_status = NULL,
           response_headers = NULL, response_body = NULL, claimed_at = now(),
           updated_at = now(), completed_at = NULL, expires_at = now() + p_ttl
     WHERE id = r.id;
    RETURN QUERY SELECT 'proceed', r.id, 1, NULL::int, NULL::jsonb, NULL::jsonb;
    RETURN;
  END IF;
  IF r.fingerprint <> fp THEN
    RETURN QUERY SELECT 'mismatch', r.id, r.attempt, 422, NULL::jsonb, NULL::jsonb;
    RETURN;
  END IF;
  IF r.state IN ('succeeded', 'failed') THEN
    RETURN QUERY SELECT 'replay', r.id, r.attempt, r.response_status,
                        r.response_headers, r.response_body;
    RETURN;
  END IF;
  IF r.state = 'retryable' THEN
    UPDATE peer_records SET state = 'processing', attempt = r.attempt + 1,
           locked_until = clock_timestamp() + p_lease, claimed_at = now(),
           updated_at = now()
     WHERE id = r.id;
    RETURN QUERY SELECT 'proceed', r.id, r.attempt + 1, NULL::int, NULL::jsonb, NULL::jsonb;
    RETURN;
  END IF;
  IF r.state = 'processing' AND r.locked_until > clock_timestamp() THEN
    RETURN QUERY SELECT 'in_progress', r.id, r.attempt, 409, NULL::jsonb, NULL::jsonb;
    RETURN;
  END IF;
  IF r.state = 'processing' THEN
    UPDATE peer_records SET state = 'unknown', updated_at = now() WHERE id = r.id;
  END IF;
  RETURN QUERY SELECT 'unknown', r.id, r.attempt, 409, NULL::jsonb, NULL::jsonb;
END $$;

CREATE FUNCTION peer_complete(p_id bigint, p_attempt int, p_status int,
                              p_body jsonb, p_headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE peer_records
     SET state = 'succeeded', response_status = p_status,
         response_headers = p_headers, response_body = p_body,
         locked_until = NULL, completed_at = now(), updated_at = now(),
         expires_at = now() + ttl
   WHERE id = p_id AND attempt = p_attempt AND state = 'processing';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'attempt % of record % is no longer running', p_attempt, p_id
      USING ERRCODE = '55000';
  END IF;
END $$;
