-- idemhook on PostgreSQL, migration 3: key columns compare bytewise.
-- A key's order under the database's collation depends on the operating
-- system's locale library, so an upgrade of it could reorder a primary
-- key's index under the server (and let a duplicate in). COLLATE "C"
-- compares bytes, the order SQLite uses; changing it rebuilds the indexes
-- on these columns, never the tables.

ALTER TABLE meta ALTER COLUMN key TYPE text COLLATE "C";
ALTER TABLE source_rules ALTER COLUMN source TYPE text COLLATE "C";
ALTER TABLE events
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN event_id TYPE text COLLATE "C";
-- A column a trigger's WHEN reads cannot change type under it: the
-- trigger is made again, as migration 2 wrote it.
DROP TRIGGER jobs_release_order ON jobs;
ALTER TABLE jobs
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN event_id TYPE text COLLATE "C",
    ALTER COLUMN action TYPE text COLLATE "C",
    ALTER COLUMN order_key TYPE text COLLATE "C";
CREATE TRIGGER jobs_release_order AFTER UPDATE OF status ON jobs
    FOR EACH ROW WHEN (NEW.order_key IS NOT NULL
                       AND NEW.status IN ('done', 'superseded')
                       AND OLD.status NOT IN ('done', 'superseded'))
    EXECUTE FUNCTION idemhook_release_order();
ALTER TABLE deliveries
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN event_id TYPE text COLLATE "C";
ALTER TABLE incidents
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN event_id TYPE text COLLATE "C";
ALTER TABLE paused_actions
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN action TYPE text COLLATE "C";
ALTER TABLE action_limits
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN action TYPE text COLLATE "C";
ALTER TABLE order_marks
    ALTER COLUMN source TYPE text COLLATE "C",
    ALTER COLUMN action TYPE text COLLATE "C",
    ALTER COLUMN order_key TYPE text COLLATE "C";
