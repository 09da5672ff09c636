//! The one writer: every write of the server goes through one thread that
//! owns the read-write connection and commits in groups.
//!
//! A caller hands the writer a closure with [`Writer::call`] and blocks.
//! The writer takes whatever closures are waiting when it is free (no
//! timer: a lone call commits at once), runs each inside its own savepoint
//! in one `BEGIN IMMEDIATE` transaction, commits once, and only then
//! releases every caller with its own result. So one fsync covers the whole
//! group, a failing closure rolls back only itself, and no caller hears
//! "done" before the commit that holds its write has returned. The hot
//! closures (claims, outbox leases and completions) skip the savepoint
//! ([`Guard::Group`]); if one of them fails, the whole group is rolled back.
//!
//! A caller that must not block (a connection thread that answers its
//! request later) uses [`Writer::call_then`]: its continuation runs after
//! the commit on the answer thread, so the writer hands a whole group's
//! continuations over with one wake-up instead of waking each caller.
//!
//! Records that nobody waits for ([`Writer::send`], [`Writer::submit`])
//! are the exception to "no timer": a group made only of them stays open up
//! to `LINGER` for more to join, and the first closure a caller waits on
//! ends that at once. Forward workers record each attempt this way; without
//! it, a stream of completions paid a commit (and an fsync) each.
//!
//! Checkpoints run on a second thread with its own connection
//! (`Checkpointer`), never inside a commit, so the latency tail does not
//! carry them; it also keeps the WAL bounded. With durability full it is
//! woken after every commit; with normal, where a checkpoint's two fsyncs
//! would be the only ones, once the WAL holds 1,000 frames, else every 10 s.
//!
//! This file holds the callers' side ([`Writer`]); `group.rs` the writer
//! and answer threads, `checkpoint.rs` the WAL bound and the checkpointer,
//! `file_watch.rs` the check that the file is still at its path before a
//! commit's callers are answered.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use crate::config::Durability;
use crate::store::StoreError;
use crate::store::sqlite::in_savepoint;
use crate::time::now_ms;

mod checkpoint;
mod file_watch;
mod group;

use checkpoint::{Checkpointer, note_wal_pages};
use group::{answer_loop, run};

/// The most closures in one transaction. Bounded so that one commit's
/// latency stays bounded too.
const MAX_GROUP: usize = 512;
/// How many calls may wait for the writer before callers block.
const QUEUE: usize = 4096;
/// How long a group that no caller waits on stays open for company.
const LINGER: Duration = Duration::from_millis(2);

type AfterCommit = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// A group's continuations ([`Writer::call_then`]) and its commit result,
/// for the answer thread.
type Answers = (Vec<AfterCommit>, Result<(), StoreError>);
/// An operation gets the connection inside the group transaction, or the
/// reason there is none (the transaction could not start or was lost). It
/// returns what to do once the group's fate is known, and the error it
/// failed with if it ran without a savepoint ([`Guard::Group`]): its
/// partial writes are then in the transaction, which must not commit.
type Op =
    Box<dyn FnOnce(Result<&Connection, &StoreError>) -> (AfterCommit, Option<StoreError>) + Send>;

pub use crate::store::backend::Guard;

/// Runs `f` under `guard`: its result, and the error that poisons the
/// group if it failed without a savepoint.
fn run_guarded<T, F>(
    conn: &Connection,
    guard: Guard,
    f: F,
) -> (Result<T, StoreError>, Option<StoreError>)
where
    F: FnOnce(&Connection) -> Result<T, StoreError>,
{
    match guard {
        Guard::Savepoint => (in_savepoint(conn, "op", f), None),
        Guard::Group => {
            let result = f(conn);
            let poison = result.as_ref().err().cloned();
            (result, poison)
        }
    }
}

