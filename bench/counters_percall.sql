-- bench/counters_percall.sql: the per-call cost of idem_stat_operations, in
-- one backend, without pgbench and the network: microseconds per replay
-- claim and per new-key claim+completion with idempotency.track_operations
-- on and off, alternating, :rounds rounds.  Run by bench/run.sh counters
-- in the bench database (load.sql's replayable keys r-1 ... r-2000).
\set QUIET on
CREATE FUNCTION pg_temp.percall(track text, n int, kind text) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz;
  d idem_decision;
  i int;
BEGIN
  PERFORM set_config('idempotency.track_operations', track, true);
  t0 := clock_timestamp();
  IF kind = 'replay' THEN
    PERFORM count(*)
       FROM generate_series(1, n) g,
            idem_claim('payments.create', 'r-' || (g % 2000 + 1),
                       '{"amount": 100.00, "currency": "EUR", "customer": "cus_123", "description": "order 42"}') c;
  ELSE
    FOR i IN 1 .. n LOOP
      d := idem_claim('bench.percall', 'p-' || track || '-' || i || '-' || random(),
                      '{"amount": 100.00, "currency": "EUR"}');
      PERFORM idem_complete(d.token, 201, '{"id": "PAY-1"}');
    END LOOP;
  END IF;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / n;
END $$;
\set QUIET off
\pset tuples_only on
\pset format unaligned
\pset fieldsep '\t'
-- One statement (and transaction) per measurement, in this order: per
-- round, replay then new, the order of on and off alternating between
-- rounds.  (A transaction holds a lock per new key until it commits.)
SELECT format('SELECT %s, %L, %L, pg_temp.percall(%L, %s, %L)', r, kind, track, track,
              CASE kind WHEN 'replay' THEN 20000 ELSE 1000 END, kind)
  FROM generate_series(1, :rounds) r,
       (VALUES (1, 'replay'), (2, 'new')) AS k(ord, kind),
       LATERAL (SELECT * FROM unnest(CASE WHEN r % 2 = 1 THEN ARRAY['on', 'off'] ELSE ARRAY['off', 'on'] END)
                WITH ORDINALITY AS u(track, n)) AS t
 ORDER BY r, k.ord, t.n \gexec
