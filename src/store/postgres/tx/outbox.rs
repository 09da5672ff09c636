//! [`PgTx`]'s outbox worker steps ([`OutboxTx`]) in PostgreSQL's dialect.

use crate::state::JobStatus;
use crate::store::StoreError;
use crate::store::circuits::CircuitRow;
use crate::store::tx::{Candidate, CheckRow, ForwardEvent, NewAttempt, OutboxTx};

use super::PgTx;

fn candidate(r: &postgres::Row, pending: bool) -> Candidate {
    Candidate {
        job_id: r.get(0),
        source: r.get(1),
        event_id: r.get(2),
        action: r.get(3),
        n_before: r.get(4),
        leased_at: r.get(5),
        previous_owner: r.get(6),
        pending,
        failing_since: r.get(7),
        probe_failures: r.get(8),
    }
}

impl OutboxTx for PgTx<'_> {
    fn db(&mut self) -> crate::store::db::Db<'_> {
        crate::store::db::Db::postgres(self.client)
    }

    fn clock(&mut self, _local: i64) -> Result<i64, StoreError> {
        let s = self.prepared("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")?;
        Ok(self.client.query_one(&s, &[])?.get(0))
    }

    fn open_circuits(&mut self) -> Result<Vec<CircuitRow>, StoreError> {
        // Prepared once per connection: every take reads it.
        let s = self.prepared(crate::store::circuits::OPEN)?;
        Ok(self
            .client
            .query(&s, &[])?
            .iter()
            .map(|r| CircuitRow {
                source: r.get(0),
                action: r.get(1),
                failures: r.get(2),
                opened_at: r.get(3),
                next_probe_at: r.get(4),
                probes: r.get(5),
                probe_owner: r.get(6),
                probe_until: r.get(7),
                opened_count: r.get(8),
            })
            .collect())
    }

    fn expired_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError> {
        // SKIP LOCKED: a job another instance is taking right now is left
        // to it, not waited for.
        let s = self.prepared(
            "SELECT id, source, event_id, action, n_attempts, updated_at, lease_owner, failing_since,
                    probe_failures FROM jobs
             WHERE status = 'processing' AND kind = 'forward' AND lease_until < $1
             LIMIT 16 FOR UPDATE SKIP LOCKED",
        )?;
        Ok(self
            .client
            .query(&s, &[&now])?
            .iter()
            .map(|r| candidate(r, false))
            .collect())
    }

    fn due_jobs(&mut self, now: i64) -> Result<Vec<Candidate>, StoreError> {
        let s = self.prepared(
            "SELECT id, source, event_id, action, n_attempts, updated_at, lease_owner, failing_since,
                    probe_failures FROM jobs
             WHERE status = 'pending' AND next_attempt_at <= $1 AND kind = 'forward'
             ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED",
        )?;
        Ok(self
            .client
            .query(&s, &[&now])?
            .iter()
            .map(|r| candidate(r, true))
            .collect())
    }

    fn open_jobs_of_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Vec<(String, JobStatus)>, StoreError> {
        let s = self.prepared(
            "SELECT action, status FROM jobs WHERE source = $1 AND event_id = $2 AND status <> 'done'",
        )?;
        self.client
            .query(&s, &[&source, &event_id])?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get::<_, &str>(1)?.parse()?)))
            .collect()
    }

    fn park(
        &mut self,
        job_id: i64,
        n_attempts: i64,
        reason: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET next_attempt_at = NULL, last_error = $3, updated_at = $4, waiting = 'after'
             WHERE id = $1 AND n_attempts = $2 AND status = 'pending'",
        )?;
        self.client
            .execute(&s, &[&job_id, &n_attempts, &reason, &now])?;
        Ok(())
    }

    fn lease(
        &mut self,
        job_id: i64,
        owner: &str,
        lease_until: i64,
        now: i64,
        n_before: i64,
    ) -> Result<bool, StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = 'processing', waiting = NULL, lease_owner = $2, lease_until = $3,
                    n_attempts = n_attempts + 1, updated_at = $4
             WHERE id = $1 AND n_attempts = $5
               AND ((status = 'pending' AND next_attempt_at <= $4)
                    OR (status = 'processing' AND lease_until < $4))",
        )?;
        Ok(self
            .client
            .execute(&s, &[&job_id, &owner, &lease_until, &now, &n_before])?
            == 1)
    }

    fn replay_budget_base(&mut self, job_id: i64) -> Result<i64, StoreError> {
        let s = self.prepared(
            "SELECT coalesce(max(n), 0) FROM attempts WHERE job_id = $1
               AND started_at <= (SELECT max(replayed_at) FROM replays WHERE job_id = $1)",
        )?;
        Ok(self.client.query_one(&s, &[&job_id])?.get(0))
    }

    fn attempt_exists(&mut self, job_id: i64, n: i64) -> Result<bool, StoreError> {
        let s =
            self.prepared("SELECT EXISTS (SELECT 1 FROM attempts WHERE job_id = $1 AND n = $2)")?;
        Ok(self.client.query_one(&s, &[&job_id, &n])?.get(0))
    }

    fn record_cut_short(
        &mut self,
        job_id: i64,
        n: i64,
        started_at: i64,
        now: i64,
        worker: Option<&str>,
    ) -> Result<(), StoreError> {
        self.put(
            &NewAttempt::cut_short(job_id, n, started_at, now, worker),
            false,
        )
    }

    fn latest_replay_from(&mut self, job_id: i64) -> Result<Option<JobStatus>, StoreError> {
        let s = self.prepared(
            "SELECT from_status FROM replays WHERE job_id = $1 ORDER BY id DESC LIMIT 1",
        )?;
        match self.client.query_opt(&s, &[&job_id])? {
            Some(r) => Ok(Some(r.try_get::<_, &str>(0)?.parse()?)),
            None => Ok(None),
        }
    }

    fn end_job(
        &mut self,
        job_id: i64,
        now: i64,
        error: &str,
        status: &str,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = $4, lease_owner = NULL, lease_until = NULL,
                    last_error = $3, updated_at = $2
             WHERE id = $1",
        )?;
        self.client.execute(&s, &[&job_id, &now, &error, &status])?;
        Ok(())
    }

    fn forward_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<ForwardEvent>, StoreError> {
        let s = self.prepared(
            "SELECT type, payload, content_type FROM events WHERE source = $1 AND event_id = $2",
        )?;
        Ok(self
            .client
            .query_opt(&s, &[&source, &event_id])?
            .map(|r| ForwardEvent {
                event_type: r.get(0),
                body: r.get(1),
                content_type: r.get(2),
            }))
    }

    fn may_have_reached(&mut self, job_id: i64) -> Result<bool, StoreError> {
        let s = self.prepared(
            "SELECT EXISTS (SELECT 1 FROM attempts WHERE job_id = $1
               AND n > (SELECT coalesce(max(n), 0) FROM attempts
                         WHERE job_id = $1 AND outcome = 'ok')
               AND coalesce(error_kind, '') <> 'connect')",
        )?;
        Ok(self.client.query_one(&s, &[&job_id])?.get(0))
    }

    fn mark_processing(&mut self, source: &str, event_id: &str) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE events SET state = 'processing' WHERE source = $1 AND event_id = $2 AND state = 'accepted'",
        )?;
        self.client.execute(&s, &[&source, &event_id])?;
        Ok(())
    }

    fn next_due(&mut self) -> Result<Option<i64>, StoreError> {
        let s = self.prepared(
            "SELECT min(t) FROM (
                 SELECT min(next_attempt_at) AS t FROM jobs WHERE status = 'pending'
                 UNION ALL
                 SELECT min(lease_until) FROM jobs WHERE status = 'processing') due",
        )?;
        Ok(self.client.query_one(&s, &[])?.get(0))
    }

    fn finish_job(
        &mut self,
        job_id: i64,
        owner: &str,
        n: i64,
        status: &str,
        next_attempt_at: Option<i64>,
        last_error: Option<&str>,
        now: i64,
    ) -> Result<bool, StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = $4, next_attempt_at = $5, lease_owner = NULL, lease_until = NULL,
                    last_error = $6, updated_at = $7
             WHERE id = $1 AND status = 'processing' AND lease_owner = $2 AND n_attempts = $3",
        )?;
        Ok(self.client.execute(
            &s,
            &[
                &job_id,
                &owner,
                &n,
                &status,
                &next_attempt_at,
                &last_error,
                &now,
            ],
        )? == 1)
    }

    fn put_attempt(&mut self, a: &NewAttempt<'_>) -> Result<(), StoreError> {
        self.put(a, true)
    }

    fn insert_check(&mut self, c: &CheckRow<'_>) -> Result<(), StoreError> {
        let s = self.prepared(
            "INSERT INTO checks (job_id, n, asked_at, finished_at, answer, http_status, error, worker)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )?;
        self.client.execute(
            &s,
            &[
                &c.job_id,
                &c.n,
                &c.asked_at,
                &c.finished_at,
                &c.answer,
                &c.http_status,
                &c.error,
                &c.worker,
            ],
        )?;
        Ok(())
    }

    fn give_back(
        &mut self,
        job_id: i64,
        owner: &str,
        n: i64,
        status: &str,
    ) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET status = $4, n_attempts = n_attempts - 1,
                    lease_owner = NULL, lease_until = NULL
             WHERE id = $1 AND status = 'processing' AND lease_owner = $2 AND n_attempts = $3",
        )?;
        self.client.execute(&s, &[&job_id, &owner, &n, &status])?;
        Ok(())
    }

    fn release_parked(&mut self, now: i64) -> Result<(), StoreError> {
        let s = self.prepared(
            "UPDATE jobs SET next_attempt_at = $1 WHERE status = 'pending' AND next_attempt_at IS NULL
               AND coalesce(waiting, '') <> 'circuit'",
        )?;
        self.client.execute(&s, &[&now])?;
        Ok(())
    }
}
