//! [`PgTx`]'s outbox worker steps ([`OutboxTx`]) that PostgreSQL writes
//! its own way: its clock, the `SKIP LOCKED` takes, and the reads of rows
//! (the rest are written once, in `store::tx`).

use crate::state::JobStatus;
use crate::store::StoreError;
use crate::store::circuits::CircuitRow;
use crate::store::tx::{Candidate, ForwardEvent, OutboxTx};

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
        let s = self.shared(crate::store::jobs::OPEN_OF_EVENT)?;
        self.client
            .query(&s, &[&source, &event_id])?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get::<_, &str>(1)?.parse()?)))
            .collect()
    }

    fn latest_replay_from(&mut self, job_id: i64) -> Result<Option<JobStatus>, StoreError> {
        let s = self.shared(crate::store::replays::LATEST_FROM)?;
        match self.client.query_opt(&s, &[&job_id])? {
            Some(r) => Ok(Some(r.try_get::<_, &str>(0)?.parse()?)),
            None => Ok(None),
        }
    }

    fn forward_event(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<Option<ForwardEvent>, StoreError> {
        let s = self.shared(crate::store::events::FORWARDED)?;
        Ok(self
            .client
            .query_opt(&s, &[&source, &event_id])?
            .map(|r| ForwardEvent {
                event_type: r.get(0),
                body: r.get(1),
                content_type: r.get(2),
            }))
    }
}
