-- Delivery control: the status `superseded`, a job's order key and place,
-- why a pending job waits, each action's pacing bucket, and the highest
-- `supersede` value delivered per order key. (schema.sql says the same for
-- SQLite, with the reasons.)

ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'processing', 'done', 'failed', 'paused', 'superseded'));
ALTER TABLE jobs
    ADD COLUMN order_key text,
    ADD COLUMN order_seq bigint,
    ADD COLUMN waiting   text;
UPDATE jobs SET waiting = 'after' WHERE status = 'pending' AND next_attempt_at IS NULL;

CREATE INDEX jobs_order ON jobs (source, action, order_key, order_seq)
    WHERE order_key IS NOT NULL AND status IN ('pending', 'processing', 'failed', 'paused');
CREATE INDEX jobs_in_flight ON jobs (source, action, lease_until)
    WHERE status = 'processing';

CREATE TABLE action_limits (
    source      text NOT NULL,
    action      text NOT NULL,
    tokens      double precision NOT NULL,
    refilled_at bigint NOT NULL,
    PRIMARY KEY (source, action)
);

CREATE TABLE order_marks (
    source    text NOT NULL,
    action    text NOT NULL,
    order_key text NOT NULL,
    value     text NOT NULL,
    PRIMARY KEY (source, action, order_key)
);

-- A job parked for `after` is due again when any job of its event is
-- done; one waiting for its order key is left to idemhook_release_order.
CREATE OR REPLACE FUNCTION idemhook_release_waiting() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET next_attempt_at = NEW.updated_at, waiting = NULL
     WHERE source = NEW.source AND event_id = NEW.event_id
       AND status = 'pending' AND next_attempt_at IS NULL
       AND waiting IS DISTINCT FROM 'order';
    RETURN NULL;
END
$$;

-- When a job of an order key is finished (done or superseded), the next
-- job of its key, in order, is due. A failed job holds its key.
CREATE FUNCTION idemhook_release_order() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs SET next_attempt_at = NEW.updated_at, waiting = NULL
     WHERE id = (SELECT id FROM jobs
                  WHERE source = NEW.source AND action = NEW.action
                    AND order_key = NEW.order_key AND status = 'pending'
                    AND status IN ('pending', 'processing', 'failed', 'paused')
                    AND waiting = 'order'
                  ORDER BY order_seq, id LIMIT 1);
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_release_order AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL
                       AND NEW.status IN ('done', 'superseded')
                       AND OLD.status NOT IN ('done', 'superseded'))
    EXECUTE FUNCTION idemhook_release_order();
