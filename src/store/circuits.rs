//! The storage steps of a forward action's circuit (`outbox::circuit`
//! decides), over the open transaction's `Db`, one text for both
//! backends: the `circuits` row of an action (locked on PostgreSQL while a
//! decision reads it), the jobs waiting on it (`waiting = 'circuit'`, no
//! due time, through the `jobs_circuit` partial index) and the reads the
//! operator side makes (`reconcile`, `probe`, the inspector, `/metrics`).

use crate::args;
use crate::store::StoreError;
use crate::store::db::{Db, Dialect, Row};

/// An action's circuit row as the outbox and the operator read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitRow {
    pub source: String,
    pub action: String,
    pub failures: i64,
    /// None while closed.
    pub opened_at: Option<i64>,
    pub next_probe_at: Option<i64>,
    pub probes: i64,
    pub probe_owner: Option<String>,
    pub probe_until: Option<i64>,
    pub opened_count: i64,
}

const COLUMNS: &str = "source, action, failures, opened_at, next_probe_at, probes, probe_owner,
                       probe_until, opened_count";

fn circuit_row(r: &Row) -> Result<CircuitRow, StoreError> {
    Ok(CircuitRow {
        source: r.string(0)?,
        action: r.string(1)?,
        failures: r.i64(2)?,
        opened_at: r.opt_i64(3)?,
        next_probe_at: r.opt_i64(4)?,
        probes: r.i64(5)?,
        probe_owner: r.opt_string(6)?,
        probe_until: r.opt_i64(7)?,
        opened_count: r.i64(8)?,
    })
}

/// The open circuits, by source and action.
pub const OPEN: &str =
    "SELECT source, action, failures, opened_at, next_probe_at, probes, probe_owner,
       probe_until, opened_count FROM circuits WHERE opened_at IS NOT NULL ORDER BY source, action";

/// The open circuits (a handful of rows at most: one per action).
pub fn open(db: &Db<'_>) -> Result<Vec<CircuitRow>, StoreError> {
    db.query(OPEN, &[])?.iter().map(circuit_row).collect()
}

/// Every circuit row (the inspector, `/metrics`).
pub fn all(db: &Db<'_>) -> Result<Vec<CircuitRow>, StoreError> {
    db.query(
        &format!("SELECT {COLUMNS} FROM circuits ORDER BY source, action"),
        &[],
    )?
    .iter()
    .map(circuit_row)
    .collect()
}

/// The action's row (made closed, with no failures, when missing), locked
/// until the transaction ends on PostgreSQL: every instance's decision on
/// this circuit goes one at a time from here.
pub fn locked(db: &Db<'_>, source: &str, action: &str, now: i64) -> Result<CircuitRow, StoreError> {
    db.execute(
        "INSERT INTO circuits (source, action, failures, updated_at) VALUES (?1, ?2, 0, ?3)
         ON CONFLICT (source, action) DO NOTHING",
        args![source, action, now],
    )?;
    circuit_row(&db.query_one(
        &format!(
            "SELECT {COLUMNS} FROM circuits WHERE source = ?1 AND action = ?2{}",
            db.dialect().for_update()
        ),
        args![source, action],
    )?)
}

/// Sets the consecutive failures (the circuit stays as it is).
pub fn set_failures(
    db: &Db<'_>,
    source: &str,
    action: &str,
    failures: i64,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE circuits SET failures = ?3, updated_at = ?4 WHERE source = ?1 AND action = ?2",
        args![source, action, failures, now],
    )?;
    Ok(())
}

/// Opens the circuit at `now`, its first probe due at `next_probe_at`.
pub fn set_open(
    db: &Db<'_>,
    source: &str,
    action: &str,
    failures: i64,
    now: i64,
    next_probe_at: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE circuits SET failures = ?3, opened_at = ?4, next_probe_at = ?5, probes = 0,
                probe_owner = NULL, probe_until = NULL, opened_count = opened_count + 1,
                updated_at = ?4
          WHERE source = ?1 AND action = ?2",
        args![source, action, failures, now, next_probe_at],
    )?;
    Ok(())
}

