//! `migrate`'s storage side: copying a SQLite file into PostgreSQL. The
//! tables in the order their rows can be inserted, each copied row for row
//! with one binary `COPY` in the target's transaction, the identity
//! sequences moved past the copied ids, the counts on both sides, and the
//! target's session (no timeouts for the copy, read-only for the dry run).
//! `ops/migrate.rs` keeps the command: the locks, the refusals, the order
//! of the steps and every line it prints.

use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{ToSql, Type};
use rusqlite::Connection;
use rusqlite::types::Value;

use super::Settings;
use crate::store::{StoreError, with_causes};

/// A table migrate copies, with its columns and their kinds: i integer,
/// t text, b blob.
pub struct Table {
    pub name: &'static str,
    columns: &'static [(&'static str, char)],
}

/// Each table in the order its rows can be inserted (referenced rows
/// first).
pub const TABLES: &[Table] = &[
    Table {
        name: "meta",
        columns: &[("key", 't'), ("value", 't')],
    },
    Table {
        name: "source_rules",
        columns: &[
            ("source", 't'),
            ("key_rule", 't'),
            ("hash_rule", 't'),
            ("updated_at", 'i'),
        ],
    },
    Table {
        name: "events",
        columns: &[
            ("source", 't'),
            ("event_id", 't'),
            ("type", 't'),
            ("state", 't'),
            ("received_at", 'i'),
            ("completed_at", 'i'),
            ("payload", 'b'),
            ("content_type", 't'),
            ("headers", 't'),
            ("payload_hash", 't'),
            ("verified_with", 'i'),
            ("signed_at", 'i'),
            ("erased_at", 'i'),
        ],
    },
    Table {
        name: "jobs",
        columns: &[
            ("id", 'i'),
            ("source", 't'),
            ("event_id", 't'),
            ("action", 't'),
            ("kind", 't'),
            ("status", 't'),
            ("n_attempts", 'i'),
            ("next_attempt_at", 'i'),
            ("lease_owner", 't'),
            ("lease_until", 'i'),
            ("last_error", 't'),
            ("created_at", 'i'),
            ("updated_at", 'i'),
            ("order_key", 't'),
            ("order_seq", 'i'),
            ("waiting", 't'),
            ("failing_since", 'i'),
            ("probe_failures", 'i'),
        ],
    },
    Table {
        name: "attempts",
        columns: &[
            ("job_id", 'i'),
            ("n", 'i'),
            ("started_at", 'i'),
            ("finished_at", 'i'),
            ("outcome", 't'),
            ("http_status", 'i'),
            ("error", 't'),
            ("error_kind", 't'),
            ("request_id", 't'),
            ("response_head", 't'),
            ("worker", 't'),
            ("note", 't'),
        ],
    },
    Table {
        name: "checks",
        columns: &[
            ("id", 'i'),
            ("job_id", 'i'),
            ("n", 'i'),
            ("asked_at", 'i'),
            ("finished_at", 'i'),
            ("answer", 't'),
            ("http_status", 'i'),
            ("error", 't'),
            ("worker", 't'),
        ],
    },
    Table {
        name: "deliveries",
        columns: &[
            ("id", 'i'),
            ("source", 't'),
            ("event_id", 't'),
            ("received_at", 'i'),
            ("outcome", 't'),
            ("remote", 't'),
            ("detail", 't'),
        ],
    },
    Table {
        name: "incidents",
        columns: &[
            ("id", 'i'),
            ("source", 't'),
            ("event_id", 't'),
            ("kind", 't'),
            ("created_at", 'i'),
            ("payload_hash", 't'),
            ("detail", 't'),
        ],
    },
    Table {
        name: "incident_payloads",
        columns: &[("incident_id", 'i'), ("payload", 'b')],
    },
    Table {
        name: "paused_actions",
        columns: &[("source", 't'), ("action", 't'), ("paused_at", 'i')],
    },
    Table {
        name: "replays",
        columns: &[
            ("id", 'i'),
            ("job_id", 'i'),
            ("replayed_at", 'i'),
            ("from_status", 't'),
            ("forced", 'i'),
            ("origin", 't'),
        ],
    },
    Table {
        name: "order_marks",
        columns: &[
            ("source", 't'),
            ("action", 't'),
            ("order_key", 't'),
            ("value", 't'),
        ],
    },
    Table {
        name: "rejected",
        columns: &[
            ("id", 'i'),
            ("source", 't'),
            ("received_at", 'i'),
            ("reason", 't'),
            ("remote", 't'),
            ("query", 't'),
            ("headers", 't'),
            ("body", 'b'),
            ("bytes", 'i'),
            ("stored", 'i'),
        ],
    },
    Table {
        name: "rejected_totals",
        columns: &[
            ("source", 't'),
            ("stored", 'i'),
            ("accepted", 'i'),
            ("duplicate", 'i'),
            ("failed", 'i'),
        ],
    },
    Table {
        name: "circuits",
        columns: &[
            ("source", 't'),
            ("action", 't'),
            ("failures", 'i'),
            ("opened_at", 'i'),
            ("next_probe_at", 'i'),
            ("probes", 'i'),
            ("opened_count", 'i'),
            ("probe_owner", 't'),
            ("probe_until", 'i'),
            ("updated_at", 'i'),
        ],
    },
    Table {
        name: "notifications",
        columns: &[
            ("id", 'i'),
            ("notify", 't'),
            ("condition", 't'),
            ("source", 't'),
            ("action", 't'),
            ("event_id", 't'),
            ("count", 'i'),
            ("summary", 't'),
            ("details", 't'),
            ("status", 't'),
            ("attempts", 'i'),
            ("due_at", 'i'),
            ("next_attempt_at", 'i'),
            ("last_error", 't'),
            ("created_at", 'i'),
            ("sent_at", 'i'),
        ],
    },
];

