//! What the `database` setting names, decided once: a SQLite file (a path,
//! or `sqlite:PATH`) or a PostgreSQL URL (`postgres://`, `postgresql://`).
//! Any other scheme is refused here, so no caller ever guesses. A PostgreSQL
//! URL keeps its password out of every `Display` and `Debug`: logs, `check`
//! and error messages print it as `[REDACTED]`.
//!
//! Owns the parsing and the redaction; does not open anything.

use std::fmt;
use std::path::{Path, PathBuf};

/// The backend and where it lives, from the `database` setting.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A SQLite file, already anchored at the config file's folder.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL.
    Postgres(PostgresUrl),
}

/// A `postgres://` or `postgresql://` URL. The full text (with any
/// password) is only reachable through [`PostgresUrl::expose`], for the
/// connection itself.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    url: String,
    /// The schema that holds idemhook's own tables (`pg_schema`).
    schema: String,
}

/// idemhook's schema when `pg_schema` is not set.
pub const DEFAULT_SCHEMA: &str = "idemhook";

impl PostgresUrl {
    /// The schema of idemhook's tables.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The same URL with idemhook's tables in `schema`.
    pub fn with_schema(mut self, schema: &str) -> PostgresUrl {
        self.schema = schema.to_string();
        self
    }

    /// The URL as written, password included: for the driver only.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The URL with any password (in the user info or a `password=` query
    /// parameter) replaced by `[REDACTED]`.
    pub fn redacted(&self) -> String {
        redact(&self.url)
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgresUrl({})", self.redacted())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseUrl::Sqlite(path) => write!(f, "{}", path.display()),
            DatabaseUrl::Postgres(url) => write!(f, "{url}"),
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseUrl::Sqlite(path) => write!(f, "Sqlite({})", path.display()),
            DatabaseUrl::Postgres(url) => write!(f, "Postgres({})", url.redacted()),
        }
    }
}

impl DatabaseUrl {
    /// Parses the `database` value (after any `env:` lookup). Relative
    /// SQLite paths are joined to `base`. The error text never contains a
    /// password and does not name the key (the caller does).
    pub fn parse(value: &str, base: &Path) -> Result<DatabaseUrl, String> {
        if value.is_empty() {
            return Err("is empty: write a file path or a postgres:// URL".to_string());
        }
        if libpq_keywords(value) {
            // Taken as a file name it would create `host=db ... password=...`
            // beside the config; its text is never echoed (it holds the
            // password).
            return Err("looks like a libpq keyword string (host=... dbname=...): write it as a URL instead, postgres://USER:PASSWORD@HOST:PORT/DBNAME?sslmode=require (percent-encode special characters in the password)".to_string());
        }
        if let Some(path) = value.strip_prefix("sqlite:") {
            // `sqlite://PATH` reads as a URL to some; accept it as the path.
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err("sqlite: needs a path after it (sqlite:data/idemhook.db)".to_string());
            }
            return Ok(DatabaseUrl::Sqlite(base.join(path)));
        }
        match scheme(value) {
            Some(s)
                if s.eq_ignore_ascii_case("postgres") || s.eq_ignore_ascii_case("postgresql") =>
            {
                let rest = &value[s.len() + 1..];
                if !rest.starts_with("//") {
                    return Err(format!(
                        "{}: a PostgreSQL URL starts with postgres:// (postgres://user@host:5432/dbname)",
                        redact(value)
                    ));
                }
                Ok(DatabaseUrl::Postgres(PostgresUrl {
                    url: value.to_string(),
                    schema: DEFAULT_SCHEMA.to_string(),
                }))
            }
            Some(s) => Err(format!(
                "unknown scheme {s:?} in {:?}: use a file path (or sqlite:PATH) for SQLite, or a postgres:// or postgresql:// URL (a file whose name has a colon: write ./NAME)",
                redact(value)
            )),
            // `postgres//u:pw@db/app` is a mistyped URL, not a file to create.
            None if value
                .get(..8)
                .is_some_and(|p| p.eq_ignore_ascii_case("postgres"))
                && value.contains('@') =>
            {
                Err(format!(
                    "{}: a PostgreSQL URL starts with postgres:// (postgres://user@host:5432/dbname)",
                    redact(value)
                ))
            }
            None => Ok(DatabaseUrl::Sqlite(base.join(value))),
        }
    }

    /// The SQLite file, when that is the backend.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            DatabaseUrl::Sqlite(path) => Some(path),
            DatabaseUrl::Postgres(_) => None,
        }
    }
}

