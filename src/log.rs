//! Log lines: one per delivery, per attempt, per notable event. Human text
//! by default (`2026-11-30T10:00:00.123Z INFO delivery source=stripe ...`),
//! JSON lines with `--log-format json`. Written to stderr.
//!
//! Callers pass fields, never whole bodies, secrets or signatures; values
//! are escaped so a hostile event id cannot forge a log line.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 0,
    Info = 1,
    Warn = 2,
    Error = 3,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "debug" | "trace" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" | "warning" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static FORMAT: OnceLock<Format> = OnceLock::new();

/// Sets the level and format once, at start.
pub fn init(level: Level, format: Format) {
    LEVEL.store(level as u8, Ordering::Relaxed);
    let _ = FORMAT.set(format);
}

fn enabled(level: Level) -> bool {
    level as u8 >= LEVEL.load(Ordering::Relaxed)
}

pub fn debug(what: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    write(Level::Debug, what, fields);
}

pub fn info(what: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    write(Level::Info, what, fields);
}

pub fn warn(what: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    write(Level::Warn, what, fields);
}

pub fn error(what: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    write(Level::Error, what, fields);
}

pub fn write(level: Level, what: &str, fields: &[(&str, &dyn std::fmt::Display)]) {
    if !enabled(level) {
        return;
    }
    let mut line = String::with_capacity(160);
    let ts = timestamp();
    match FORMAT.get().copied().unwrap_or(Format::Text) {
        Format::Text => {
            line.push_str(&ts);
            line.push(' ');
            line.push_str(level.name());
            line.push(' ');
            line.push_str(what);
            for (k, v) in fields {
                let v = v.to_string();
                line.push(' ');
                line.push_str(k);
                line.push('=');
                if v.is_empty()
                    || v.bytes()
                        .any(|b| b <= b' ' || b == b'"' || b == b'=' || b >= 0x7f)
                {
                    line.push_str(&serde_json::Value::String(v).to_string());
                } else {
                    line.push_str(&v);
                }
            }
        }
        Format::Json => {
            let mut obj = serde_json::Map::new();
            obj.insert("ts".into(), ts.into());
            obj.insert("level".into(), level.name().to_ascii_lowercase().into());
            obj.insert("msg".into(), what.into());
            for (k, v) in fields {
                obj.insert((*k).to_string(), v.to_string().into());
            }
            line.push_str(&serde_json::Value::Object(obj).to_string());
        }
    }
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// RFC 3339 UTC with milliseconds, computed without a time crate.
fn timestamp() -> String {
    let ms = crate::store::now_ms();
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_422), (2025, 11, 30));
        assert_eq!(super::civil_from_days(-1), (1969, 12, 31));
    }
}
