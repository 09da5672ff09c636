-- idemhook on PostgreSQL, migration 5: the jobs indexes hold open jobs
-- only. Done jobs are most of the table at a realistic retention; the
-- indexes the workers and the gauges read (due jobs, expired leases, the
-- oldest pending, the failed and held lists) never need them, and a job
-- that is done leaves these indexes instead of being written into them.

DROP INDEX jobs_due;
DROP INDEX jobs_status_created;
CREATE INDEX jobs_due ON jobs (next_attempt_at) WHERE status = 'pending';
CREATE INDEX jobs_leased ON jobs (lease_until) WHERE status = 'processing';
CREATE INDEX jobs_open ON jobs (status, created_at)
    WHERE status IN ('pending', 'processing', 'failed', 'paused');
