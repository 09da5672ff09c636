//! Printing to a terminal: times as UTC, untrusted text (event ids,
//! types, errors, bodies) with its control characters escaped, and plain
//! left-aligned tables. Every operator command's human output goes
//! through these; the JSON output does not. Every command writes through
//! [`stdout`], whose writes return their errors: a command returns them
//! (`CommandError::Output`) and `cli` alone decides what they mean.

use std::io;

use serde_json::Value;

/// Where a command prints: stdout, line by line. A write that fails (a
/// full disk, a reader that went away) is an error the command returns,
/// never a panic.
pub fn stdout() -> io::StdoutLock<'static> {
    io::stdout().lock()
}

/// A failed write to [`stdout`] carried through an `anyhow::Error`, by the
/// commands whose other errors are `anyhow` ones (`migrate`, `backup`,
/// `send`): `writeln!(out, ..).map_err(Unwritten)?`. The conversion into a
/// `CommandError` takes it back out as `CommandError::Output`.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the output: {0}")]
pub struct Unwritten(pub io::Error);

/// Unix seconds as `2025-11-30T10:00:00Z`.
pub fn fmt_time(secs: i64) -> String {
    crate::time::rfc3339_secs(secs)
}

/// A JSON time (unix seconds or null) for a human: the time, or `-`.
pub fn fmt_json_time(v: &Value) -> String {
    v.as_i64().map_or_else(|| "-".to_string(), fmt_time)
}

/// Untrusted text made safe for a terminal (`log.rs`'s, which catch-up's
/// API errors take too).
pub use crate::log::clean;

/// A JSON value as table text: strings cleaned, null as `-`.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => clean(s),
        other => clean(&other.to_string()),
    }
}

/// Left-aligned columns, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, c) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(c);
            } else {
                let pad = widths
                    .get(i)
                    .map_or(0, |w| w.saturating_sub(c.chars().count()));
                text.push_str(c);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_text() {
        assert_eq!(fmt_time(1_764_460_800), "2025-11-30T00:00:00Z");
        assert_eq!(fmt_json_time(&Value::Null), "-");
        assert_eq!(clean("evt\u{1b}[2J\n"), "evt\\u{1b}[2J\\n");
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(
            table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]),
            "A    BB\nxyz  1\n"
        );
    }
}