/// Tables whose ids come from an identity column: its sequence is moved
/// past the copied ids.
const IDENTITY: &[&str] = &[
    "jobs",
    "checks",
    "deliveries",
    "incidents",
    "replays",
    "rejected",
    "notifications",
];

/// meta rows that belong to one backend (SQLite's schema version; the
/// readiness probe's row).
const META_SKIPPED: &[&str] = &["schema_version", "ready_probe"];

/// What a session of migrate sets: no statement, lock or idle timeout.
const NO_TIMEOUTS: &str =
    "SET statement_timeout = 0; SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 0";

/// A table's rows on one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableCount {
    pub table: &'static str,
    pub rows: i64,
}

/// A table whose rows in the target are not the source's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub table: &'static str,
    pub copied: i64,
    pub expected: i64,
}

/// The rows of each of [`TABLES`] in the SQLite file, whose schema is up
/// to date (every table is there).
pub fn source_counts(sqlite: &Connection) -> Result<Vec<TableCount>, StoreError> {
    TABLES
        .iter()
        .map(|t| {
            Ok(TableCount {
                table: t.name,
                rows: count(sqlite, t.name)?,
            })
        })
        .collect()
}

/// [`source_counts`] read without changing anything: a table the file
/// does not have yet (an older schema, not migrated) counts 0.
pub fn present_counts(sqlite: &Connection) -> Result<Vec<TableCount>, StoreError> {
    TABLES
        .iter()
        .map(|t| {
            let present: bool = sqlite
                .query_row(
                    "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [t.name],
                    |r| r.get(0),
                )
                .map_err(with_causes)?;
            let rows = if present { count(sqlite, t.name)? } else { 0 };
            Ok(TableCount {
                table: t.name,
                rows,
            })
        })
        .collect()
}

/// The rows of one SQLite table.
fn count(sqlite: &Connection, table: &str) -> Result<i64, StoreError> {
    sqlite
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .map_err(with_causes)
}

/// A session on the PostgreSQL database migrate copies into.
pub struct Target {
    client: postgres::Client,
}

impl Target {
    /// Opens one connection, in idemhook's schema.
    pub fn connect(settings: &Settings) -> Result<Target, StoreError> {
        Ok(Target {
            client: settings.connect()?,
        })
    }

    /// Lifts the session's statement, lock and idle timeouts: the copy
    /// may take minutes, and waiting for the migration lock (an instance
    /// migrating) is right.
    pub fn without_timeouts(&mut self) -> Result<(), StoreError> {
        Ok(self.client.batch_execute(NO_TIMEOUTS)?)
    }

    /// Makes every transaction of the session read-only (the dry run).
    pub fn read_only(&mut self) -> Result<(), StoreError> {
        Ok(self
            .client
            .batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")?)
    }

    /// Applies PostgreSQL's migrations in `schema` ([`super::migrate`]).
    pub fn migrate(&mut self, schema: &str) -> Result<(), StoreError> {
        super::migrate(&mut self.client, schema)
    }

    /// Whether idemhook's tables are there yet.
    pub fn has_tables(&mut self) -> Result<bool, StoreError> {
        Ok(self
            .client
            .query_one("SELECT to_regclass('events') IS NOT NULL", &[])?
            .get(0))
    }

    /// The events the target holds (migrate copies into an empty one).
    pub fn events(&mut self) -> Result<i64, StoreError> {
        Ok(self
            .client
            .query_one("SELECT count(*) FROM events", &[])?
            .get(0))
    }

    /// Begins the one transaction the whole copy from `source` runs in.
    pub fn begin<'s>(&mut self, source: &'s Connection) -> Result<Copying<'_, 's>, StoreError> {
        Ok(Copying {
            tx: self.client.transaction()?,
            source,
        })
    }
}

