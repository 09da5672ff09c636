//! The writer thread: it takes every operation waiting in its queue into
//! one group, runs them in one `BEGIN IMMEDIATE` transaction, commits once
//! and only then releases the group's callers; the answer thread runs the
//! group's continuations.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver};
use std::time::Instant;

use rusqlite::Connection;

use super::checkpoint::{Kick, bound_wal, wants_checkpoint};
use super::file_watch::{FileWatch, after_failed_sync, is_failed_sync, note_failed_sync};
use super::{AfterCommit, Answers, Guard, MAX_GROUP, Msg, Op, Shared, Waits};
use crate::store::StoreError;
use crate::time::now_ms;

pub(super) fn run(
    conn: Connection,
    mut watch: FileWatch,
    rx: Receiver<Msg>,
    shared: Arc<Shared>,
    kick: Arc<Kick>,
    answers: mpsc::Sender<Answers>,
) {
    let mut group = Group::default();
    let mut stopping = false;
    let mut last_restart = None;
    while !stopping {
        match rx.recv() {
            Ok(msg) => stopping = group.add(msg, &shared),
            Err(_) => break,
        }
        while !stopping && group.ops.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(msg) => stopping = group.add(msg, &shared),
                Err(_) => break,
            }
        }
        // No caller waits on this group, only records (a forward job's
        // completion, a refused delivery): let others join it for a moment
        // rather than pay a commit for each. A caller that waits ends the
        // moment, so claims never wait for it.
        let deadline = Instant::now() + shared.linger;
        while !stopping && !group.waited && group.ops.len() < MAX_GROUP {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(msg) => stopping = group.add(msg, &shared),
                Err(_) => break,
            }
        }
        if !group.ops.is_empty() {
            commit_group(&conn, &mut watch, &mut group.ops, &shared, &answers);
        }
        group.waited = false;
        if wants_checkpoint(&shared) {
            kick.notify();
        }
        bound_wal(&conn, &shared, &mut last_restart);
    }
    // Drain what was queued before the stop so no caller waits forever.
    while let Ok(msg) = rx.try_recv() {
        group.add(msg, &shared);
        if group.ops.len() >= MAX_GROUP {
            commit_group(&conn, &mut watch, &mut group.ops, &shared, &answers);
        }
    }
    if !group.ops.is_empty() {
        commit_group(&conn, &mut watch, &mut group.ops, &shared, &answers);
    }
}

/// The operations gathered for the next commit.
pub(super) struct Group {
    ops: Vec<(Op, Guard, Waits)>,
    /// Whether anyone (a caller or a continuation) waits for this group.
    pub(super) waited: bool,
}

impl Default for Group {
    fn default() -> Group {
        Group {
            ops: Vec::with_capacity(MAX_GROUP),
            waited: false,
        }
    }
}

impl Group {
    /// Adds an operation; true when the message asks the writer to stop.
    fn add(&mut self, msg: Msg, shared: &Shared) -> bool {
        match msg {
            Msg::Op(op, waits, guard) => {
                shared.queued.fetch_sub(1, Ordering::Relaxed);
                self.ops.push((op, guard, waits));
                self.waited |= waits != Waits::No;
                false
            }
            Msg::Stop => true,
        }
    }
}

fn commit_group(
    conn: &Connection,
    watch: &mut FileWatch,
    group: &mut Vec<(Op, Guard, Waits)>,
    shared: &Shared,
    answers: &mpsc::Sender<Answers>,
) {
    let n = group.len() as u64;
    let (result, dones) = run_transaction(conn, group);
    // Committed to a file no longer at its path: as good as lost, so no
    // caller hears it succeeded.
    let result = result.and_then(|()| watch.check());
    note_commit(shared, &result, n);
    release(dones, result, answers);
}

