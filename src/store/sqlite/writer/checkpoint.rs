//! Keeping the WAL bounded: the WAL hook's page count, the writer's own
//! RESTART checkpoint when the checkpointer is starved, and the
//! checkpointer thread with its own connection, woken after commits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::Shared;
use super::file_watch::{is_failed_sync, note_failed_sync};
use crate::config::Durability;
use crate::store::StoreError;

/// Pages in the WAL after the last commit, as SQLite's WAL hook reports
/// them (with durability normal). The hook is a plain function, which
/// cannot reach the writer's state, hence a static: the server runs one
/// writer. -1 until the first commit.
static WAL_PAGES: AtomicI64 = AtomicI64::new(-1);

pub(super) fn note_wal_pages(
    _: &rusqlite::hooks::Wal,
    pages: std::ffi::c_int,
) -> rusqlite::Result<()> {
    WAL_PAGES.store(i64::from(pages), Ordering::Relaxed);
    Ok(())
}

/// Whether to wake the checkpointer after a commit. With durability full,
/// always: the commit has fsynced the WAL anyway, and copying at once keeps
/// the WAL short. With normal, a commit costs no fsync, but a checkpoint
/// costs two (the WAL, then the database): waking it after every commit
/// made a lone delivery cost about three fsyncs. So only once the WAL holds
/// [`CHECKPOINT_FRAMES`]; below that the checkpointer's timer
/// ([`NORMAL_CHECKPOINT_INTERVAL`]) copies what there is.
pub(super) fn wants_checkpoint(shared: &Shared) -> bool {
    match shared.durability {
        Durability::Full => true,
        Durability::Normal => {
            let pages = WAL_PAGES.load(Ordering::Relaxed);
            if pages >= 0 {
                shared.wal_frames.store(pages, Ordering::Relaxed);
            }
            pages >= CHECKPOINT_FRAMES
        }
    }
}

/// Keeps the WAL bounded under continuous load. The checkpointer copies
/// frames in the background, but the WAL only starts over when a checkpoint
/// completes with no commit in between, which a busy writer may never
/// allow. Past `STARVED_FRAMES` the writer itself runs a RESTART checkpoint
/// between two groups: the checkpointer has copied most frames already, so
/// this costs the rest of the copy, once per ~64 MiB of WAL.
///
/// RESTART waits for the checkpointer's pass in progress and for readers
/// on an old snapshot (a backup, a long admin query): it gets a 100 ms busy
/// timeout here and at most four tries a second, so it never stalls the
/// writer for long.
pub(super) fn bound_wal(conn: &Connection, shared: &Shared, last_try: &mut Option<Instant>) {
    if shared.wal_frames.load(Ordering::Relaxed) <= STARVED_FRAMES
        || last_try.is_some_and(|t| t.elapsed() < Duration::from_millis(250))
    {
        return;
    }
    *last_try = Some(Instant::now());
    let restore = conn.busy_timeout(Duration::from_millis(100));
    let result = conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    });
    if restore.is_ok() {
        let _ = conn.busy_timeout(shared.busy_timeout);
    }
    if let Err(e) = &result
        && is_failed_sync(e)
    {
        note_failed_sync("the writer's checkpoint");
    }
    if let Ok((0, _, _)) = result {
        // Restarted: the next commit writes from the WAL's beginning.
        shared.wal_frames.store(0, Ordering::Relaxed);
    }
}

/// Wakes the checkpointer after commits.
pub(super) struct Kick {
    pending: Mutex<bool>,
    cv: Condvar,
}

impl Kick {
    pub(super) fn notify(&self) {
        if let Ok(mut p) = self.pending.lock() {
            *p = true;
            self.cv.notify_one();
        }
    }
}

/// Runs WAL checkpoints on its own thread and connection.
///
/// PASSIVE checkpoints copy what they can without blocking anyone; once a
/// checkpoint has copied the whole WAL, the writer's next transaction
/// starts the WAL over from its beginning, so the file stops growing. If
/// readers keep it from ever completing (checkpoint starvation) and the WAL
/// passes `STARVED_FRAMES`, a RESTART checkpoint waits for them.
pub(super) struct Checkpointer {
    pub(super) kick: Arc<Kick>,
    pub(super) stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// Frames (pages) in the WAL after which a blocking checkpoint is forced:
/// 16,384 frames of 4 KiB is 64 MiB.
const STARVED_FRAMES: i64 = 16_384;
/// Frames worth a passive checkpoint (SQLite's own autocheckpoint size,
/// about 4 MiB).
const CHECKPOINT_FRAMES: i64 = 1_000;
/// How often the checkpointer looks without being woken. With durability
/// normal this is what checkpoints a WAL that stays small (low load):
/// at most two fsyncs per interval, however many deliveries it held.
const FULL_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
const NORMAL_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(10);

impl Checkpointer {
    pub(super) fn start(
        path: PathBuf,
        durability: Durability,
        busy_timeout: Duration,
        wal_frames: Arc<AtomicI64>,
    ) -> Result<Checkpointer, StoreError> {
        let conn = crate::store::sqlite::open(&path, durability, busy_timeout)?;
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0")?;
        let kick = Arc::new(Kick {
            pending: Mutex::new(false),
            cv: Condvar::new(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (k, s, w) = (kick.clone(), stop.clone(), wal_frames.clone());
        let handle = std::thread::Builder::new()
            .name("idemhook-checkpoint".into())
            .spawn(move || {
                let interval = match durability {
                    Durability::Full => FULL_CHECKPOINT_INTERVAL,
                    Durability::Normal => NORMAL_CHECKPOINT_INTERVAL,
                };
                checkpoint_loop(conn, &k, &s, &w, interval)
            })
            .map_err(|e| StoreError::other(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Checkpointer {
            kick,
            stop,
            handle: Some(handle),
        })
    }

    pub(super) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.kick.notify();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn checkpoint_loop(
    conn: Connection,
    kick: &Kick,
    stop: &AtomicBool,
    wal_gauge: &AtomicI64,
    interval: Duration,
) {
    let mut wal_frames: i64 = 0;
    loop {
        // Wait to be woken, at most `interval`, so the WAL is tidied at idle.
        if let Ok(mut pending) = kick.pending.lock() {
            if !*pending {
                pending = match kick.cv.wait_timeout(pending, interval) {
                    Ok((p, _)) => p,
                    Err(_) => return,
                };
            }
            *pending = false;
        }
        if stop.load(Ordering::Relaxed) {
            let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            return;
        }
        let mode = if wal_frames > STARVED_FRAMES {
            "RESTART"
        } else {
            "PASSIVE"
        };
        let result = conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
        });
        if let Err(e) = &result
            && is_failed_sync(e)
        {
            note_failed_sync("a checkpoint");
        }
        if let Ok((log, done)) = result {
            wal_frames = log;
            wal_gauge.store(log, Ordering::Relaxed);
            if log - done < CHECKPOINT_FRAMES {
                // Caught up: pace the loop so an idle server does not spin.
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
