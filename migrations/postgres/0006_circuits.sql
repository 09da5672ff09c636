-- idemhook on PostgreSQL, migration 6: a circuit per forward action and
-- give_up_after. A job's failing_since (its first failed attempt, moved
-- later by the time it waited on an open circuit) and its failed probes;
-- the circuits, a row per action that has failed, written in the
-- transactions that record attempts so every instance agrees.

ALTER TABLE jobs ADD COLUMN failing_since BIGINT;
ALTER TABLE jobs ADD COLUMN probe_failures BIGINT NOT NULL DEFAULT 0;

CREATE TABLE circuits (
    source        TEXT NOT NULL,
    action        TEXT NOT NULL,
    failures      BIGINT NOT NULL DEFAULT 0,
    opened_at     BIGINT,
    next_probe_at BIGINT,
    probes        BIGINT NOT NULL DEFAULT 0,
    opened_count  BIGINT NOT NULL DEFAULT 0,
    probe_owner   TEXT,
    probe_until   BIGINT,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (source, action)
);

CREATE INDEX jobs_circuit ON jobs (source, action, updated_at) WHERE waiting = 'circuit';