/// The operation that runs `f` under `guard` and, once its group's fate
/// is known, hands `release` the result (the commit's error, if that
/// failed).
fn op_then<T, F, A>(guard: Guard, f: F, release: A) -> Op
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    A: FnOnce(Result<T, StoreError>) + Send + 'static,
{
    Box::new(move |conn: Result<&Connection, &StoreError>| {
        let (result, poison) = match conn {
            Ok(conn) => run_guarded(conn, guard, f),
            Err(e) => (Err(e.clone()), None),
        };
        let done: AfterCommit = Box::new(move |commit: Result<(), StoreError>| {
            release(commit.and(result));
        });
        (done, poison)
    })
}

enum Msg {
    /// An operation, whether a caller blocks until its commit, and how it
    /// is kept apart from its group.
    Op(Op, Waits, Guard),
    Stop,
}

/// Who waits for an operation, which decides who releases it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Waits {
    /// A caller blocks until the commit; the writer releases it.
    Yes,
    /// Nobody: a record. A group of only these may linger.
    No,
    /// A continuation ([`Writer::call_then`]), run on the answer thread.
    Answer,
}

/// A handle on the writer thread; cheap to clone.
#[derive(Clone)]
pub struct Writer {
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
}

struct Shared {
    /// False from a failed commit until the next good one.
    healthy: AtomicBool,
    /// When the last commit (good or bad) finished, in ms.
    last_commit_at: AtomicI64,
    /// The last failed commit: when (ms), and why.
    last_failure: Mutex<Option<(i64, StoreError)>>,
    commits: AtomicU64,
    grouped_ops: AtomicU64,
    /// Frames in the WAL at the last checkpoint.
    wal_frames: Arc<AtomicI64>,
    busy_timeout: Duration,
    /// Operations queued and not yet taken by the writer.
    queued: AtomicUsize,
    /// How long a group no caller waits on stays open ([`LINGER`]).
    linger: Duration,
    /// Full: the checkpointer is woken after every commit. Normal: only
    /// once the WAL holds [`CHECKPOINT_FRAMES`], else by its timer.
    durability: Durability,
}

/// Joins the writer and checkpointer threads on shutdown.
pub struct WriterThreads {
    writer: Option<JoinHandle<()>>,
    answerer: Option<JoinHandle<()>>,
    checkpointer: Checkpointer,
    tx: SyncSender<Msg>,
}

impl Writer {
    /// Starts the writer on `conn` (already migrated) and a checkpointer on
    /// a second connection to the same file.
    pub fn start(
        conn: Connection,
        path: PathBuf,
        durability: Durability,
        busy_timeout: Duration,
    ) -> Result<(Writer, WriterThreads), StoreError> {
        Writer::start_lingering(conn, path, durability, busy_timeout, LINGER)
    }

    fn start_lingering(
        conn: Connection,
        path: PathBuf,
        durability: Durability,
        busy_timeout: Duration,
        linger: Duration,
    ) -> Result<(Writer, WriterThreads), StoreError> {
        // Checkpoints belong to the checkpointer, not to request commits.
        // The cache stays modest: once a b-tree split has used the
        // pending-byte page number, SQLite walks the whole page cache on
        // every commit (docs/performance.md, "Kept").
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = -8192;")?;
        // After wal_autocheckpoint, which replaces the WAL hook: with
        // durability normal the writer learns the WAL's size from it.
        if durability == Durability::Normal {
            conn.wal_hook(Some(note_wal_pages));
        }
        // Every statement the writer runs is a cached one; rusqlite keeps 16
        // by default, fewer than the claim, outbox and admin statements
        // together, and an evicted statement is parsed again (1.3% of W4's
        // samples were sqlite3Prepare).
        conn.set_prepared_statement_cache_capacity(128);
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let shared = Arc::new(Shared {
            healthy: AtomicBool::new(true),
            last_commit_at: AtomicI64::new(0),
            last_failure: Mutex::new(None),
            commits: AtomicU64::new(0),
            grouped_ops: AtomicU64::new(0),
            wal_frames: Arc::new(AtomicI64::new(0)),
            busy_timeout,
            queued: AtomicUsize::new(0),
            linger,
            durability,
        });
        let watch = file_watch::FileWatch::new(&path);
        let checkpointer =
            Checkpointer::start(path, durability, busy_timeout, shared.wal_frames.clone())?;
        let kick = checkpointer.kick.clone();
        let (answers_tx, answers_rx) = mpsc::channel::<Answers>();
        let answerer = std::thread::Builder::new()
            .name("idemhook-answer".into())
            .spawn(move || answer_loop(&answers_rx))
            .map_err(|e| StoreError::other(format!("cannot start the answer thread: {e}")))?;
        let thread_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("idemhook-writer".into())
            .spawn(move || run(conn, watch, rx, thread_shared, kick, answers_tx))
            .map_err(|e| StoreError::other(format!("cannot start the writer thread: {e}")))?;
        Ok((
            Writer {
                tx: tx.clone(),
                shared,
            },
            WriterThreads {
                writer: Some(writer),
                answerer: Some(answerer),
                checkpointer,
                tx,
            },
        ))
    }

