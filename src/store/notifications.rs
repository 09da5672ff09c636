//! The `notifications` table: one row per message to one `[[notify]]`
//! target, written in the transaction of its cause (`notify::raise`) and
//! delivered afterwards by the notifier (`notify::Notifier`) like a
//! forward job: taken, sent, recorded, retried.
//!
//! Coalescing lives in the rows: the first occurrence of a (target,
//! condition, source, action) is a row due now; a later one within
//! `coalesce` of the latest row's `due_at` opens a collecting row due at
//! the window's end (or adds one to its `count` when it is still
//! collecting: pending, no attempt, `due_at` ahead). Source and action
//! are stored as '' when the condition has none (shown as null).
//!
//! A take sets the row's `next_attempt_at` a lease ahead and counts the
//! attempt; the result is recorded fenced by that attempt number, so a
//! notifier that died mid-send leaves the row due again after the lease,
//! and on PostgreSQL a row another instance is taking is skipped
//! (`FOR UPDATE SKIP LOCKED`): one instance sends each.

use serde_json::{Value as Json, json};

use super::StoreError;
use super::db::{Db, Dialect};
use crate::args;

/// The advisory lock class ("notf") of a coalescing key on PostgreSQL;
/// the two-key locks are a space apart from the migration's one-key lock.
const NOTIFY_LOCK_CLASS: i64 = 0x6e6f_7466;

/// What one row says, for `notify list` and the admin API.
pub const LIST_COLUMNS: &str = "id, notify, condition, source, action, event_id, count, status, \
     attempts, created_at, sent_at, summary, details, last_error";

/// One occurrence of a condition, as written for one target.
pub struct NewRow<'a> {
    pub notify: &'a str,
    pub condition: &'a str,
    pub source: &'a str,
    pub action: &'a str,
    pub event_id: Option<&'a str>,
    pub summary: &'a str,
    pub details: &'a str,
}

/// Writes `row` in the open transaction of its cause, coalesced: a new
/// row due now, a collecting row due at the window's end, or one more in
/// the collecting row. Returns true when it was coalesced.
pub fn put(db: &Db<'_>, row: &NewRow<'_>, now: i64, coalesce_ms: i64) -> Result<bool, StoreError> {
    if coalesce_ms <= 0 {
        // No window: each occurrence its own row, due at once. (Judging
        // by the latest row's due time would make a row raised with an
        // earlier clock, from another instance or worker, look collecting.)
        insert(db, row, now, now)?;
        return Ok(false);
    }
    if db.dialect() == Dialect::Postgres {
        // Two transactions raising the same key take turns (until the
        // first commits), so the second sees the first's row and one
        // window has one collecting row. SQLite has one writer.
        db.execute(
            "SELECT pg_advisory_xact_lock(CAST(?1 AS INTEGER), hashtext(CAST(?2 AS TEXT)))",
            args![
                NOTIFY_LOCK_CLASS,
                format!(
                    "{}\u{1f}{}\u{1f}{}\u{1f}{}",
                    row.notify, row.condition, row.source, row.action
                )
            ],
        )?;
    }
    let latest = db.query_opt(
        "SELECT id, status, attempts, due_at, created_at FROM notifications
         WHERE notify = ?1 AND condition = ?2 AND source = ?3 AND action = ?4
         ORDER BY id DESC LIMIT 1",
        args![row.notify, row.condition, row.source, row.action],
    )?;
    let due_at = match latest {
        Some(r) => {
            let (id, status, attempts, due_at) = (r.i64(0)?, r.string(1)?, r.i64(2)?, r.i64(3)?);
            // A collecting row: made to go at a window's end (due after
            // it was made), not sent yet, its window not over.
            let collecting = due_at > r.i64(4)? && due_at > now;
            if status == "pending" && attempts == 0 && collecting {
                db.execute(
                    "UPDATE notifications SET count = count + 1, event_id = ?2, summary = ?3,
                            details = ?4
                      WHERE id = ?1",
                    args![id, row.event_id, row.summary, row.details],
                )?;
                return Ok(true);
            }
            if due_at + coalesce_ms > now {
                due_at + coalesce_ms
            } else {
                now
            }
        }
        None => now,
    };
    insert(db, row, due_at, now)?;
    Ok(false)
}

/// A new pending row, due at `due_at`.
fn insert(db: &Db<'_>, row: &NewRow<'_>, due_at: i64, now: i64) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO notifications (notify, condition, source, action, event_id, count, summary,
                                    details, status, attempts, due_at, next_attempt_at, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, 'pending', 0, ?8, ?8, ?9)",
        args![
            row.notify,
            row.condition,
            row.source,
            row.action,
            row.event_id,
            row.summary,
            row.details,
            due_at,
            now
        ],
    )?;
    Ok(())
}

/// A row taken for sending.
#[derive(Debug, Clone)]
pub struct Taken {
    pub id: i64,
    pub notify: String,
    pub condition: String,
    pub source: String,
    pub action: String,
    pub event_id: Option<String>,
    pub count: i64,
    pub summary: String,
    pub details: String,
    /// This attempt's number (1-based).
    pub attempt: i64,
    pub due_at: i64,
    pub created_at: i64,
}

