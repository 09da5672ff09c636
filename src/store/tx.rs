//! The seam between the claim's decisions (`ingest.rs`: who owns an event,
//! which actions run, the event's state) and a backend's SQL. [`Tx`] is
//! one open transaction of a backend; each method is one storage step and
//! holds that backend's SQL. The claim is generic over it, so each backend
//! gets its own compiled claim: no dynamic dispatch and no allocation per
//! step on the hot path.

use super::StoreError;

/// A new event row, as the claim inserts it.
pub struct NewEvent<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub event_type: Option<&'a str>,
    pub state: &'a str,
    pub received_at: i64,
    pub completed_at: Option<i64>,
    pub payload: &'a [u8],
    pub content_type: Option<&'a str>,
    pub headers: &'a str,
    pub payload_hash: &'a str,
    pub verified_with: Option<i64>,
    pub signed_at: Option<i64>,
}

/// A new job row.
pub struct NewJob<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub action: &'a str,
    pub kind: &'a str,
    pub status: &'a str,
    pub n_attempts: i64,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<&'a str>,
    pub created_at: i64,
}

/// An event's jobs, counted for its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobTallies {
    pub failed: i64,
    /// Pending, processing or paused.
    pub open: i64,
    /// Processing, or with an attempt.
    pub started: i64,
}

/// A value bound to an SQL action's `:name` parameter, before a backend
/// turns it into its own type.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Null,
    Bool(bool),
    Integer(i64),
    /// Any other JSON number, as written (digits kept: serde_json is built
    /// with arbitrary_precision). SQLite stores it as a REAL, PostgreSQL
    /// as the parameter's type (numeric exactly).
    Number(String),
    Text(String),
    /// A JSON object or array, as compact JSON text.
    Json(String),
}

/// Why an SQL action failed: its own statement (the action's bug, recorded
/// on its job) or storage (the whole claim fails and is answered 503).
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{0}")]
    Statement(String),
    #[error("{0}")]
    Store(StoreError),
}

impl From<StoreError> for ActionError {
    fn from(e: StoreError) -> ActionError {
        ActionError::Store(e)
    }
}

/// One open transaction of a backend: the storage steps of a claim.
pub trait Tx {
    /// Inserts the event unless its (source, event_id) is stored; true
    /// when this call inserted it (the claim is won). Never reads first.
    fn insert_event(&mut self, e: &NewEvent<'_>) -> Result<bool, StoreError>;

    /// The stored event's state and payload hash.
    fn event_state_and_hash(
        &mut self,
        source: &str,
        event_id: &str,
    ) -> Result<(String, String), StoreError>;

    /// Records a payload mismatch incident, with the body that did not
    /// match.
    #[allow(clippy::too_many_arguments)]
    fn insert_mismatch(
        &mut self,
        source: &str,
        event_id: &str,
        created_at: i64,
        payload_hash: &str,
        detail: &str,
        payload: &[u8],
    ) -> Result<(), StoreError>;

    /// Records one delivery.
    #[allow(clippy::too_many_arguments)]
    fn insert_delivery(
        &mut self,
        source: &str,
        event_id: Option<&str>,
        received_at: i64,
        outcome: &str,
        remote: &str,
        detail: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Inserts a job and returns its id.
    fn insert_job(&mut self, j: &NewJob<'_>) -> Result<i64, StoreError>;

    /// Records an SQL action's one attempt.
    fn insert_sql_attempt(
        &mut self,
        job_id: i64,
        started_at: i64,
        finished_at: i64,
        outcome: &str,
        error: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Whether an operator paused this action.
    fn is_paused(&mut self, source: &str, action: &str) -> Result<bool, StoreError>;

    /// The event's jobs, counted by what decides its state.
    fn job_tallies(&mut self, source: &str, event_id: &str) -> Result<JobTallies, StoreError>;

    /// Sets the event's state (and completed_at when it becomes completed,
    /// cleared otherwise), unless it is that state already.
    fn set_event_state(
        &mut self,
        source: &str,
        event_id: &str,
        state: &str,
        now: i64,
    ) -> Result<(), StoreError>;

    /// Runs `body` inside a savepoint: released on Ok, rolled back on Err,
    /// so a failure undoes only what `body` did.
    fn in_savepoint<T, E: From<StoreError>>(
        &mut self,
        name: &'static str,
        body: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E>;

    /// Runs an SQL action's statement, each `:name` parameter bound to
    /// `value_of(name)` (None: an unknown parameter, a statement error).
    fn execute_action(
        &mut self,
        sql: &str,
        value_of: impl FnMut(&str) -> Option<ParamValue>,
    ) -> Result<(), ActionError>;
}