/// The copy's transaction on the target, and the SQLite file it copies
/// from: nothing of it is seen until [`Copying::commit`]; dropped without
/// it, it is rolled back.
pub struct Copying<'c, 's> {
    tx: postgres::Transaction<'c>,
    source: &'s Connection,
}

impl Copying<'_, '_> {
    /// Copies one table row for row with one `COPY ... FROM STDIN BINARY`
    /// (a stream, not a round trip per row), less the meta rows of
    /// SQLite's alone.
    pub fn table(&mut self, table: &Table) -> Result<(), StoreError> {
        let Table { name, columns } = table;
        let names: Vec<&str> = columns.iter().map(|(n, _)| *n).collect();
        let types: Vec<Type> = columns
            .iter()
            .map(|(_, kind)| match kind {
                'i' => Type::INT8,
                'b' => Type::BYTEA,
                _ => Type::TEXT,
            })
            .collect();
        let sink = self.tx.copy_in(&format!(
            "COPY {name} ({}) FROM STDIN (FORMAT binary)",
            names.join(", ")
        ))?;
        let mut writer = BinaryCopyInWriter::new(sink, &types);
        let mut select = self
            .source
            .prepare(&format!("SELECT {} FROM {name}", names.join(", ")))
            .map_err(with_causes)?;
        let mut rows = select.query([]).map_err(with_causes)?;
        while let Some(row) = rows.next().map_err(with_causes)? {
            if *name == "meta" {
                let key: String = row.get(0).map_err(with_causes)?;
                if META_SKIPPED.contains(&key.as_str()) {
                    continue;
                }
            }
            let mut values: Vec<Box<dyn ToSql + Sync>> = Vec::with_capacity(columns.len());
            for (i, (column, kind)) in columns.iter().enumerate() {
                let v: Value = row.get(i).map_err(with_causes)?;
                values.push(match (kind, v) {
                    ('i', Value::Integer(n)) => Box::new(Some(n)),
                    ('i', Value::Null) => Box::new(None::<i64>),
                    ('t', Value::Text(s)) => Box::new(Some(s)),
                    ('t', Value::Null) => Box::new(None::<String>),
                    ('b', Value::Blob(b)) => Box::new(Some(b)),
                    ('b', Value::Text(s)) => Box::new(Some(s.into_bytes())),
                    ('b', Value::Null) => Box::new(None::<Vec<u8>>),
                    (_, other) => {
                        return Err(StoreError::other(format!(
                            "{name}.{column}: unexpected value {other:?}"
                        )));
                    }
                });
            }
            let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
            writer.write(&refs)?;
        }
        writer.finish()?;
        Ok(())
    }

    /// Sets each identity column's sequence past the copied ids, so new
    /// rows get new ones.
    pub fn move_sequences(&mut self) -> Result<(), StoreError> {
        for table in IDENTITY {
            self.tx.execute(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{table}', 'id'), coalesce(max(id), 0) + 1, false) FROM {table}"
                ),
                &[],
            )?;
        }
        Ok(())
    }

    /// Each table's rows in the target against the source's `counts`
    /// (less the SQLite-only `meta` rows): the first table that differs,
    /// or None when every one matches.
    pub fn mismatch(&mut self, counts: &[TableCount]) -> Result<Option<Mismatch>, StoreError> {
        for &TableCount { table, rows } in counts {
            let skipped = if table == "meta" {
                self.source
                    .query_row(
                        "SELECT count(*) FROM meta WHERE key IN ('schema_version', 'ready_probe')",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                    .map_err(with_causes)?
            } else {
                0
            };
            let copied: i64 = self
                .tx
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])?
                .get(0);
            if copied != rows - skipped {
                return Ok(Some(Mismatch {
                    table,
                    copied,
                    expected: rows - skipped,
                }));
            }
        }
        Ok(None)
    }

    /// Commits the copy.
    pub fn commit(self) -> Result<(), StoreError> {
        Ok(self.tx.commit()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message is what anyhow's `{:#}` printed for the same error when
    /// `ops/migrate.rs` ran the statement itself: SQLite's words, then its
    /// code's.
    #[test]
    fn a_sqlite_error_reads_as_its_chain_did() {
        let conn = Connection::open_in_memory().unwrap();
        let fail = || {
            conn.query_row("SELECT count(*) FROM nope", [], |r| r.get::<_, i64>(0))
                .unwrap_err()
        };
        let chained = format!("{:#}", anyhow::Error::new(fail()));
        let e = with_causes(fail());
        assert_eq!(e.message, chained);
        assert!(
            e.message.starts_with("no such table: nope: "),
            "{}",
            e.message
        );
    }
}
