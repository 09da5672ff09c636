-- idemhook on PostgreSQL, migration 9: catch-up from the provider's API
-- (see schema.sql's `catchup_runs` for SQLite's twin): the lease one run
-- holds and what the last run found.

CREATE TABLE catchup_runs (
    source               TEXT PRIMARY KEY,
    lease_owner          TEXT,
    lease_until          BIGINT,
    last_run_at          BIGINT,
    window_from          BIGINT,
    claimed              BIGINT NOT NULL DEFAULT 0,
    redelivery_requested BIGINT NOT NULL DEFAULT 0,
    already_stored       BIGINT NOT NULL DEFAULT 0,
    error                TEXT,
    next_run_after       BIGINT
);