    /// Runs `f` in the next group transaction and returns its result once
    /// that transaction has committed. If `f` fails, only its own writes are
    /// rolled back; if the commit fails, every caller in the group gets the
    /// commit's error.
    pub fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.call_with(Guard::Savepoint, f)
    }

    /// [`Writer::call`] with the given [`Guard`].
    pub fn call_with<T, F>(&self, guard: Guard, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply_tx, reply_rx) = mpsc::sync_channel::<Result<T, StoreError>>(1);
        let op = op_then(guard, f, move |result| {
            let _ = reply_tx.send(result);
        });
        self.enqueue(op, Waits::Yes, guard)?;
        reply_rx.recv().map_err(|_| StoreError::closed())?
    }

    /// Like [`Writer::call_with`] but returns at once: `then` gets what
    /// `call_with` would have returned, on the answer thread, once the
    /// group has committed (or failed). `then` must be quick and must not
    /// block: it holds up the next group's continuations. If the writer is
    /// gone, `then` is dropped without being called; it must treat that as
    /// a failure.
    pub fn call_then<T, F, A>(&self, guard: Guard, f: F, then: A)
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
        A: FnOnce(Result<T, StoreError>) + Send + 'static,
    {
        let _ = self.enqueue(op_then(guard, f, then), Waits::Answer, guard);
    }

    /// Like [`Writer::call`] but does not wait; for bookkeeping that must
    /// not hold up a response (the record of a refused delivery). Dropped,
    /// and reported false, when the queue is full.
    pub fn submit<F>(&self, f: F) -> bool
    where
        F: FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
    {
        let op: Op = Box::new(move |conn: Result<&Connection, &StoreError>| {
            if let Ok(conn) = conn {
                let _ = in_savepoint(conn, "op", f);
            }
            (Box::new(|_| {}), None)
        });
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Msg::Op(op, Waits::No, Guard::Savepoint)) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Queues `f` for the next group and returns without waiting for the
    /// commit (it blocks only while the queue is full). For records whose
    /// loss in a crash is harmless because the work they record is redone,
    /// such as a forward job's completion (the job is retried after its
    /// lease, with the same Idempotency-Key).
    pub fn send<F>(&self, f: F) -> Result<(), StoreError>
    where
        F: FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
    {
        self.send_with(Guard::Savepoint, f)
    }

    /// [`Writer::send`] with the given [`Guard`].
    pub fn send_with<F>(&self, guard: Guard, f: F) -> Result<(), StoreError>
    where
        F: FnOnce(&Connection) -> Result<(), StoreError> + Send + 'static,
    {
        let op: Op = Box::new(move |conn: Result<&Connection, &StoreError>| {
            let (result, poison) = match conn {
                Ok(conn) => run_guarded(conn, guard, f),
                Err(e) => (Err(e.clone()), None),
            };
            if let Err(e) = result {
                crate::log::warn("storage", &[("error", &e.message)]);
            }
            (Box::new(|_| {}), poison)
        });
        self.enqueue(op, Waits::No, guard)
    }

    fn enqueue(&self, op: Op, waits: Waits, guard: Guard) -> Result<(), StoreError> {
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        self.tx.send(Msg::Op(op, waits, guard)).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
            StoreError::closed()
        })
    }

    /// Operations waiting for the writer: the depth of its queue.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Relaxed)
    }

    /// Whether the last commit succeeded.
    pub fn healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Relaxed)
    }

    /// Why a commit failed within `within`, if one did. Readiness looks at
    /// it: with the disk nearly full, a small write can commit while the
    /// groups that carry events fail.
    pub fn recent_failure(&self, within: Duration) -> Option<StoreError> {
        let last = self.shared.last_failure.lock().ok()?;
        let (at, e) = last.as_ref()?;
        (now_ms() - at <= within.as_millis() as i64).then(|| e.clone())
    }

    /// Proves the database takes a write right now: a tiny real write made
    /// for this call. It joins the next group, which begins after the call
    /// (so a commit that started earlier never answers for it), and fails
    /// when that group cannot take the write lock within the busy timeout.
    pub fn probe(&self) -> Result<(), StoreError> {
        self.call(|conn| {
            conn.prepare_cached(
                "INSERT INTO meta(key, value) VALUES ('last_probe_at', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?
            .execute([now_ms().to_string()])?;
            Ok(())
        })
    }

    /// (commits, operations committed) since start: their ratio is the
    /// average group size.
    pub fn group_stats(&self) -> (u64, u64) {
        (
            self.shared.commits.load(Ordering::Relaxed),
            self.shared.grouped_ops.load(Ordering::Relaxed),
        )
    }
}

