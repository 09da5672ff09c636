//! A password the `database` URL leaves out, found as libpq finds it:
//! `PGPASSWORD`, else the password file (`PGPASSFILE`, else
//! `~/.pgpass`), whose lines are `host:port:database:user:password` with
//! `*` for any value and `\:` / `\\` escapes. As libpq does, a password
//! file that the group or others may read is ignored.
//!
//! Owns finding the password; never prints it.

use std::path::PathBuf;

use postgres::config::Host;

/// Sets the password on `config` when the URL named none and the
/// environment or the password file holds one for its host, port,
/// database and user. The first host that has a line wins (a multi-host
/// URL shares one password).
pub fn fill(config: &mut postgres::Config) {
    if config.get_password().is_some() {
        return;
    }
    if let Some(pw) = std::env::var_os("PGPASSWORD").filter(|p| !p.is_empty()) {
        config.password(pw.as_encoded_bytes());
        return;
    }
    let Some(text) = password_file() else {
        return;
    };
    let user = config
        .get_user()
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or(&user).to_string();
    let ports = config.get_ports();
    let found = config.get_hosts().iter().enumerate().find_map(|(i, host)| {
        let host = match host {
            Host::Tcp(name) => name.as_str(),
            // libpq matches a Unix socket against `localhost`.
            Host::Unix(_) => "localhost",
        };
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        lookup(&text, host, port, &database, &user)
    });
    if let Some(pw) = found {
        config.password(pw);
    }
}

/// The password file's text, when it exists and only its owner may read it.
fn password_file() -> Option<String> {
    let path = match std::env::var_os("PGPASSFILE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".pgpass"),
    };
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() {
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            return None;
        }
    }
    std::fs::read_to_string(&path).ok()
}

/// The password of the first line of `text` that matches.
fn lookup(text: &str, host: &str, port: u16, database: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    let wanted = [host, port.as_str(), database, user];
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let fields = split_fields(line);
            if fields.len() < 5 {
                return None;
            }
            let matches = fields[..4]
                .iter()
                .zip(wanted)
                .all(|(field, want)| field == "*" || field == want);
            // A colon in the password is escaped like any other.
            matches.then(|| fields[4..].join(":"))
        })
}

/// The colon-separated fields of one line, with `\:` and `\\` unescaped.
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(next), Some(f)) = (chars.next(), fields.last_mut()) {
                    f.push(next);
                }
            }
            ':' => fields.push(String::new()),
            c => {
                if let Some(f) = fields.last_mut() {
                    f.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# comment
db1:5432:app:idemhook:first
*:5433:*:idemhook:any\\:host
localhost:5432:app:*:sock\\\\et
";

    #[test]
    fn the_first_matching_line_with_wildcards_and_escapes() {
        assert_eq!(
            lookup(FILE, "db1", 5432, "app", "idemhook").as_deref(),
            Some("first")
        );
        assert_eq!(
            lookup(FILE, "db9", 5433, "other", "idemhook").as_deref(),
            Some("any:host")
        );
        assert_eq!(
            lookup(FILE, "localhost", 5432, "app", "bob").as_deref(),
            Some("sock\\et")
        );
        assert_eq!(lookup(FILE, "db1", 5432, "app", "bob"), None);
        assert_eq!(lookup(FILE, "db2", 5432, "app", "idemhook"), None);
    }
}
