-- Version 3: jobs gets the status 'superseded' (its CHECK) and the
-- columns of delivery control (order_key, order_seq, waiting). SQLite
-- cannot change a CHECK in place, so the old table is copied into a new
-- one; a pending job with no due time was parked for `after` and says so.
-- Run with foreign keys off (dropping the old table cascades nothing), in
-- one transaction; schema.sql then recreates the indexes and triggers.
CREATE TABLE jobs_v3 (
    id              INTEGER PRIMARY KEY,
    source          TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    action          TEXT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('sql', 'forward')),
    status          TEXT NOT NULL
                    CHECK (status IN ('pending', 'processing', 'done', 'failed', 'paused', 'superseded')),
    n_attempts      INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    lease_owner     TEXT,
    lease_until     INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    order_key       TEXT,
    order_seq       INTEGER,
    waiting         TEXT,
    UNIQUE (source, event_id, action)
);
INSERT INTO jobs_v3 (id, source, event_id, action, kind, status, n_attempts,
                     next_attempt_at, lease_owner, lease_until, last_error,
                     created_at, updated_at, waiting)
     SELECT id, source, event_id, action, kind, status, n_attempts,
            next_attempt_at, lease_owner, lease_until, last_error,
            created_at, updated_at,
            CASE WHEN status = 'pending' AND next_attempt_at IS NULL
                 THEN 'after' END
       FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v3 RENAME TO jobs;