impl WriterThreads {
    /// Lets the writer finish what is queued, then stops both threads.
    pub fn stop(mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
        // The writer has dropped its end: the answer thread runs what is
        // left and ends.
        if let Some(h) = self.answerer.take() {
            let _ = h.join();
        }
        self.checkpointer.stop();
    }
}
/// Test helper: holds the writer busy inside one operation until
/// released, so that calls made meanwhile queue up and commit as one group.
#[cfg(test)]
pub(crate) struct Held {
    release: mpsc::Sender<()>,
    blocker: JoinHandle<Result<(), StoreError>>,
}

#[cfg(test)]
impl Held {
    pub(crate) fn start(writer: &Writer) -> Held {
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let (release, release_rx) = mpsc::channel::<()>();
        let w = writer.clone();
        let blocker = std::thread::spawn(move || {
            w.call(move |_| {
                let _ = started_tx.send(());
                let _ = release_rx.recv_timeout(Duration::from_secs(10));
                Ok(())
            })
        });
        started_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the writer took the holding operation");
        Held { release, blocker }
    }

    /// Waits until `n` operations are queued behind the held one.
    pub(crate) fn wait_queued(writer: &Writer, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while writer.queued() < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(writer.queued() >= n, "{n} operations never queued");
    }

    pub(crate) fn release(self) {
        let _ = self.release.send(());
        self.blocker
            .join()
            .expect("the holding operation did not panic")
            .expect("the holding operation committed");
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Instant;

    use super::*;

    /// A fresh migrated database and its writer (`linger` for groups that
    /// no caller waits on).
    fn writer(linger: Duration) -> (tempfile::TempDir, PathBuf, Writer, WriterThreads) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let mut conn =
            crate::store::sqlite::open(&path, Durability::Full, Duration::from_secs(5)).unwrap();
        crate::store::sqlite::migrate(&mut conn).unwrap();
        let (writer, threads) = Writer::start_lingering(
            conn,
            path.clone(),
            Durability::Full,
            Duration::from_secs(5),
            linger,
        )
        .unwrap();
        (dir, path, writer, threads)
    }

    /// An operation that writes `key` into meta.
    fn put(key: impl Into<String>) -> impl FnOnce(&Connection) -> Result<(), StoreError> {
        let key = key.into();
        move |conn: &Connection| -> Result<(), StoreError> {
            conn.execute("INSERT INTO meta (key, value) VALUES (?1, 'x')", [key])?;
            Ok(())
        }
    }