/// Whether `value` is libpq's keyword form (`host=db port=5432 ...`): its
/// first word is `KEYWORD=` for one of libpq's connection keywords.
fn libpq_keywords(value: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "service",
        "connect_timeout",
        "application_name",
        "options",
        "target_session_attrs",
        "require_auth",
        "channel_binding",
    ];
    let first = value.split_whitespace().next().unwrap_or_default();
    first
        .split_once('=')
        .is_some_and(|(k, _)| KEYWORDS.iter().any(|w| k.trim().eq_ignore_ascii_case(w)))
}

/// `pg_schema`: a plain identifier (lower-case letters, digits, `_`, not
/// starting with a digit or `pg_`), so it never needs quoting and cannot
/// be one of PostgreSQL's own.
pub fn valid_schema(name: &str) -> Result<(), String> {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let first = name.chars().next();
    if name.is_empty() || name.len() > 63 || !plain || first.is_some_and(|c| c.is_ascii_digit()) {
        return Err(format!(
            "pg_schema: {name:?} is not a plain name (lower-case letters, digits and _, at most 63, not starting with a digit)"
        ));
    }
    if name.starts_with("pg_") || name == "public" || name == "information_schema" {
        return Err(format!(
            "pg_schema: {name:?} is PostgreSQL's or the team's; idemhook's tables need a schema of their own"
        ));
    }
    Ok(())
}

