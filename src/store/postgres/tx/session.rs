//! A worker's connection to PostgreSQL, each call one transaction.

use postgres::Client;

use crate::store::postgres::is_retryable_store;
use crate::store::{StoreError, StoreErrorKind};

use super::{PgTx, Statements};

/// One connection of a worker: made when needed, made again after a
/// failure, each call one transaction (run again after a deadlock or a
/// serialization failure).
pub struct Session {
    settings: crate::store::postgres::Settings,
    client: Option<Client>,
    statements: Statements,
}

/// How a worker's transaction starts.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

impl Session {
    pub fn new(settings: crate::store::postgres::Settings) -> Session {
        Session {
            settings,
            client: None,
            statements: Statements::default(),
        }
    }

    /// Runs `body` in one READ COMMITTED transaction, connecting first
    /// when there is no live connection; run again after a deadlock or a
    /// serialization failure (`store::postgres::retrying`). A connection that
    /// died while idle (a restart, a failover) fails at its BEGIN, before
    /// anything was sent: the transaction is run on a fresh one at once,
    /// so a worker does not report an outage that is over. Any other
    /// failure but a plain SQL error drops the connection: the next call
    /// makes a new one.
    pub fn transaction<T>(
        &mut self,
        mut body: impl FnMut(&mut PgTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let result = crate::store::postgres::retrying(
            4,
            crate::store::postgres::short_pause,
            is_retryable_store,
            || {
                let mut reused = true;
                if self.client.as_ref().is_none_or(Client::is_closed) {
                    self.client = Some(self.settings.connect()?);
                    self.statements = Statements::default();
                    reused = false;
                }
                let Some(mut client) = self.client.as_mut() else {
                    return Err(StoreError::closed());
                };
                let mut begun = client.batch_execute(BEGIN);
                if begun.is_err() && reused {
                    self.client = Some(self.settings.connect()?);
                    self.statements = Statements::default();
                    let Some(fresh) = self.client.as_mut() else {
                        return Err(StoreError::closed());
                    };
                    client = fresh;
                    begun = client.batch_execute(BEGIN);
                }
                let result = begun
                    .map_err(StoreError::from)
                    .and_then(|()| body(&mut PgTx::new(client, &mut self.statements)))
                    .and_then(|v| {
                        client.batch_execute("COMMIT").map_err(StoreError::from)?;
                        Ok(v)
                    });
                if result.is_err() {
                    let _ = client.batch_execute("ROLLBACK");
                }
                result
            },
        );
        if let Err(e) = &result
            && e.kind != StoreErrorKind::Other
        {
            self.client = None;
        }
        result
    }
}