/// Runs the group in one `BEGIN IMMEDIATE` transaction and commits it (or
/// rolls it back): the commit's result, and each op's continuation.
fn run_transaction(
    conn: &Connection,
    group: &mut Vec<(Op, Guard, Waits)>,
) -> (Result<(), StoreError>, Vec<(AfterCommit, Waits)>) {
    let begin = after_failed_sync().and_then(|()| {
        conn.prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .map_err(StoreError::from)
    });
    match begin {
        Err(err) => {
            // The ops do not run; they are told why.
            let dones: Vec<(AfterCommit, Waits)> = group
                .drain(..)
                .map(|(op, _, waits)| (op(Err(&err)).0, waits))
                .collect();
            (Err(err), dones)
        }
        Ok(_) => {
            let mut dones: Vec<(AfterCommit, Waits)> = Vec::with_capacity(group.len());
            let lost = StoreError::other("the group transaction was rolled back by SQLite");
            let (lost_transaction, poisoned) = run_ops(conn, group, &lost, &mut dones);
            let commit = if lost_transaction {
                Err(lost)
            } else if let Some(e) = poisoned {
                Err(e)
            } else {
                conn.prepare_cached("COMMIT")
                    .and_then(|mut s| s.execute([]))
                    .map(|_| ())
                    .map_err(|e| {
                        if is_failed_sync(&e) {
                            note_failed_sync("a commit");
                        }
                        StoreError::from(e)
                    })
            };
            if commit.is_err() && !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            (commit, dones)
        }
    }
}

/// Runs each op inside the open transaction, pushing its continuation.
/// Returns whether SQLite lost the transaction, and the error that
/// poisoned it (an op without a savepoint failed or panicked), if any.
fn run_ops(
    conn: &Connection,
    group: &mut Vec<(Op, Guard, Waits)>,
    lost: &StoreError,
    dones: &mut Vec<(AfterCommit, Waits)>,
) -> (bool, Option<StoreError>) {
    let mut lost_transaction = false;
    // Set when an op without a savepoint failed: the transaction
    // holds its partial writes and must be rolled back whole.
    let mut poisoned: Option<StoreError> = None;
    for (op, guard, waits) in group.drain(..) {
        // If SQLite rolled the whole transaction back (disk full, I/O
        // error), later ops would run in autocommit mode and commit
        // on their own: stop running them.
        lost_transaction = lost_transaction || conn.is_autocommit();
        if lost_transaction || poisoned.is_some() {
            dones.push((op(Err(poisoned.as_ref().unwrap_or(lost))).0, waits));
            continue;
        }
        // A panic in an operation (a bug) must not take the writer
        // down, nor leave its half-done writes in the group: roll
        // back to its savepoint (or, without one, the whole group);
        // its caller sees the writer's reply channel close and
        // answers 503.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(Ok(conn)))) {
            Ok((done, poison)) => {
                dones.push((done, waits));
                poisoned = poison;
            }
            Err(_) => {
                crate::log::error("storage operation panicked", &[("effect", &"rolled back")]);
                match guard {
                    Guard::Savepoint => {
                        let _ = conn.execute_batch("ROLLBACK TO op; RELEASE op");
                    }
                    Guard::Group => {
                        poisoned = Some(StoreError::other(
                            "an operation panicked; its group was rolled back",
                        ));
                    }
                }
            }
        }
    }
    (lost_transaction, poisoned)
}

/// The gauges, before any caller is released, so a released caller
/// already sees this commit in them.
fn note_commit(shared: &Shared, result: &Result<(), StoreError>, n: u64) {
    shared.healthy.store(result.is_ok(), Ordering::Relaxed);
    shared.last_commit_at.store(now_ms(), Ordering::Relaxed);
    match result {
        Ok(()) => {
            shared.commits.fetch_add(1, Ordering::Relaxed);
            shared.grouped_ops.fetch_add(n, Ordering::Relaxed);
        }
        Err(e) => {
            crate::log::warn("storage", &[("error", &e.message)]);
            if let Ok(mut last) = shared.last_failure.lock() {
                *last = Some((now_ms(), e.clone()));
            }
        }
    }
}

/// Continuations go to the answer thread in one message; blocked callers
/// are woken here.
fn release(
    dones: Vec<(AfterCommit, Waits)>,
    result: Result<(), StoreError>,
    answers: &mpsc::Sender<Answers>,
) {
    let (later, now): (Vec<_>, Vec<_>) = dones.into_iter().partition(|(_, w)| *w == Waits::Answer);
    if !later.is_empty() {
        let later = later.into_iter().map(|(done, _)| done).collect();
        // If the answer thread is gone, the continuations are dropped
        // uncalled, which their owners treat as a failure.
        let _ = answers.send((later, result.clone()));
    }
    for (done, _) in now {
        done(result.clone());
    }
}

/// The answer thread: runs each group's continuations, in commit order.
pub(super) fn answer_loop(answers: &Receiver<Answers>) {
    while let Ok((dones, result)) = answers.recv() {
        for done in dones {
            let result = result.clone();
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(result))).is_err() {
                crate::log::error(
                    "a continuation panicked",
                    &[("effect", &"its answer, if it held one, is a 500")],
                );
            }
        }
    }
}