/// The URL scheme of `value`, when it starts with one: letters, digits,
/// `+`, `-`, `.` after a first letter, then a colon. A single letter is
/// not taken for a scheme.
fn scheme(value: &str) -> Option<&str> {
    let colon = value.find(':')?;
    let s = &value[..colon];
    let mut chars = s.chars();
    let first = chars.next()?;
    (s.len() >= 2
        && first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(s)
}

/// Replaces the password of a URL's user info, and the value of every
/// `password=` parameter, with `[REDACTED]`.
pub(crate) fn redact(url: &str) -> String {
    const MARK: &str = "[REDACTED]";
    let mut out = String::with_capacity(url.len());
    let (head, query) = match url.find('?') {
        Some(q) => (&url[..q], Some(&url[q + 1..])),
        None => (url, None),
    };
    match head.find("://") {
        Some(start) => {
            let authority_start = start + 3;
            let after = &head[authority_start..];
            let authority_end = after.find('/').unwrap_or(after.len());
            let authority = &after[..authority_end];
            out.push_str(&head[..authority_start]);
            // The last '@' ends the user info (a password may hold an '@'
            // only percent-encoded, but be safe with a raw one too).
            match authority.rfind('@') {
                Some(at) => {
                    let userinfo = &authority[..at];
                    match userinfo.find(':') {
                        Some(c) => {
                            out.push_str(&userinfo[..c]);
                            out.push(':');
                            out.push_str(MARK);
                        }
                        None => out.push_str(userinfo),
                    }
                    out.push_str(&authority[at..]);
                }
                None => out.push_str(authority),
            }
            out.push_str(&after[authority_end..]);
        }
        // Malformed (`postgres:/u:pw@h`, `u:pw@h`): whatever comes before
        // the last '@' may hold a password, so none of it is kept but a
        // leading scheme.
        None => match head.rfind('@') {
            Some(at) => {
                if let Some(s) = scheme(head) {
                    out.push_str(s);
                    out.push(':');
                }
                out.push_str(MARK);
                out.push_str(&head[at..]);
            }
            None => out.push_str(head),
        },
    }
    if let Some(query) = query {
        out.push('?');
        let parts: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={MARK}"),
                _ => p.to_string(),
            })
            .collect();
        out.push_str(&parts.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Result<DatabaseUrl, String> {
        DatabaseUrl::parse(v, Path::new("/etc/idemhook"))
    }

    #[test]
    fn paths_and_sqlite_prefix_are_sqlite_files() {
        assert_eq!(
            parse("idemhook.db").unwrap(),
            DatabaseUrl::Sqlite("/etc/idemhook/idemhook.db".into())
        );
        assert_eq!(
            parse("/var/lib/x.db").unwrap(),
            DatabaseUrl::Sqlite("/var/lib/x.db".into())
        );
        assert_eq!(
            parse("sqlite:data/x.db").unwrap(),
            DatabaseUrl::Sqlite("/etc/idemhook/data/x.db".into())
        );
        assert_eq!(
            parse("sqlite:///var/x.db").unwrap(),
            DatabaseUrl::Sqlite("/var/x.db".into())
        );
        assert_eq!(
            parse("./odd:name.db").unwrap(),
            DatabaseUrl::Sqlite("/etc/idemhook/./odd:name.db".into())
        );
        assert!(parse("sqlite:").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn postgres_urls_in_both_spellings() {
        for url in [
            "postgres://idemhook@db.internal:5432/app?sslmode=require",
            "postgresql://idemhook@db.internal/app",
            "POSTGRES://u@h/d",
        ] {
            match parse(url).unwrap() {
                DatabaseUrl::Postgres(u) => assert_eq!(u.expose(), url),
                other => panic!("{url}: {other:?}"),
            }
        }
        let e = parse("postgres:app").unwrap_err();
        assert!(e.contains("postgres://"), "{e}");
    }

    #[test]
    fn other_schemes_are_refused_by_name() {
        for (url, scheme) in [
            ("mysql://root:hunter2@h/db", "mysql"),
            ("file:x.db", "file"),
            ("cockroach://u@h/d", "cockroach"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(&format!("{scheme:?}")), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn passwords_never_print() {
        let url =
            parse("postgres://idemhook:s3cr%40t@db:5432/app?sslmode=require&password=p2").unwrap();
        for shown in [format!("{url}"), format!("{url:?}")] {
            assert!(!shown.contains("s3cr"), "{shown}");
            assert!(!shown.contains("p2"), "{shown}");
            assert!(shown.contains("[REDACTED]"), "{shown}");
        }
        assert_eq!(
            url.to_string(),
            "postgres://idemhook:[REDACTED]@db:5432/app?sslmode=require&password=[REDACTED]"
        );
        // A raw '@' in the password: everything before the last '@' of the
        // authority is user info.
        assert_eq!(
            redact("postgres://u:a@b@h/d"),
            "postgres://u:[REDACTED]@h/d"
        );
        assert_eq!(redact("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redact("postgres://h/d?user=u"), "postgres://h/d?user=u");
    }

    #[test]
    fn malformed_urls_never_print_their_password() {
        for value in [
            "postgresql:/idemhook:pw@db/app",
            "postgres:idemhook:pw@db/app",
            "mysql:u:pw@h/d",
            "postgres//idemhook:pw@db/app",
            "postgres:/u:pw@h/d?password=pw",
        ] {
            let shown = match parse(value) {
                Err(e) => e,
                Ok(url) => format!("{url} {url:?}"),
            };
            assert!(!shown.contains("pw"), "{value}: {shown}");
        }
        assert_eq!(
            redact("postgresql:/u:pw@db/app"),
            "postgresql:[REDACTED]@db/app"
        );
    }
}
