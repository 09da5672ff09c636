//! Creating idemhook's schema, and when the role may not: an error that
//! names the statement to run (`GRANT CREATE ON DATABASE app TO idemhook;`),
//! for a role that may connect but not create schemas.

use postgres::error::SqlState;

use crate::store::{StoreError, StoreErrorKind};

/// `CREATE SCHEMA IF NOT EXISTS` for `schema` (a plain name, checked by
/// `config::database_url::valid_schema`). PostgreSQL checks the right to
/// create before whether the schema exists, so an existing schema is left
/// alone without asking for that right.
pub(super) fn create_schema(
    tx: &mut postgres::Transaction<'_>,
    schema: &str,
) -> Result<(), StoreError> {
    let row = tx.query_one(
        "SELECT current_database()::text, current_user::text,
                EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
        &[&schema],
    )?;
    let (database, role, exists): (String, String, bool) = (row.get(0), row.get(1), row.get(2));
    if exists {
        return Ok(());
    }
    match tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"")) {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Err(StoreError {
            kind: StoreErrorKind::Other,
            message: format!(
                "the role {role} may not create idemhook's schema {schema} in the database {database} (42501): as the database's owner or a superuser, run GRANT CREATE ON DATABASE {} TO {}; (or create the schema for it: CREATE SCHEMA {schema} AUTHORIZATION {};)",
                ident(&database),
                ident(&role),
                ident(&role),
            ),
        }),
        Err(e) => Err(e.into()),
    }
}

/// `name` as an SQL identifier: bare when plain, else double-quoted.
fn ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_quoted_when_not_plain() {
        assert_eq!(super::ident("app"), "app");
        assert_eq!(super::ident("My-App"), "\"My-App\"");
        assert_eq!(super::ident("a\"b"), "\"a\"\"b\"");
    }
}
