-- idemhook on PostgreSQL, migration 4: jobs per status from counters, not
-- a count(*) over jobs (seconds at millions of done jobs, on every
-- /metrics scrape and every inspector poll).
--
-- A counter row per status updated by every instance's every job would
-- serialise them all on a few rows, so the changes are appended instead:
-- statement triggers write one row per status a statement changed into
-- job_count_deltas (no row is ever updated there, so no one waits), and
-- a fold (store::pg::FOLD_JOB_COUNTS, run every 2 s by each instance)
-- moves them into job_count_base in one transaction. job_counts, the name
-- both backends read, is the sum of the two.

DROP TABLE job_counts;

CREATE TABLE job_count_base (
    status text COLLATE "C" PRIMARY KEY,
    n      bigint NOT NULL
);

-- seq numbers the changes: with the row count it marks "a job moved"
-- for the inspector's list tag, in one look at a small table.
CREATE TABLE job_count_deltas (
    seq    bigint GENERATED ALWAYS AS IDENTITY,
    status text COLLATE "C" NOT NULL,
    delta  bigint NOT NULL
);

INSERT INTO job_count_base (status, n)
SELECT status, count(*) FROM jobs GROUP BY status;

CREATE VIEW job_counts AS
SELECT status, sum(n)::bigint AS n
  FROM (SELECT status, n FROM job_count_base
        UNION ALL
        SELECT status, delta FROM job_count_deltas) AS parts
 GROUP BY status;

CREATE FUNCTION idemhook_count_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (status, delta)
    SELECT status, count(*) FROM new_jobs GROUP BY status;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_count_inserted AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION idemhook_count_inserted();

CREATE FUNCTION idemhook_count_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (status, delta)
    SELECT status, sum(d)
      FROM (SELECT o.status, -1 AS d
              FROM old_jobs o JOIN new_jobs n ON n.id = o.id
             WHERE o.status <> n.status
            UNION ALL
            SELECT n.status, 1
              FROM old_jobs o JOIN new_jobs n ON n.id = o.id
             WHERE o.status <> n.status) AS moves
     GROUP BY status
    HAVING sum(d) <> 0;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_count_updated AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION idemhook_count_updated();

CREATE FUNCTION idemhook_count_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (status, delta)
    SELECT status, -count(*) FROM old_jobs GROUP BY status;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_count_deleted AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION idemhook_count_deleted();