/// True when some row is due (a read, so an idle notifier costs the
/// writer nothing).
pub fn any_due(db: &Db<'_>, now: i64) -> Result<bool, StoreError> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM notifications WHERE status = 'pending' AND next_attempt_at <= ?1 LIMIT 1",
            args![now],
        )?
        .is_some())
}

/// Takes up to `limit` due rows: each one's attempt counted and its next
/// attempt a lease ahead (a notifier that dies mid-send leaves it due
/// again then).
pub fn take(db: &Db<'_>, now: i64, lease_ms: i64, limit: i64) -> Result<Vec<Taken>, StoreError> {
    let lock = match db.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
    };
    let rows = db.query(
        &format!(
            "SELECT id, notify, condition, source, action, event_id, count, summary, details,
                    attempts, due_at, created_at
               FROM notifications WHERE status = 'pending' AND next_attempt_at <= ?1
              ORDER BY next_attempt_at LIMIT ?2{lock}"
        ),
        args![now, limit],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let t = Taken {
            id: r.i64(0)?,
            notify: r.string(1)?,
            condition: r.string(2)?,
            source: r.string(3)?,
            action: r.string(4)?,
            event_id: r.opt_string(5)?,
            count: r.i64(6)?,
            summary: r.string(7)?,
            details: r.string(8)?,
            attempt: r.i64(9)? + 1,
            due_at: r.i64(10)?,
            created_at: r.i64(11)?,
        };
        let changed = db.execute(
            "UPDATE notifications SET attempts = ?2, next_attempt_at = ?3
              WHERE id = ?1 AND attempts = ?4 AND status = 'pending'",
            args![t.id, t.attempt, now + lease_ms, t.attempt - 1],
        )?;
        if changed == 1 {
            out.push(t);
        }
    }
    Ok(out)
}

/// How an attempt ended.
pub enum Ended {
    Sent,
    /// Again at `next` (unix ms).
    Retry {
        next: i64,
        error: String,
    },
    Failed {
        error: String,
    },
}

/// Records an attempt's result, fenced by its number: false when the row
/// was taken again meanwhile (this notifier's lease ran out).
pub fn record(db: &Db<'_>, t: &Taken, result: &Ended, now: i64) -> Result<bool, StoreError> {
    let (status, next, error, sent_at): (&str, Option<i64>, Option<&str>, Option<i64>) =
        match result {
            Ended::Sent => ("sent", None, None, Some(now)),
            Ended::Retry { next, error } => ("pending", Some(*next), Some(error), None),
            Ended::Failed { error } => ("failed", None, Some(error), None),
        };
    let changed = db.execute(
        "UPDATE notifications SET status = ?3, next_attempt_at = ?4, last_error = ?5, sent_at = ?6
          WHERE id = ?1 AND attempts = ?2 AND status = 'pending'",
        args![t.id, t.attempt, status, next, error, sent_at],
    )?;
    Ok(changed == 1)
}

/// Records a message sent from memory (storage was down when it went):
/// `status` sent or failed, one attempt.
pub fn put_sent(
    db: &Db<'_>,
    row: &NewRow<'_>,
    status: &str,
    at: i64,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO notifications (notify, condition, source, action, event_id, count, summary,
                                    details, status, attempts, due_at, next_attempt_at, created_at,
                                    sent_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7, ?8, 1, 0, NULL, ?9, ?10)",
        args![
            row.notify,
            row.condition,
            row.source,
            row.action,
            row.event_id,
            row.summary,
            row.details,
            status,
            at,
            (status == "sent").then_some(now)
        ],
    )?;
    Ok(())
}

/// The newest `limit` notifications, newest first, in the contract's
/// shape (`notify list --json`, `GET /api/notifications`).
pub fn list(db: &Db<'_>, limit: i64) -> Result<Vec<Json>, StoreError> {
    let rows = db.query(
        &format!("SELECT {LIST_COLUMNS} FROM notifications ORDER BY id DESC LIMIT ?1"),
        args![limit],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let blank = |s: String| if s.is_empty() { None } else { Some(s) };
        out.push(json!({
            "id": r.i64(0)?,
            "notify": r.string(1)?,
            "condition": r.string(2)?,
            "source": blank(r.string(3)?),
            "action": blank(r.string(4)?),
            "event_id": r.opt_string(5)?,
            "count": r.i64(6)?,
            "status": r.string(7)?,
            "attempts": r.i64(8)?,
            "created_at": r.i64(9)? / 1000,
            "sent_at": r.opt_i64(10)?.map(|t| t / 1000),
            "summary": r.string(11)?,
            "last_error": r.opt_string(13)?,
        }));
    }
    Ok(out)
}

