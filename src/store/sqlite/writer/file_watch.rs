//! When the database file can no longer be trusted, so that nothing
//! committed to it may be acknowledged.
//!
//! - Watched by its path ([`FileWatch`]): deleted, moved or replaced while
//!   serve runs, the file the writer still holds is one the next start
//!   will not open (it would create an empty database that takes every
//!   redelivery as new). Each group's commit is checked before its callers
//!   hear of it, one `stat` of the path per commit.
//! - A failed fsync ([`note_failed_sync`]): the kernel may have dropped the
//!   pages it could not write, and a later fsync on the same file may
//!   report success for less than was written ("fsyncgate"). From then on
//!   no commit runs on this process's handles, and serve exits with status
//!   3 for its supervisor to start it again on what the disk holds.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::store::{StoreError, StoreErrorKind};

/// A file's identity: its device and inode.
type Identity = (u64, u64);

pub(super) struct FileWatch {
    path: PathBuf,
    /// The identity the path had when the writer started; None where
    /// there is no file to watch (an in-memory database).
    opened: Option<Identity>,
    /// Whether the loss has been logged (once per loss, not per commit).
    reported: bool,
}

impl FileWatch {
    /// Takes the identity of `path` now, right after the writer's
    /// connection opened it.
    pub(super) fn new(path: &Path) -> FileWatch {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let opened = identity(&path).ok();
        FileWatch {
            path,
            opened,
            reported: false,
        }
    }

    /// Ok while the path still names the file the writer opened; else an
    /// I/O error naming the path (the commit's callers answer 503, and
    /// readiness fails), logged once until the file is back.
    pub(super) fn check(&mut self) -> Result<(), StoreError> {
        let Some(opened) = self.opened else {
            return Ok(());
        };
        let why = match identity(&self.path) {
            Ok(now) if now == opened => {
                if self.reported {
                    self.reported = false;
                    crate::log::info(
                        "the database file is back at its path",
                        &[("path", &self.path.display())],
                    );
                }
                return Ok(());
            }
            Ok(_) => "was replaced by another file",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "was deleted or moved away",
            Err(_) => "cannot be looked up",
        };
        let message = format!(
            "the database file {} {why} while serve runs: nothing written now could be found \
             by the next start, so no delivery is acknowledged; put the file back or restart serve",
            self.path.display()
        );
        if !self.reported {
            self.reported = true;
            crate::log::error(
                "the database file is gone from its path",
                &[("path", &self.path.display()), ("error", &message)],
            );
        }
        Err(StoreError {
            kind: StoreErrorKind::Io,
            message,
        })
    }
}

/// Set by the first failed fsync of the database or its WAL (a commit's
/// or a checkpoint's). One per process, as serve runs one writer.
static SYNC_FAILED: AtomicBool = AtomicBool::new(false);

/// How long serve goes on answering (503) after a failed fsync before it
/// exits, so the deliveries of the failed commit hear their 503.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Whether SQLite's error is a failed fsync (of the WAL, the database or
/// its folder).
pub(super) fn is_failed_sync(e: &rusqlite::Error) -> bool {
    use rusqlite::ffi::{SQLITE_IOERR_DIR_FSYNC, SQLITE_IOERR_FSYNC};
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.extended_code == SQLITE_IOERR_FSYNC || f.extended_code == SQLITE_IOERR_DIR_FSYNC)
}

/// Records a failed fsync (`during`: what was syncing): every later
/// commit fails at once, and the process exits with status 3 after
/// [`EXIT_GRACE`]. Only the first call acts.
pub(super) fn note_failed_sync(during: &str) {
    if SYNC_FAILED.swap(true, Ordering::SeqCst) {
        return;
    }
    crate::log::error(
        "an fsync of the database failed",
        &[
            ("during", &during),
            (
                "effect",
                &"no more commits on this file; serve exits with status 3 for its supervisor to restart it",
            ),
        ],
    );
    let exit = || {
        std::thread::sleep(EXIT_GRACE);
        crate::log::error(
            "exiting after a failed fsync",
            &[
                ("status", &3),
                ("restart", &"the supervisor's (systemd: Restart=on-failure)"),
            ],
        );
        std::process::exit(3);
    };
    if std::thread::Builder::new()
        .name("idemhook-fsync-exit".into())
        .spawn(exit)
        .is_err()
    {
        std::process::exit(3);
    }
}

/// Err while a failed fsync stands: no commit may run on this process's
/// handles any more.
pub(super) fn after_failed_sync() -> Result<(), StoreError> {
    if SYNC_FAILED.load(Ordering::SeqCst) {
        return Err(StoreError {
            kind: StoreErrorKind::Io,
            message: "an fsync of the database failed earlier: the kernel may have dropped \
                      writes, so nothing more is committed on this file until serve restarts"
                .to_string(),
        });
    }
    Ok(())
}

fn identity(path: &Path) -> std::io::Result<Identity> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_moved_or_replaced_file_fails_the_check_and_a_restored_one_passes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("db");
        std::fs::write(&path, b"x").expect("write");
        let mut watch = FileWatch::new(&path);
        assert!(watch.check().is_ok());

        let moved = dir.path().join("moved");
        std::fs::rename(&path, &moved).expect("move away");
        let e = watch.check().expect_err("moved away");
        assert_eq!(e.kind, StoreErrorKind::Io);
        assert!(e.message.contains(&path.display().to_string()), "{e}");

        std::fs::write(&path, b"x").expect("a new file at the path");
        assert!(
            watch
                .check()
                .expect_err("replaced")
                .message
                .contains("replaced")
        );

        std::fs::rename(&moved, &path).expect("the first file back");
        assert!(watch.check().is_ok());
        std::fs::remove_file(&path).expect("delete");
        assert!(watch.check().is_err());
    }
}
