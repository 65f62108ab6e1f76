-- examples/schema.sql: the database the example services use.
--
-- Run once by a superuser (or the database owner) in the application's
-- database:   psql -d appdb -f examples/schema.sql
-- The services connect as the role idem_app, not as a superuser.

CREATE EXTENSION IF NOT EXISTS idempotency;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'idem_app') THEN
        CREATE ROLE idem_app LOGIN;
    END IF;
END
$$;

-- The application role gets the API and nothing on idem_records itself:
-- the functions reach the table as its owner, and each role sees only its
-- own records.
GRANT EXECUTE ON FUNCTION idem_claim, idem_complete, idem_fail, idem_heartbeat,
                          idem_checkpoint, idem_replay TO idem_app;

-- The business table.  The payment is written in the same transaction as the
-- claim and idem_complete: either both exist or neither does.
CREATE TABLE IF NOT EXISTS payments (
    id              text PRIMARY KEY
                    DEFAULT 'pay_' || replace(gen_random_uuid()::text, '-', ''),
    idempotency_key text NOT NULL,
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at      timestamptz NOT NULL DEFAULT now()
);

GRANT SELECT, INSERT ON payments TO idem_app;
