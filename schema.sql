-- idemhook schema. Applied on every start; every statement is idempotent.
--
-- Conventions:
--   * every *_at column is an integer in unix MILLISECONDS (the JSON output
--     and the SQL action parameter :received_at convert to seconds);
--   * (source, event_id) is the idempotency key of an event; source is the
--     config name of the webhook source, event_id the provider's event id or
--     the derived key (see README, "How keys are derived");
--   * rows move forward only: a state or status never goes back, except
--     that an operator's replay re-opens a failed job (recorded in replays);
--     an operator's resolve closes a failed job as done with a new attempt;
--   * a new database is created with auto_vacuum = INCREMENTAL
--     (store::sqlite::open sets it before the first page is written), so
--     pruning can give space back;
--   * what an older database needs that CREATE ... IF NOT EXISTS cannot do
--     (a column added to an existing table, a changed CHECK) is a step in
--     migrations/sqlite/, applied by store::sqlite::migrate.

-- Schema version, key rules and small bits of state, as key/value pairs.
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The key rule each source used when it last started. A changed rule for a
-- source that already has events means old events could be claimed again
-- under new keys; serve warns loudly when it sees one.
CREATE TABLE IF NOT EXISTS source_rules (
    source     TEXT PRIMARY KEY,
    key_rule   TEXT NOT NULL,
    hash_rule  TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);

-- One row per logical event. The PRIMARY KEY is the final duplicate
-- barrier: a delivery claims the event with INSERT OR IGNORE and owns it
-- only when changes() = 1. Never read-then-insert.
CREATE TABLE IF NOT EXISTS events (
    source        TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    type          TEXT,
    state         TEXT NOT NULL
                  CHECK (state IN ('accepted', 'processing', 'completed', 'failed')),
    received_at   INTEGER NOT NULL,
    completed_at  INTEGER,
    payload       BLOB,            -- the raw body, byte for byte; NULL once erased or pruned
    content_type  TEXT,
    headers       TEXT,            -- JSON object of the headers that matter; NULL once erased
    payload_hash  TEXT NOT NULL,   -- hex SHA-256 of the source's `hash` fields
    verified_with INTEGER,         -- 0-based index of the secret that matched; NULL for kind none
    signed_at     INTEGER,         -- the timestamp the signature covered, when the scheme has one
    erased_at     INTEGER,         -- when the body and headers were dropped (erase or payload_retention)
    PRIMARY KEY (source, event_id)
);
CREATE INDEX IF NOT EXISTS events_received ON events (received_at);
CREATE INDEX IF NOT EXISTS events_source_received ON events (source, received_at);

-- One row per (event, action): the action's job. SQL actions get a row in
-- the claim transaction with their final status; forward actions get a
-- 'pending' row there too (the outbox), which a worker later leases.
CREATE TABLE IF NOT EXISTS jobs (
    id              INTEGER PRIMARY KEY,
    source          TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    action          TEXT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('sql', 'forward')),
    status          TEXT NOT NULL
                    CHECK (status IN ('pending', 'processing', 'done', 'failed', 'paused', 'superseded')),
    n_attempts      INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,        -- when a pending job is due
    lease_owner     TEXT,           -- the worker holding a processing job
    lease_until     INTEGER,        -- after this, another worker may take the job over
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    -- A forward action with `order`: the job's order key, and its place
    -- among that key's jobs (claim order; a replay goes to the end).
    order_key       TEXT,
    order_seq       INTEGER,
    -- Why a pending job with no due time waits: 'after' (another action of
    -- its event), 'order' (an earlier job of its order key), or
    -- 'concurrency' / 'rate' (its action's limits; due again soon).
    waiting         TEXT,
    -- When the job's attempts started failing (its first failed attempt),
    -- moved later by the time it waited on an open circuit: it fails for
    -- good once now - failing_since reaches give_up_after (version 4).
    failing_since   INTEGER,
    -- Failed attempts that were a circuit's probe: counted toward neither
    -- max_attempts nor give_up_after (version 4).
    probe_failures  INTEGER NOT NULL DEFAULT 0,
    UNIQUE (source, event_id, action)
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS jobs_status_created ON jobs (status, created_at);
-- An order key's unfinished jobs in their order (a query uses it when it
-- repeats the WHERE), and an action's jobs in flight.
CREATE INDEX IF NOT EXISTS jobs_order ON jobs (source, action, order_key, order_seq)
    WHERE order_key IS NOT NULL AND status IN ('pending', 'processing', 'failed', 'paused');
