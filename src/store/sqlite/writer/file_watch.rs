//! The database file the writer opened, watched by its path. Deleted,
//! moved or replaced while serve runs, the file the writer still holds is
//! one the next start will not open (it would create an empty database
//! that takes every redelivery as new), so nothing committed to it may be
//! acknowledged: each group's commit is checked here before its callers
//! hear of it, one `stat` of the path per commit.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