/// Closes the circuit (no failures) and makes every job waiting on it due
/// now, its `give_up_after` clock moved on by the time it waited. Returns
/// how many jobs were released.
pub fn set_closed(db: &Db<'_>, source: &str, action: &str, now: i64) -> Result<u64, StoreError> {
    db.execute(
        "UPDATE circuits SET failures = 0, opened_at = NULL, next_probe_at = NULL, probes = 0,
                probe_owner = NULL, probe_until = NULL, updated_at = ?3
          WHERE source = ?1 AND action = ?2",
        args![source, action, now],
    )?;
    release_waiting(db, source, action, now)
}

/// Makes the action's jobs waiting on its circuit due now (their wait
/// credited to their `give_up_after` clock).
pub fn release_waiting(
    db: &Db<'_>,
    source: &str,
    action: &str,
    now: i64,
) -> Result<u64, StoreError> {
    db.execute(
        "UPDATE jobs SET next_attempt_at = ?3, waiting = NULL,
                failing_since = failing_since + (?3 - updated_at), updated_at = ?3
          WHERE source = ?1 AND action = ?2 AND waiting = 'circuit' AND status = 'pending'",
        args![source, action, now],
    )
}

/// At start: jobs waiting on a circuit that is not open (closed by a
/// config without it, or copied by `migrate`) are due now.
pub fn release_orphans(db: &Db<'_>, now: i64) -> Result<u64, StoreError> {
    db.execute(
        "UPDATE jobs SET next_attempt_at = ?1, waiting = NULL,
                failing_since = failing_since + (?1 - updated_at), updated_at = ?1
          WHERE waiting = 'circuit' AND status = 'pending'
            AND NOT EXISTS (SELECT 1 FROM circuits c
                             WHERE c.source = jobs.source AND c.action = jobs.action
                               AND c.opened_at IS NOT NULL)",
        args![now],
    )
}

/// Takes the probe of an open circuit whose probe is due and not under way
/// (or whose prober's hold ran out): true when `owner` runs it, until
/// `until`. One conditional UPDATE decides, on every instance.
pub fn claim_probe(
    db: &Db<'_>,
    source: &str,
    action: &str,
    owner: &str,
    until: i64,
    now: i64,
) -> Result<bool, StoreError> {
    Ok(db.execute(
        "UPDATE circuits SET probe_owner = ?3, probe_until = ?4
          WHERE source = ?1 AND action = ?2 AND opened_at IS NOT NULL AND next_probe_at <= ?5
            AND (probe_until IS NULL OR probe_until < ?5)",
        args![source, action, owner, until, now],
    )? == 1)
}

/// A failed probe of `owner`: the next is due at `next_probe_at`.
pub fn probe_failed(
    db: &Db<'_>,
    source: &str,
    action: &str,
    owner: &str,
    next_probe_at: i64,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE circuits SET probes = probes + 1, next_probe_at = ?4, probe_owner = NULL,
                probe_until = NULL, updated_at = ?5
          WHERE source = ?1 AND action = ?2 AND probe_owner = ?3 AND opened_at IS NOT NULL",
        args![source, action, owner, next_probe_at, now],
    )?;
    Ok(())
}

/// The probe of `owner` ends without a verdict on the downstream (its job
/// was refused, or given back): the next probe is due at once.
pub fn probe_released(
    db: &Db<'_>,
    source: &str,
    action: &str,
    owner: &str,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE circuits SET next_probe_at = ?4, probe_owner = NULL, probe_until = NULL
          WHERE source = ?1 AND action = ?2 AND probe_owner = ?3 AND opened_at IS NOT NULL",
        args![source, action, owner, now],
    )?;
    Ok(())
}

