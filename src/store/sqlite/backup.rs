//! `backup`'s storage side: SQLite's online backup of an open database
//! into a new file, as one step in one read transaction (a single
//! snapshot, never restarted by the server's commits), then the copy
//! switched out of WAL mode, checked with `quick_check` and its events
//! counted. `ops/backup.rs` keeps the command: refusing an existing path,
//! creating the file and removing it again on failure, and what it says.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use rusqlite::backup::{Backup, StepResult};

use crate::store::{StoreError, with_causes};

/// How often a busy or locked step is tried again before giving up.
const MAX_BUSY_RETRIES: u32 = 100;

/// The pause before a busy or locked step is tried again.
const BUSY_PAUSE: Duration = Duration::from_millis(50);

/// What a backup wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupReport {
    /// The events in the copy.
    pub events: i64,
    /// The copy's size.
    pub bytes: u64,
}

/// The step of a backup that failed, with its cause.
#[derive(Debug)]
pub enum BackupError {
    /// The new file did not open as a database.
    Open(StoreError),
    /// SQLite refused to start the backup.
    Start(StoreError),
    /// A step of the backup failed.
    Step(StoreError),
    /// Every step found the database busy or locked.
    Locked,
    /// The copy stayed in WAL mode.
    JournalMode(StoreError),
    /// `quick_check` did not run.
    Check(StoreError),
    /// `quick_check` found the copy damaged: its first line.
    Damaged(String),
    /// The copy's events could not be counted (it has no `events`).
    Events(StoreError),
}

/// Copies `source` into the (new, empty) file at `path`, leaves it a
/// single file out of WAL mode, and checks it.
pub fn write(path: &Path, source: &Connection) -> Result<BackupReport, BackupError> {
    super::open::create_private(path).map_err(BackupError::Open)?;
    let mut dest = Connection::open(path)
        .map_err(with_causes)
        .map_err(BackupError::Open)?;
    {
        let backup = Backup::new(source, &mut dest)
            .map_err(with_causes)
            .map_err(BackupError::Start)?;
        let mut retries = 0;
        loop {
            match backup
                .step(-1)
                .map_err(with_causes)
                .map_err(BackupError::Step)?
            {
                StepResult::Done => break,
                StepResult::More => {}
                _ => {
                    // Busy or locked: another connection holds a lock; wait.
                    retries += 1;
                    if retries > MAX_BUSY_RETRIES {
                        return Err(BackupError::Locked);
                    }
                    std::thread::sleep(BUSY_PAUSE);
                }
            }
        }
    }
    // The copy carries the source's WAL mode; leave a single file behind.
    dest.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))
        .map_err(with_causes)
        .map_err(BackupError::JournalMode)?;
    let check: String = dest
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(with_causes)
        .map_err(BackupError::Check)?;
    if check != "ok" {
        return Err(BackupError::Damaged(check));
    }
    let events: i64 = dest
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .map_err(with_causes)
        .map_err(BackupError::Events)?;
    drop(dest);
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(BackupReport { events, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that is not idemhook's: copied and checked, then refused
    /// for its missing events table.
    #[test]
    fn a_copy_without_events_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let source = Connection::open(dir.path().join("source.db")).unwrap();
        source.execute_batch("CREATE TABLE t (x)").unwrap();
        let path = dir.path().join("copy.db");
        let e = write(&path, &source).unwrap_err();
        assert!(
            matches!(&e, BackupError::Events(e) if e.message.starts_with("no such table: events")),
            "{e:?}"
        );
        source
            .execute_batch("CREATE TABLE events (x); INSERT INTO events VALUES (1)")
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let report = write(&path, &source).unwrap();
        assert_eq!(report.events, 1);
        assert_eq!(report.bytes, std::fs::metadata(&path).unwrap().len());
    }
}