    /// The keys the operations above wrote, sorted, once the writer stopped.
    fn keys_written(path: &Path) -> Vec<String> {
        let db = crate::store::sqlite::open_read(path, Duration::from_secs(5)).unwrap();
        db.prepare("SELECT key FROM meta WHERE value = 'x' ORDER BY key")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Records no caller waits on (a forward job's completion) linger for
    /// company instead of paying a commit each, and a caller that waits
    /// ends the lingering: its call commits with them at once.
    #[test]
    fn records_wait_for_company_and_a_waiting_call_ends_the_wait() {
        // A long linger, so the test does not race the clock.
        let (_dir, path, writer, threads) = writer(Duration::from_secs(30));
        let (commits_before, ops_before) = writer.group_stats();
        for i in 0..5 {
            writer.send(put(format!("record-{i}"))).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
        // Without the linger each record would have committed on its own
        // by now.
        assert_eq!(writer.group_stats(), (commits_before, ops_before));
        let clock = Instant::now();
        writer.call(put("call")).unwrap();
        assert!(
            clock.elapsed() < Duration::from_secs(20),
            "the call waited for the linger to run out"
        );
        let (commits_after, ops_after) = writer.group_stats();
        assert_eq!(
            (commits_after - commits_before, ops_after - ops_before),
            (1, 6)
        );
        drop(writer);
        threads.stop();
        assert_eq!(keys_written(&path).len(), 6);
    }

    /// An operation without a savepoint (Guard::Group) that fails leaves its
    /// partial writes in the transaction: the whole group is rolled back,
    /// every caller in it gets the error, and the next group commits.
    #[test]
    fn a_failing_unguarded_operation_rolls_back_its_whole_group() {
        let (_dir, path, writer, threads) = writer(LINGER);
        type Write = Box<dyn FnOnce(&Connection) -> Result<(), StoreError> + Send>;
        let spawn_call = |guard: Guard, f: Write| {
            let w = writer.clone();
            std::thread::spawn(move || w.call_with(guard, f))
        };
        // Hold the writer so that the three calls below form one group, in
        // this order.
        let held = Held::start(&writer);
        let mut handles = vec![spawn_call(Guard::Savepoint, Box::new(put("guarded")))];
        Held::wait_queued(&writer, 1);
        handles.push(spawn_call(
            Guard::Group,
            Box::new(|conn: &Connection| -> Result<(), StoreError> {
                conn.execute("INSERT INTO meta (key, value) VALUES ('partial', 'x')", [])?;
                Err(StoreError::other("storage failed halfway"))
            }),
        ));
        Held::wait_queued(&writer, 2);
        handles.push(spawn_call(Guard::Group, Box::new(put("after"))));
        Held::wait_queued(&writer, 3);
        held.release();
        for h in handles {
            let e = h
                .join()
                .unwrap()
                .expect_err("every call in the group fails");
            assert_eq!(e.message, "storage failed halfway");
        }
        // The writer goes on.
        writer.call(put("next")).unwrap();
        drop(writer);
        threads.stop();
        assert_eq!(keys_written(&path), vec!["next".to_string()]);
    }

    /// A panic inside an operation rolls back its writes, is answered as an
    /// error, and leaves the writer serving the next operation.
    #[test]
    fn a_panicking_operation_is_rolled_back_and_the_writer_goes_on() {
        let (_dir, path, writer, threads) = writer(LINGER);
        writer.call(put("before")).unwrap();
        let result = writer.call(|conn: &Connection| -> Result<(), StoreError> {
            conn.execute("INSERT INTO meta (key, value) VALUES ('panicked', 'x')", [])?;
            panic!("a bug in an operation");
        });
        assert!(result.is_err());
        writer.call(put("after")).unwrap();
        drop(writer);
        threads.stop();
        assert_eq!(
            keys_written(&path),
            vec!["after".to_string(), "before".to_string()]
        );
    }
}