/// A job's last error (an SQL action's, for its dead letter).
pub fn job_error(
    db: &Db<'_>,
    source: &str,
    event_id: &str,
    action: &str,
) -> Result<Option<String>, StoreError> {
    match db.query_opt(
        "SELECT last_error FROM jobs WHERE source = ?1 AND event_id = ?2 AND action = ?3",
        args![source, event_id, action],
    )? {
        Some(r) => r.opt_string(0),
        None => Ok(None),
    }
}

/// Deletes up to `limit` sent or failed notifications created before
/// `before` (the notifier's own retention); returns how many.
pub fn prune(db: &Db<'_>, before: i64, limit: i64) -> Result<u64, StoreError> {
    db.execute(
        "DELETE FROM notifications WHERE id IN (
           SELECT id FROM notifications
            WHERE status IN ('sent', 'failed') AND created_at < ?1
            ORDER BY id LIMIT ?2)",
        args![before, limit],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> rusqlite::Connection {
        crate::store::open::testing::sqlite_memory()
    }

    fn row<'a>(event_id: &'a str) -> NewRow<'a> {
        NewRow {
            notify: "ops",
            condition: "dead_letter",
            source: "stripe",
            action: "app",
            event_id: Some(event_id),
            summary: "dead letter",
            details: "{}",
        }
    }

    /// (count, due_at, status) of every row, oldest first.
    fn rows(conn: &rusqlite::Connection) -> Vec<(i64, i64, String)> {
        let mut stmt = conn
            .prepare("SELECT count, due_at, status FROM notifications ORDER BY id")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn the_first_goes_at_once_and_the_window_collects_the_rest() {
        let conn = db();
        let db = Db::sqlite(&conn);
        let w = 300_000;
        assert!(!put(&db, &row("e1"), 1_000, w).unwrap());
        assert!(!put(&db, &row("e2"), 2_000, w).unwrap());
        assert!(put(&db, &row("e3"), 3_000, w).unwrap());
        assert!(put(&db, &row("e4"), 4_000, w).unwrap());
        assert_eq!(
            rows(&conn),
            [(1, 1_000, "pending".into()), (3, 301_000, "pending".into())]
        );
        // Another target, condition, source or action is its own key.
        let other = NewRow {
            action: "other",
            ..row("e5")
        };
        assert!(!put(&db, &other, 5_000, w).unwrap());
        assert_eq!(rows(&conn)[2], (1, 5_000, "pending".into()));

        // Only the first is due now; taking it counts the attempt.
        let taken = take(&db, 5_000, 60_000, 8).unwrap();
        let ids: Vec<i64> = taken.iter().map(|t| t.id).collect();
        assert_eq!(ids.len(), 2, "{taken:?}");
        assert!(take(&db, 5_000, 60_000, 8).unwrap().is_empty(), "leased");
        assert!(record(&db, &taken[0], &Ended::Sent, 6_000).unwrap());
        assert!(
            !record(&db, &taken[0], &Ended::Sent, 6_000).unwrap(),
            "fenced"
        );
        let gone = Ended::Failed {
            error: "the target answered 404".into(),
        };
        assert!(record(&db, &taken[1], &gone, 6_000).unwrap());
        // Once the window's message is being sent, the next occurrence
        // opens the next window.
        let window = take(&db, 301_000, 60_000, 8).unwrap();
        assert_eq!(window.len(), 1);
        assert_eq!(window[0].count, 3);
        assert!(!put(&db, &row("e6"), 302_000, w).unwrap());
        assert_eq!(rows(&conn)[3], (1, 601_000, "pending".into()));
        // Long after, the first goes at once again.
        assert!(!put(&db, &row("e7"), 2_000_000, w).unwrap());
        assert_eq!(rows(&conn)[4], (1, 2_000_000, "pending".into()));

        // A retry waits for its time; sent rows are pruned, pending kept.
        let r = Ended::Retry {
            next: 400_000,
            error: "the target answered 503".into(),
        };
        assert!(record(&db, &window[0], &r, 302_000).unwrap());
        assert!(
            take(&db, 399_999, 60_000, 8)
                .unwrap()
                .iter()
                .all(|t| t.id != window[0].id)
        );
        assert_eq!(prune(&db, 10_000_000, 100).unwrap(), 2);
        assert_eq!(rows(&conn).len(), 3);
    }

    /// With no window (`coalesce = "0s"`) each occurrence is its own row,
    /// due at once, even when raised with an earlier clock than the row
    /// before it (two instances, or two workers finishing out of order).
    #[test]
    fn without_a_window_nothing_is_collected_whatever_the_clocks() {
        let conn = db();
        let db = Db::sqlite(&conn);
        assert!(!put(&db, &row("e1"), 1_000, 0).unwrap());
        assert!(!put(&db, &row("e2"), 990, 0).unwrap());
        assert!(!put(&db, &row("e3"), 995, 0).unwrap());
        assert_eq!(
            rows(&conn),
            [
                (1, 1_000, "pending".into()),
                (1, 990, "pending".into()),
                (1, 995, "pending".into())
            ]
        );
    }
}
