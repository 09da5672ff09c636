//! A worker's connection to PostgreSQL, each call one transaction.

use postgres::Client;

use crate::store::{StoreError, StoreErrorKind};

use super::{PgTx, Statements};

/// One connection of a worker: made when needed, made again after a
/// failure, each call one transaction (run again after a deadlock or a
/// serialization failure).
pub struct Session {
    settings: crate::store::pg::Settings,
    client: Option<Client>,
    statements: Statements,
}

impl Session {
    pub fn new(settings: crate::store::pg::Settings) -> Session {
        Session {
            settings,
            client: None,
            statements: Statements::default(),
        }
    }

    pub fn transaction<T>(
        &mut self,
        mut body: impl FnMut(&mut PgTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut attempt = 0;
        loop {
            if self.client.as_ref().is_none_or(Client::is_closed) {
                self.client = Some(self.settings.connect()?);
                self.statements = Statements::default();
            }
            let Some(client) = self.client.as_mut() else {
                return Err(StoreError::closed());
            };
            let result = client
                .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                .map_err(StoreError::from)
                .and_then(|()| body(&mut PgTx::new(client, &mut self.statements)))
                .and_then(|v| {
                    client.batch_execute("COMMIT").map_err(StoreError::from)?;
                    Ok(v)
                });
            match result {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK");
                    let retry = e.kind == StoreErrorKind::Busy
                        && (e.message.contains("(40P01)") || e.message.contains("(40001)"));
                    if retry && attempt < 4 {
                        attempt += 1;
                        std::thread::sleep(std::time::Duration::from_millis(fastrand::u64(1..20)));
                        continue;
                    }
                    if e.kind != StoreErrorKind::Other {
                        self.client = None;
                    }
                    return Err(e);
                }
            }
        }
    }
}