/// `idemhook probe`: the open circuit's next probe is due now. False when
/// the circuit is not open.
pub fn probe_now(db: &Db<'_>, source: &str, action: &str, now: i64) -> Result<bool, StoreError> {
    Ok(db.execute(
        "UPDATE circuits SET next_probe_at = ?3
          WHERE source = ?1 AND action = ?2 AND opened_at IS NOT NULL",
        args![source, action, now],
    )? == 1)
}

/// A job waiting on its action's circuit, as the take reads it.
pub struct Waiting {
    pub job_id: i64,
    pub event_id: String,
    pub n_attempts: i64,
    pub updated_at: i64,
    pub failing_since: Option<i64>,
    pub probe_failures: i64,
}

/// The job that has waited longest on the action's circuit: the probe.
pub fn oldest_waiting(
    db: &Db<'_>,
    source: &str,
    action: &str,
) -> Result<Option<Waiting>, StoreError> {
    db.query_opt(
        "SELECT id, event_id, n_attempts, updated_at, failing_since, probe_failures FROM jobs
          WHERE source = ?1 AND action = ?2 AND waiting = 'circuit' AND status = 'pending'
          ORDER BY updated_at, id LIMIT 1",
        args![source, action],
    )?
    .map(|r| {
        Ok(Waiting {
            job_id: r.i64(0)?,
            event_id: r.string(1)?,
            n_attempts: r.i64(2)?,
            updated_at: r.i64(3)?,
            failing_since: r.opt_i64(4)?,
            probe_failures: r.i64(5)?,
        })
    })
    .transpose()
}

/// A pending job of an open circuit's action waits on it: no due time,
/// at the end of the waiting jobs (`updated_at`).
pub fn park(db: &Db<'_>, job_id: i64, n_attempts: i64, now: i64) -> Result<(), StoreError> {
    db.execute(
        &format!(
            "UPDATE jobs SET next_attempt_at = NULL, waiting = 'circuit', updated_at = ?3
              WHERE id = ?1 AND n_attempts = ?2 AND status = 'pending'{}",
            while_open(db)
        ),
        args![job_id, n_attempts, now],
    )?;
    Ok(())
}

/// Parks only while the job's circuit is still open. On PostgreSQL the
/// circuit's row is share-locked: a close (which updates that row, then
/// releases the waiting jobs) either waits for the parking transaction
/// and then releases what it parked, or commits first, and then nothing
/// is parked. Without it, a take that read the circuit open could park
/// jobs just after a close released the others: they waited for a
/// circuit no probe would ever close (until a restart). SQLite has one
/// writer: the condition holds by construction there.
fn while_open(db: &Db<'_>) -> &'static str {
    match db.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => {
            " AND EXISTS (SELECT 1 FROM circuits c
                           WHERE c.source = jobs.source AND c.action = jobs.action
                             AND c.opened_at IS NOT NULL FOR SHARE)"
        }
    }
}

/// A job of an open circuit whose lease ran out (its worker crashed or
/// hung mid-attempt) waits on the circuit like the others, rather than
/// being taken over and sent. False when it is no longer that lease.
pub fn park_lapsed(
    db: &Db<'_>,
    job_id: i64,
    n_attempts: i64,
    now: i64,
) -> Result<bool, StoreError> {
    Ok(db.execute(
        &format!(
            "UPDATE jobs SET status = 'pending', lease_owner = NULL, lease_until = NULL,
                    next_attempt_at = NULL, waiting = 'circuit', updated_at = ?3
              WHERE id = ?1 AND n_attempts = ?2 AND status = 'processing' AND lease_until < ?3{}",
            while_open(db)
        ),
        args![job_id, n_attempts, now],
    )? == 1)
}

