//! The stored vocabulary: every word the database keeps for a state or an
//! outcome (a job's status and kind, an event's state, an attempt's
//! outcome, a delivery's outcome, a replay's result, a check's answer) as
//! an enum. Code compares the enums; the words appear only at the edges,
//! through `as_str()` (SQL parameters, JSON, metrics labels, log fields)
//! and `FromStr` (a stored word read back, with [`UnknownWord`] for a word
//! this build does not know).
//!
//! The words are the contract's: changing one changes the database, the
//! JSON and the metrics at once. This module does no IO and depends on
//! nothing else in the crate.

use std::fmt;
use std::str::FromStr;

/// A stored word that is not in its vocabulary (a newer build's word, or
/// a row written by hand).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {word:?}")]
pub struct UnknownWord {
    /// Which vocabulary: "job status", "event state", ...
    pub what: &'static str,
    pub word: String,
}

/// Counts the variants of a vocabulary, for its `ALL` array.
macro_rules! count {
    () => { 0 };
    ($head:ident $($tail:ident)*) => { 1 + count!($($tail)*) };
}

/// One vocabulary: the enum, `ALL` in contract order, `as_str`, `FromStr`,
/// `Display` and `Serialize` (as the word); `store::db` binds them to SQL.
macro_rules! vocabulary {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $($(#[$vmeta:meta])* $variant:ident = $word:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in contract order.
            pub const ALL: [$name; count!($($variant)+)] = [$($name::$variant,)+];

            /// The stored word.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }
        }

        impl FromStr for $name {
            type Err = UnknownWord;

            fn from_str(word: &str) -> Result<$name, UnknownWord> {
                match word {
                    $($word => Ok($name::$variant),)+
                    _ => Err(UnknownWord {
                        what: $what,
                        word: word.to_string(),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

vocabulary! {
    /// A job's `status` (the `idemhook_jobs{status}` gauge's label too).
    pub enum JobStatus ("job status") {
        /// Waiting for a forward worker (at `next_attempt_at`).
        Pending = "pending",
        /// Leased by a forward worker until `lease_until`.
        Processing = "processing",
        /// The effect happened (or the downstream confirmed it).
        Done = "done",
        /// Failed for good: a dead letter, until an operator replays it.
        Failed = "failed",
        /// Waiting while its action is paused.
        Paused = "paused",
        /// Not sent: a later update of its order key was delivered first
        /// (`supersede`). Finished, like done.
        Superseded = "superseded",
    }
}

/// The one list of "open" job statuses (not finished, not failed) as SQL:
/// `status IN (open_job_statuses_sql!())`. A macro so it can join SQL
/// literals with `concat!`; [`JobStatus::OPEN`] holds the same set.
macro_rules! open_job_statuses_sql {
    () => {
        "'pending', 'processing', 'paused'"
    };
}
pub(crate) use open_job_statuses_sql;

impl JobStatus {
    /// The statuses of a job that may still run: its event is not over.
    pub const OPEN: [JobStatus; 3] = [JobStatus::Pending, JobStatus::Processing, JobStatus::Paused];

    /// [`JobStatus::OPEN`] as an SQL list, for `status IN (...)`.
    pub const OPEN_SQL: &'static str = open_job_statuses_sql!();

    /// Pending, processing or paused: the job may still run.
    pub const fn is_open(self) -> bool {
        matches!(
            self,
            JobStatus::Pending | JobStatus::Processing | JobStatus::Paused
        )
    }
}

vocabulary! {
    /// A job's `kind`: what its action does.
    pub enum JobKind ("job kind") {
        /// An SQL statement, run inside the claim.
        Sql = "sql",
        /// A POST to a downstream, through the outbox.
        Forward = "forward",
    }
}

vocabulary! {
    /// An event's `state`. It moves forward only: accepted -> processing
    /// -> completed | failed.
    pub enum EventState ("event state") {
        /// Stored; no attempt has started.
        Accepted = "accepted",
        /// An attempt of one of its jobs has started.
        Processing = "processing",
        /// Every job is done (or it had none).
        Completed = "completed",
        /// One of its jobs failed for good.
        Failed = "failed",
    }
}

vocabulary! {
    /// The outcome of one attempt of an action, in contract order (the
    /// `idemhook_action_attempts_total{outcome}` label too).
    pub enum AttemptOutcome ("attempt outcome") {
        Ok = "ok",
        Retry = "retry",
        Failed = "failed",
    }
}

vocabulary! {
    /// The outcome of one delivery, in contract order: the
    /// `idemhook_deliveries_total{outcome}` label and `deliveries.outcome`.
    pub enum Delivery ("delivery outcome") {
        Accepted = "accepted",
        Duplicate = "duplicate",
        Mismatch = "mismatch",
        BadSignature = "bad_signature",
        BadRequest = "bad_request",
        UnknownSource = "unknown_source",
        TooLarge = "too_large",
        Unavailable = "unavailable",
        /// A kept refused request taken in by `reingest` (its event new or
        /// a duplicate).
        Reingested = "reingested",
        /// An event the provider's API listed and `catchup` claimed.
        Catchup = "catchup",
    }
}

vocabulary! {
    /// What an operator's replay did to one planned job.
    pub enum ReplayResult ("replay result") {
        /// A forward job, queued again for the workers.
        Requeued = "requeued",
        /// An SQL job, run again now: it succeeded.
        Ok = "ok",
        /// An SQL job, run again now: it failed.
        Failed = "failed",
        /// Left alone: the job moved on (or went) since the plan.
        Skipped = "skipped",
    }
}

vocabulary! {
    /// A downstream's answer to a forward action's `check` URL (the
    /// `idemhook_downstream_checks_total{answer}` label).
    pub enum Answer ("check answer") {
        /// 200: the effect exists.
        Found = "found",
        /// 404: it does not.
        NotFound = "not_found",
        /// Anything else, or no answer: nothing is decided.
        Error = "error",
    }
}

impl Answer {
    /// 200 is found and 404 not found; any other status (a 204 or a
    /// redirect too) decides nothing.
    pub fn of_status(status: u16) -> Answer {
        match status {
            200 => Answer::Found,
            404 => Answer::NotFound,
            _ => Answer::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T>(all: &[T])
    where
        T: Copy + PartialEq + fmt::Debug + fmt::Display + FromStr<Err = UnknownWord>,
    {
        for v in all {
            assert_eq!(v.to_string().parse::<T>(), Ok(*v));
        }
        let e = "no such word".parse::<T>().unwrap_err();
        assert_eq!(e.word, "no such word");
    }

    #[test]
    fn every_word_parses_back() {
        round_trip(&JobStatus::ALL);
        round_trip(&JobKind::ALL);
        round_trip(&EventState::ALL);
        round_trip(&AttemptOutcome::ALL);
        round_trip(&Delivery::ALL);
        round_trip(&ReplayResult::ALL);
        round_trip(&Answer::ALL);
    }

    #[test]
    fn the_open_statuses_are_one_set() {
        let open: Vec<JobStatus> = JobStatus::ALL.into_iter().filter(|s| s.is_open()).collect();
        assert_eq!(open, JobStatus::OPEN);
        let sql: Vec<String> = JobStatus::OPEN
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        assert_eq!(JobStatus::OPEN_SQL, sql.join(", "));
    }

    #[test]
    fn unknown_words_say_what_they_are() {
        let e = "lost".parse::<JobStatus>().unwrap_err();
        assert_eq!(e.to_string(), "unknown job status \"lost\"");
    }

    #[test]
    fn the_words_serialize_as_json_strings() {
        let v = serde_json::to_value([EventState::Completed]).unwrap();
        assert_eq!(v, serde_json::json!(["completed"]));
    }
}
