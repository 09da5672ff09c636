//! The `meta` rows the service keeps besides the schema version: the
//! secrets providers hand over in a handshake (Asana's `X-Hook-Secret`,
//! Notion's verification token), one per source, on either backend; and
//! where `migrate` moved an SQLite installation, so serve refuses the file.

use crate::args;
use crate::store::StoreError;
use crate::store::db::Db;

/// The `meta` key a source's handed-over secret is kept under.
fn key(source: &str) -> String {
    format!("handshake_secret:{source}")
}

/// The secret handed over for `source`, if one was.
pub fn handed_over(db: &Db<'_>, source: &str) -> Result<Option<String>, StoreError> {
    db.query_opt(
        "SELECT value FROM meta WHERE key = ?1",
        args![key(source).as_str()],
    )?
    .map(|r| r.string(0))
    .transpose()
}

/// Keeps `secret` as the secret handed over for `source`.
pub fn keep_handed_over(db: &Db<'_>, source: &str, secret: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        args![key(source).as_str(), secret],
    )?;
    Ok(())
}

/// Every handed-over secret, as (source, secret), for `check`.
pub fn all_handed_over(db: &Db<'_>) -> Result<Vec<(String, String)>, StoreError> {
    db.query(
        "SELECT key, value FROM meta WHERE key LIKE 'handshake_secret:%' ORDER BY key",
        &[],
    )?
    .iter()
    .map(|r| {
        let k = r.string(0)?;
        let source = k
            .strip_prefix("handshake_secret:")
            .unwrap_or(&k)
            .to_string();
        Ok((source, r.string(1)?))
    })
    .collect()
}

/// The `meta` key of where `migrate` copied this SQLite installation.
const MOVED_TO: &str = "moved_to";

/// Where `migrate --yes` moved this database (its redacted URL), if it did.
pub fn moved_to(db: &Db<'_>) -> Result<Option<String>, StoreError> {
    db.query_opt("SELECT value FROM meta WHERE key = ?1", args![MOVED_TO])?
        .map(|r| r.string(0))
        .transpose()
}

/// Records that this database was moved to `url` (redacted).
pub fn record_moved(db: &Db<'_>, url: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        args![MOVED_TO, url],
    )?;
    Ok(())
}
