//! Log lines: one per delivery, per attempt, per notable event. Human text
//! by default (`2026-11-30T10:00:00.123Z INFO delivery source=stripe ...`),
//! JSON lines with `--log-format json`. Written to stderr.
//!
//! Callers pass fields, never whole bodies, secrets or signatures; values
//! are escaped so a hostile event id cannot forge a log line.
//!
//! Levels: `info` for the normal flow (a delivery accepted, a duplicate, an
//! attempt that succeeded or will be retried); `warn` for what the alert
//! rules call incidents (a bad signature, a payload mismatch, a storage
//! error, a failed admin authentication, a changed key rule); `error` for
//! an effect that did not happen (a dead letter: a job failed for good) and
//! for bugs (a panic). `--log-level warn` shows exactly the incidents.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Untrusted text (event ids, types, errors) made safe for a terminal:
/// control characters are escaped so they cannot move the cursor or forge
/// lines.
pub fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 0,
    Info = 1,
    Warn = 2,
    Error = 3,
}

impl Level {
    /// The names `--log-level` and `IDEMHOOK_LOG` take (in any case).
    pub const NAMES: [&'static str; 4] = ["debug", "info", "warn", "error"];

    /// One of [`Level::NAMES`], in any case; anything else is None (and an
    /// error for the caller: a mistyped level must not silently log more
    /// or less than asked).
    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" => Some(Level::Warn),
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
    use std::fmt::Write as _;
    if !enabled(level) {
        return;
    }
    let mut line = String::with_capacity(256);
    let ts = timestamp();
    match FORMAT.get().copied().unwrap_or(Format::Text) {
        Format::Text => {
            line.push_str(&ts);
            line.push(' ');
            line.push_str(level.name());
            line.push(' ');
            line.push_str(what);
            for (k, v) in fields {
                line.push(' ');
                line.push_str(k);
                line.push('=');
                // Formatted in place; quoted (as a JSON string) only when
                // it is empty or has a space, quote, '=' or control byte.
                let start = line.len();
                let _ = write!(line, "{v}");
                let value = &line[start..];
                if value.is_empty()
                    || value
                        .bytes()
                        .any(|b| b <= b' ' || b == b'"' || b == b'=' || b >= 0x7f)
                {
                    let raw = line.split_off(start);
                    line.push_str(&serde_json::Value::String(raw).to_string());
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
    if !BUFFERING.load(Ordering::Relaxed) {
        return emit(line.as_bytes());
    }
    if level <= Level::Info {
        let mut buffer = lock_buffer();
        buffer.extend_from_slice(line.as_bytes());
        let full = buffer.len() >= BUFFER_LIMIT;
        drop(buffer);
        if full {
            // The flusher is behind (stderr blocked?): write it out here.
            flush();
        }
        return;
    }
    // A warning or error goes out now, after the lines gathered before it.
    // Lock order, here and in flush(): stderr, then the buffer.
    let mut out = std::io::stderr().lock();
    let mut chunk = std::mem::take(&mut *lock_buffer());
    chunk.extend_from_slice(line.as_bytes());
    let _ = out.write_all(&chunk);
}

// While `serve` runs, info and debug lines (one per delivery and per
// attempt) are gathered in memory and written out every FLUSH_EVERY by the
// flusher thread: one write(2) per line cost about a tenth of the
// server's CPU per request in the benchmark. Warnings and errors still go
// out at once (with whatever info lines came before them), and stopping
// the flusher writes everything out. A kill -9 can lose the last
// FLUSH_EVERY of info lines; never a warning or an error.
static BUFFERING: AtomicBool = AtomicBool::new(false);
static BUFFER: Mutex<Vec<u8>> = Mutex::new(Vec::new());
const BUFFER_LIMIT: usize = 256 * 1024;
const FLUSH_EVERY: Duration = Duration::from_millis(10);

fn lock_buffer() -> std::sync::MutexGuard<'static, Vec<u8>> {
    BUFFER.lock().unwrap_or_else(|e| e.into_inner())
}

fn flush() {
    // A buffer sized like the last batch, made before taking the lock, so
    // that appenders do not grow a fresh one from nothing.
    let fresh = Vec::with_capacity(lock_buffer().capacity().min(BUFFER_LIMIT));
    let mut out = std::io::stderr().lock();
    let chunk = std::mem::replace(&mut *lock_buffer(), fresh);
    if !chunk.is_empty() {
        let _ = out.write_all(&chunk);
    }
}

/// Writes info lines out in batches until dropped; see [`buffer_lines`].
pub struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

/// Starts batching info lines (`serve` does, for its lifetime). Without a
/// flusher every line is written at once.
pub fn buffer_lines() -> Flusher {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let s = stop.clone();
    let handle = std::thread::Builder::new()
        .name("idemhook-log".into())
        .spawn(move || {
            let (lock, cv) = &*s;
            let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
            while !*stopped {
                stopped = match cv.wait_timeout(stopped, FLUSH_EVERY) {
                    Ok((g, _)) => g,
                    Err(e) => e.into_inner().0,
                };
                flush();
            }
        })
        .ok();
    if handle.is_some() {
        BUFFERING.store(true, Ordering::Relaxed);
    }
    Flusher { stop, handle }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        BUFFERING.store(false, Ordering::Relaxed);
        {
            let (lock, cv) = &*self.stop;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        flush();
    }
}

/// Writes one line to stderr. A line up to PIPE_BUF bytes goes out in one
/// write(2) without a lock: the kernel keeps a single write whole on a file
/// or pipe, and the std stderr lock, taken by every request thread for
/// every delivery line, cost more than the write itself under load. Longer
/// lines (rare) take the lock so their pieces stay together.
fn emit(bytes: &[u8]) {
    const PIPE_BUF: usize = 4096;
    #[cfg(unix)]
    if bytes.len() <= PIPE_BUF {
        match rustix::io::write(rustix::stdio::stderr(), bytes) {
            Ok(n) if n == bytes.len() => return,
            // A short write: the rest under the lock below.
            Ok(n) => return emit_locked(&bytes[n..]),
            Err(_) => {}
        }
    }
    emit_locked(bytes);
}

fn emit_locked(bytes: &[u8]) {
    let _ = std::io::stderr().lock().write_all(bytes);
}

/// RFC 3339 UTC with milliseconds.
fn timestamp() -> String {
    crate::time::rfc3339_ms(crate::time::now_ms())
}