CREATE INDEX IF NOT EXISTS jobs_in_flight ON jobs (source, action, lease_until)
    WHERE status = 'processing';

-- A forward action's pacing across every worker: the rate's bucket of
-- attempt starts (tokens, refilled at rate up to its N), updated in the
-- take that starts an attempt.
CREATE TABLE IF NOT EXISTS action_limits (
    source      TEXT NOT NULL,
    action      TEXT NOT NULL,
    tokens      REAL NOT NULL,
    refilled_at INTEGER NOT NULL,
    PRIMARY KEY (source, action)
);

-- The highest `supersede` value delivered per order key, written with
-- the completion that delivered it.
CREATE TABLE IF NOT EXISTS order_marks (
    source    TEXT NOT NULL,
    action    TEXT NOT NULL,
    order_key TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (source, action, order_key)
);

-- Jobs per status, kept exact by triggers (also for changes made by the
-- operator commands in other processes), so the idemhook_jobs gauge is a
-- five-row read however many jobs there are.
CREATE TABLE IF NOT EXISTS job_counts (
    status TEXT PRIMARY KEY,
    n      INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS job_counts_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO job_counts (status, n) VALUES (NEW.status, 1)
        ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS job_counts_update AFTER UPDATE OF status ON jobs
    WHEN OLD.status <> NEW.status BEGIN
    UPDATE job_counts SET n = n - 1 WHERE status = OLD.status;
    INSERT INTO job_counts (status, n) VALUES (NEW.status, 1)
        ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER IF NOT EXISTS job_counts_delete AFTER DELETE ON jobs BEGIN
    UPDATE job_counts SET n = n - 1 WHERE status = OLD.status;
END;

-- A forward job with `after` whose named jobs are not all done is parked by
-- the worker that would take it: pending with no due time (next_attempt_at
-- NULL, the reason in last_error). When any job of that event becomes done
-- (a worker's completion, a replay, a resolve, reconcile --check --yes,
-- from any process), the event's parked jobs are due again and the next
-- take looks at their `after` once more.
CREATE TRIGGER IF NOT EXISTS jobs_release_waiting AFTER UPDATE OF status ON jobs
    WHEN NEW.status = 'done' AND OLD.status <> 'done' BEGIN
    -- The unary + keeps the planner on the (source, event_id) prefix of
    -- the UNIQUE index: through jobs_due it would walk every parked job
    -- at every completion (INDEXED BY is not allowed in a trigger). A job
    -- waiting for its order key is left to jobs_release_order.
    UPDATE jobs SET next_attempt_at = NEW.updated_at, waiting = NULL
     WHERE source = NEW.source AND event_id = NEW.event_id
       AND +status = 'pending' AND +next_attempt_at IS NULL
       AND waiting IS NOT 'order';
END;

-- When a job of an order key is finished (done or superseded, by a worker,
-- a replay, a resolve, from any process), the next job of its key, in
-- order, is due. A failed job releases nothing: it holds its key.
CREATE TRIGGER IF NOT EXISTS jobs_release_order AFTER UPDATE OF status ON jobs
    WHEN NEW.order_key IS NOT NULL AND NEW.status IN ('done', 'superseded')
         AND OLD.status NOT IN ('done', 'superseded') BEGIN
    UPDATE jobs SET next_attempt_at = NEW.updated_at, waiting = NULL
     WHERE id = (SELECT id FROM jobs
                  WHERE source = NEW.source AND action = NEW.action
                    AND order_key = NEW.order_key AND status = 'pending'
                    AND status IN ('pending', 'processing', 'failed', 'paused')
                    AND waiting = 'order'
                  ORDER BY order_seq, id LIMIT 1);
END;

-- Every run of a job's action, numbered from 1 per job. Never rewritten
-- except to fill in the end of the attempt it belongs to. An operator's
-- resolve is an attempt too: outcome ok, error_kind operator, with a note.
CREATE TABLE IF NOT EXISTS attempts (
    job_id        INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    n             INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    outcome       TEXT CHECK (outcome IN ('ok', 'retry', 'failed')),
    http_status   INTEGER,
    error         TEXT,
    error_kind    TEXT,             -- connect, timeout, status, protocol, lease, sql, check,
                                    -- operator (closed by resolve), confirmed; NULL for a plain ok
    request_id    TEXT,             -- the downstream's request id header
    response_head TEXT,             -- the first KiB of the downstream's answer
    worker        TEXT,             -- the worker, or replay:cli / resolve:api and the like
    note          TEXT,             -- the operator's note on a resolve (added in version 2)
    PRIMARY KEY (job_id, n)
);

-- Every question to a forward action's `check` URL (does the downstream
-- already have this Idempotency-Key's effect?) and its answer: found (200),
-- not_found (404) or error. n is the attempt it was asked for: a found or
-- error answer is also that attempt's row in attempts (ok with error_kind
-- confirmed, or retry with error_kind check); not_found is followed by the
-- attempt's send.
CREATE TABLE IF NOT EXISTS checks (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    n           INTEGER NOT NULL,
    asked_at    INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    answer      TEXT NOT NULL CHECK (answer IN ('found', 'not_found', 'error')),
    http_status INTEGER,
    error       TEXT,
    worker      TEXT              -- the forward worker, or reconcile:cli / reconcile:api
);
CREATE INDEX IF NOT EXISTS checks_job ON checks (job_id);

