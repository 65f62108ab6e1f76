-- examples/consumer/schema.sql: what the RabbitMQ consumer needs besides
-- examples/schema.sql.
--
-- Run by a superuser (or the database owner) after examples/schema.sql, in
-- the same database:
--     psql -v ON_ERROR_STOP=1 -d appdb -f examples/schema.sql
--     psql -v ON_ERROR_STOP=1 -d appdb -f examples/consumer/schema.sql
-- Running it again changes nothing.  It is one transaction.
--
-- The consumer writes each payment message as a row of payments, the
-- message id in its idempotency_key column, in the transaction that records
-- the id with idem_inbox: payments and INSERT on it come from
-- examples/schema.sql.  The inbox records are idempotency records of the
-- role idem_app (operation = the consumer's name, key = the message id),
-- reached only through idem_inbox, like idem_claim's.

BEGIN;

-- idem_inbox came with version 1.1.
DO $$
BEGIN
    IF to_regprocedure('idem_inbox(text, text, jsonb, interval)') IS NULL THEN
        RAISE EXCEPTION 'function idem_inbox(text, text, jsonb, interval) does not exist'
            USING ERRCODE = 'undefined_function',
                  HINT = 'Run examples/schema.sql first, and ALTER EXTENSION idempotency UPDATE if it is older than 1.1.';
    END IF;
END
$$;

GRANT EXECUTE ON FUNCTION idem_inbox(text, text, jsonb, interval) TO idem_app;

-- The payments a consumer applied are found by their message id.
CREATE INDEX IF NOT EXISTS payments_idempotency_key ON payments (idempotency_key);

COMMIT;
