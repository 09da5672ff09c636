-- Version 4: a forward job's give_up_after clock and its failed probes
-- (jobs.failing_since, jobs.probe_failures). Applied when the columns are
-- missing; schema.sql creates the circuits table.
ALTER TABLE jobs ADD COLUMN failing_since INTEGER;
ALTER TABLE jobs ADD COLUMN probe_failures INTEGER NOT NULL DEFAULT 0;
