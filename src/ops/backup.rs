//! `idemhook backup PATH`: a consistent copy of the database, taken with
//! SQLite's online backup API from a read-only connection while `serve`
//! keeps writing (WAL: readers do not block the writer). The whole copy is
//! one step in one read transaction, so it is a single snapshot and is
//! never restarted by the server's commits. Refuses an existing path.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};

use super::command::{CommandError, Outcome};
use crate::config::Config;
use crate::store::sqlite::backup::{self, BackupError};

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
    if let Some(dir) = crate::store::sqlite::missing_folder(path) {
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

/// Copies the database into the new file at `path` (store's
/// [`backup::write`]) and says which step failed, when one did.
fn copy(config: &Config, path: &Path) -> Result<(i64, u64)> {
    let source = super::open::open_read(config)?;
    let report = backup::write(path, &source).map_err(|e| match e {
        BackupError::Open(e) => {
            anyhow::Error::new(e).context(format!("cannot open {} for the copy", path.display()))
        }
        BackupError::Start(e) => anyhow::Error::new(e).context("cannot start the backup"),
        BackupError::Step(e) => anyhow::Error::new(e).context("backup step failed"),
        BackupError::Locked => anyhow::anyhow!("the database stayed locked; try again"),
        BackupError::JournalMode(e) => {
            anyhow::Error::new(e).context("cannot switch the copy out of WAL mode")
        }
        BackupError::Check(e) => anyhow::Error::new(e).context("cannot check the copy"),
        BackupError::Damaged(check) => {
            anyhow::anyhow!("the copy failed its integrity check: {check}")
        }
        BackupError::Events(e) => anyhow::Error::new(e).context("the copy has no events table"),
    })?;
    Ok((report.events, report.bytes))
}
