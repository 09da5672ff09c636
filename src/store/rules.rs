//! The key and hash rule recorded per source (`source_rules`), on either
//! backend: what `serve` compares the config with at start (a changed
//! rule for a source with events is warned about), and what `check`
//! reports.

use crate::store::StoreError;
use crate::store::db::{Db, Dialect};

/// `source`'s recorded key rule and hash rule, and whether it has events;
/// None when nothing is recorded for it.
pub fn recorded(db: &Db<'_>, source: &str) -> Result<Option<(String, String, bool)>, StoreError> {
    let row = db.query_opt(
        "SELECT key_rule, hash_rule, EXISTS (SELECT 1 FROM events WHERE source = ?1)
         FROM source_rules WHERE source = ?1",
        &[source.into()],
    )?;
    row.map(|r| Ok((r.string(0)?, r.string(1)?, r.bool(2)?)))
        .transpose()
}

/// Records `source`'s key and hash rule (another instance starting at the
/// same time writes the same row: the last one stays).
pub fn record(
    db: &Db<'_>,
    source: &str,
    key_rule: &str,
    hash_rule: &str,
    now: i64,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO source_rules (source, key_rule, hash_rule, updated_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (source) DO UPDATE SET key_rule = excluded.key_rule,
             hash_rule = excluded.hash_rule, updated_at = excluded.updated_at",
        &[source.into(), key_rule.into(), hash_rule.into(), now.into()],
    )?;
    Ok(())
}

/// (source, recorded key rule, recorded hash rule, events of the source).
pub type RecordedRule = (String, String, String, i64);

/// What `check` reports of a database, read without changing it: None
/// when it holds no idemhook tables yet, else the events stored and each
/// recorded source's rules.
pub fn report(db: &Db<'_>) -> Result<Option<(i64, Vec<RecordedRule>)>, StoreError> {
    let present = match db.dialect() {
        Dialect::Sqlite => {
            "SELECT count(*) = 2 FROM sqlite_master
             WHERE type = 'table' AND name IN ('events', 'source_rules')"
        }
        Dialect::Postgres => {
            "SELECT to_regclass('events') IS NOT NULL AND to_regclass('source_rules') IS NOT NULL"
        }
    };
    if !db.query_one(present, &[])?.bool(0)? {
        return Ok(None);
    }
    let events = db.query_one("SELECT count(*) FROM events", &[])?.i64(0)?;
    let rules = db
        .query(
            "SELECT r.source, r.key_rule, r.hash_rule,
                    (SELECT count(*) FROM events e WHERE e.source = r.source)
             FROM source_rules r ORDER BY r.source",
            &[],
        )?
        .iter()
        .map(|r| Ok((r.string(0)?, r.string(1)?, r.string(2)?, r.i64(3)?)))
        .collect::<Result<_, StoreError>>()?;
    Ok(Some((events, rules)))
}