-- Every delivery that reached a route, accepted or not. event_id is NULL
-- when the request was refused before its key was known. No body is kept.
CREATE TABLE IF NOT EXISTS deliveries (
    id          INTEGER PRIMARY KEY,
    source      TEXT NOT NULL,
    event_id    TEXT,
    received_at INTEGER NOT NULL,
    outcome     TEXT NOT NULL,      -- the words of idemhook_deliveries_total's outcome label
    remote      TEXT,
    detail      TEXT
);
CREATE INDEX IF NOT EXISTS deliveries_received ON deliveries (received_at);
-- An event's deliveries are found by (source, event_id) through this index,
-- except the one that stored it: that 'accepted' delivery carries the
-- event's own received_at and is found through deliveries_received (see
-- store::deliveries::OF_EVENT). Keeping accepted deliveries out of a
-- random-key index spares every new event an insert into a different leaf
-- page (a WAL page per event): about a quarter of the writer's time per
-- event in the benchmark. Databases from before had every delivery in
-- deliveries_event; it is replaced here, once.
DROP INDEX IF EXISTS deliveries_event;
CREATE INDEX IF NOT EXISTS deliveries_event_other ON deliveries (source, event_id)
    WHERE outcome <> 'accepted';

-- Integrity incidents, such as a duplicate whose payload hash differs from
-- the stored one. The stored event is never changed by them.
CREATE TABLE IF NOT EXISTS incidents (
    id           INTEGER PRIMARY KEY,
    source       TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    kind         TEXT NOT NULL,     -- payload_mismatch
    created_at   INTEGER NOT NULL,
    payload_hash TEXT,              -- the hash of the body that did not match
    detail       TEXT
);
CREATE INDEX IF NOT EXISTS incidents_event ON incidents (source, event_id);

-- The body of a mismatched duplicate (at most max_body_bytes), so an
-- operator can see how it differs from the stored one. Dropped with the
-- event's own body: by payload_retention and by erase.
CREATE TABLE IF NOT EXISTS incident_payloads (
    incident_id INTEGER PRIMARY KEY REFERENCES incidents (id) ON DELETE CASCADE,
    payload     BLOB NOT NULL
);

-- Actions an operator paused; their jobs wait as 'paused' until resumed.
CREATE TABLE IF NOT EXISTS paused_actions (
    source    TEXT NOT NULL,
    action    TEXT NOT NULL,
    paused_at INTEGER NOT NULL,
    PRIMARY KEY (source, action)
);

-- Every operator replay: which job was re-opened, from what, and when.
CREATE TABLE IF NOT EXISTS replays (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    replayed_at INTEGER NOT NULL,
    from_status TEXT NOT NULL,
    forced      INTEGER NOT NULL DEFAULT 0,
    origin      TEXT NOT NULL       -- cli or api
);
CREATE INDEX IF NOT EXISTS replays_job ON replays (job_id);