/// The waiting job chosen as the probe is due now (the lease takes it),
/// its wait credited to its `give_up_after` clock. Returns the clock.
pub fn unpark_for_probe(db: &Db<'_>, w: &Waiting, now: i64) -> Result<bool, StoreError> {
    Ok(db.execute(
        "UPDATE jobs SET next_attempt_at = ?3, waiting = NULL,
                failing_since = failing_since + (?3 - updated_at)
          WHERE id = ?1 AND n_attempts = ?2 AND waiting = 'circuit' AND status = 'pending'",
        args![w.job_id, w.n_attempts, now],
    )? == 1)
}

/// A failed probe's job goes behind the other waiting jobs; its failure
/// counts toward neither `max_attempts` nor `give_up_after`.
pub fn probe_job_back(db: &Db<'_>, job_id: i64, now: i64) -> Result<(), StoreError> {
    db.execute(
        "UPDATE jobs SET next_attempt_at = NULL, waiting = 'circuit', updated_at = ?2,
                probe_failures = probe_failures + 1
          WHERE id = ?1 AND status = 'pending'",
        args![job_id, now],
    )?;
    Ok(())
}

/// The job's first failed attempt started at `at` (its `give_up_after`
/// clock starts there).
pub fn start_failing(db: &Db<'_>, job_id: i64, at: i64) -> Result<(), StoreError> {
    db.execute(
        "UPDATE jobs SET failing_since = ?2 WHERE id = ?1 AND failing_since IS NULL",
        args![job_id, at],
    )?;
    Ok(())
}

/// How many jobs of the action wait on its circuit.
pub fn waiting_count(db: &Db<'_>, source: &str, action: &str) -> Result<i64, StoreError> {
    db.query_one(
        "SELECT count(*) FROM jobs
          WHERE source = ?1 AND action = ?2 AND waiting = 'circuit' AND status = 'pending'",
        args![source, action],
    )?
    .i64(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::open::testing::{query_plan, sqlite_file};
    use rusqlite::params;

    /// The probe's pick and the release at close go down the
    /// `jobs_circuit` partial index: with 100,000 jobs waiting they cost
    /// a step down an index, not a scan of `jobs`.
    #[test]
    fn the_waiting_jobs_are_found_through_their_index() {
        let dir = tempfile::tempdir().unwrap();
        let conn = sqlite_file(&dir.path().join("plan.db"));
        let oldest = query_plan(
            &conn,
            "SELECT id, event_id, n_attempts, updated_at, failing_since, probe_failures FROM jobs
              WHERE source = ?1 AND action = ?2 AND waiting = 'circuit' AND status = 'pending'
              ORDER BY updated_at, id LIMIT 1",
            params!["s", "a"],
        );
        assert!(oldest.contains("INDEX jobs_circuit"), "{oldest}");
        let db = Db::sqlite(&conn);
        db.execute(
            "INSERT INTO jobs (source, event_id, action, kind, status, next_attempt_at, created_at,
                               updated_at, waiting, failing_since)
             VALUES ('s', 'e1', 'a', 'forward', 'pending', NULL, 1, 100, 'circuit', 50),
                    ('s', 'e2', 'a', 'forward', 'pending', NULL, 1, 200, 'circuit', NULL),
                    ('s', 'e3', 'b', 'forward', 'pending', NULL, 1, 100, 'circuit', NULL)",
            &[],
        )
        .unwrap();
        let first = oldest_waiting(&db, "s", "a").unwrap().unwrap();
        assert_eq!(first.event_id, "e1");
        // Closed at 1,000: e1 waited 900 ms, its clock moves on by as much.
        assert_eq!(release_waiting(&db, "s", "a", 1_000).unwrap(), 2);
        let since = db
            .query_one("SELECT failing_since FROM jobs WHERE event_id = 'e1'", &[])
            .unwrap()
            .i64(0)
            .unwrap();
        assert_eq!(since, 950);
        assert!(oldest_waiting(&db, "s", "a").unwrap().is_none());
        assert_eq!(
            waiting_count(&db, "s", "b").unwrap(),
            1,
            "another action's jobs wait"
        );
    }
}
