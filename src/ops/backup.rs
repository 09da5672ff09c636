//! `idemhook backup PATH`: a consistent copy of the database, taken with
//! SQLite's online backup API from a read-only connection while `serve`
//! keeps writing (WAL: readers do not block the writer). The whole copy is
//! one step in one read transaction, so it is a single snapshot and is
//! never restarted by the server's commits. Refuses an existing path.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rusqlite::Connection;
use rusqlite::backup::{Backup, StepResult};

use super::command::{CommandError, Outcome};
use crate::config::Config;

/// How often a busy or locked step is tried again before giving up.
const MAX_BUSY_RETRIES: u32 = 100;

/// `idemhook backup PATH`.
pub fn cmd(config: &Config, path: &Path) -> Result<Outcome, CommandError> {
    if path.exists() {
        return Err(CommandError::Usage(format!(
            "{} already exists; choose a new path",
            path.display()
        )));
    }
    let (events, bytes) = write(config, path).context("backup failed")?;
    writeln!(
        super::text::stdout(),
        "backup written to {}: {events} events, {bytes} bytes (checked with quick_check)",
        path.display()
    )?;
    Ok(Outcome::Done)
}

/// Creates the file, copies into it, checks the copy; removes the file
/// again when that fails. Returns the events and bytes copied.
fn write(config: &Config, path: &Path) -> Result<(i64, u64)> {
    if let Some(dir) = crate::store::missing_folder(path) {
        bail!(
            "cannot create {}: the folder {} does not exist (backup creates the file, not folders)",
            path.display(),
            dir.display()
        );
    }
    // create_new: refuse an existing file, even one created a moment ago.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::anyhow!("{} already exists; choose a new path", path.display())
            } else {
                anyhow::anyhow!("cannot create {}: {e}", path.display())
            }
        })?;
    let result = copy(config, path);
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

fn copy(config: &Config, path: &Path) -> Result<(i64, u64)> {
    let source = super::open::open_read(config)?;
    let mut dest = Connection::open(path)
        .with_context(|| format!("cannot open {} for the copy", path.display()))?;
    {
        let backup = Backup::new(&source, &mut dest).context("cannot start the backup")?;
        let mut retries = 0;
        loop {
            match backup.step(-1).context("backup step failed")? {
                StepResult::Done => break,
                StepResult::More => {}
                _ => {
                    // Busy or locked: another connection holds a lock; wait.
                    retries += 1;
                    if retries > MAX_BUSY_RETRIES {
                        bail!("the database stayed locked; try again");
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
    // The copy carries the source's WAL mode; leave a single file behind.
    dest.query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))
        .context("cannot switch the copy out of WAL mode")?;
    let check: String = dest
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .context("cannot check the copy")?;
    if check != "ok" {
        bail!("the copy failed its integrity check: {check}");
    }
    let events: i64 = dest
        .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
        .context("the copy has no events table")?;
    drop(dest);
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok((events, bytes))
}