-- Refused deliveries (401, 400) to configured sources, kept whole for
-- `idemhook reingest`: per source within keep_rejected (the pruner) and
-- keep_rejected_bytes (enforced as each is written: the oldest go first).
-- `stored` is what counts against the cap: the body's and the headers'
-- bytes. Requests to unknown sources, 413s and 405s are never kept.
CREATE TABLE IF NOT EXISTS rejected (
    id          INTEGER PRIMARY KEY,
    source      TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    remote      TEXT NOT NULL,
    query       TEXT NOT NULL,
    headers     TEXT NOT NULL,      -- a JSON array of [name, value]
    body        BLOB NOT NULL,
    bytes       INTEGER NOT NULL,   -- the body's size
    stored      INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS rejected_source ON rejected (source, id);
CREATE INDEX IF NOT EXISTS rejected_received ON rejected (received_at);

-- Per source: the bytes of `rejected` (kept with each write, never a sum
-- over the table) and what re-ingests did (idemhook_reingested_total,
-- counted here so the command's runs in another process count too).
CREATE TABLE IF NOT EXISTS rejected_totals (
    source     TEXT PRIMARY KEY,
    stored     INTEGER NOT NULL DEFAULT 0,
    accepted   INTEGER NOT NULL DEFAULT 0,
    duplicate  INTEGER NOT NULL DEFAULT 0,
    failed     INTEGER NOT NULL DEFAULT 0
);

-- Catch-up from the provider's API, per source with a `catchup` table:
-- the lease one run holds (so two instances on one PostgreSQL database do
-- not run the same source's catch-up at once; taken with the database's
-- clock, released at the run's end, lost after lease_until) and what the
-- last run found, for `reconcile` and the inspector.
CREATE TABLE IF NOT EXISTS catchup_runs (
    source               TEXT PRIMARY KEY,
    lease_owner          TEXT,
    lease_until          INTEGER,   -- unix ms
    last_run_at          INTEGER,   -- unix ms, when the last run ended
    window_from          INTEGER,   -- unix ms, how far back it looked
    claimed              INTEGER NOT NULL DEFAULT 0,
    redelivery_requested INTEGER NOT NULL DEFAULT 0,
    already_stored       INTEGER NOT NULL DEFAULT 0,
    error                TEXT,      -- the API's or the storage's, NULL when it went through
    next_run_after       INTEGER    -- unix ms: a Retry-After the API asked for
);
-- A forward action's circuit (a row once it has failed): consecutive
-- failed attempts (connection error, timeout, 408, 429, 5xx), and while
-- open (opened_at set) when the next probe is due and who runs it. Written
-- in the transactions that record attempts, so every worker agrees.
CREATE TABLE IF NOT EXISTS circuits (
    source        TEXT NOT NULL,
    action        TEXT NOT NULL,
    failures      INTEGER NOT NULL DEFAULT 0,
    opened_at     INTEGER,          -- NULL while closed
    next_probe_at INTEGER,          -- when open: the next probe's due time
    probes        INTEGER NOT NULL DEFAULT 0,   -- failed probes since it opened
    opened_count  INTEGER NOT NULL DEFAULT 0,   -- times it opened (idemhook_circuit_opened_total)
    probe_owner   TEXT,             -- the worker running the probe now
    probe_until   INTEGER,          -- after this, another worker may probe
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (source, action)
);
-- The jobs waiting on an open circuit (pending, no due time), oldest
-- first: the probe is the first, and a failed probe's job goes last.
CREATE INDEX IF NOT EXISTS jobs_circuit ON jobs (source, action, updated_at)
    WHERE waiting = 'circuit';

-- Notifications to the [[notify]] targets (store/notifications.rs): one
-- row per message, written in the transaction of its cause and sent
-- afterwards by the notifier, retried like a forward job. source and
-- action are '' where the condition has none. due_at is when the message
-- is meant to go (a coalescing window's end for a collecting row);
-- next_attempt_at when it is next tried (a lease ahead while sending).
CREATE TABLE IF NOT EXISTS notifications (
    id              INTEGER PRIMARY KEY,
    notify          TEXT NOT NULL,
    condition       TEXT NOT NULL,
    source          TEXT NOT NULL DEFAULT '',
    action          TEXT NOT NULL DEFAULT '',
    event_id        TEXT,
    count           INTEGER NOT NULL DEFAULT 1,
    summary         TEXT NOT NULL,
    details         TEXT NOT NULL DEFAULT '{}',
    status          TEXT NOT NULL,      -- pending, sent, failed
    attempts        INTEGER NOT NULL DEFAULT 0,
    due_at          INTEGER NOT NULL,
    next_attempt_at INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    sent_at         INTEGER
);
CREATE INDEX IF NOT EXISTS notifications_due ON notifications (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS notifications_key
    ON notifications (notify, condition, source, action, id);
