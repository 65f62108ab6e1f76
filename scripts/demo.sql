-- scripts/demo.sql: run by scripts/demo.sh on a throwaway cluster.
\set ECHO queries
CREATE EXTENSION idempotency;
SELECT * FROM idem_stats;
