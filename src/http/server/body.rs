//! Request bodies: a Content-Length body read as its bytes arrive, or the
//! chunked transfer coding (RFC 9112 section 7.1), decoded strictly: chunk
//! sizes, extensions and trailers are checked, not skipped.

use std::io::BufRead;

use super::BodyProblem;
use super::head::Head;
use super::read::{BodyError, Budget, Stop, is_token, read_into, read_line, stop_of};

/// Reads the body, up to `max` bytes.
pub(super) fn read_body<R: BufRead>(
    reader: &mut R,
    head: &Head,
    max: usize,
    budget: &mut Budget,
) -> Result<Vec<u8>, BodyError> {
    if head.chunked {
        return read_chunked(reader, max, budget);
    }
    let Some(expected) = head.content_length else {
        return Ok(Vec::new());
    };
    if expected > max {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    match read_into(reader, expected, &mut body, budget) {
        Ok(()) => Ok(body),
        Err((Stop::TimedOut, _)) => Err(BodyError::Problem(BodyProblem::TimedOut)),
        Err((Stop::Busy(over), _)) => Err(BodyError::Busy(over)),
        Err((_, got)) => Err(BodyError::Problem(BodyProblem::Short { expected, got })),
    }
}

/// Most trailer lines accepted after a chunked body.
const MAX_TRAILERS: usize = 32;

/// A chunked body (RFC 9112 7.1), up to `max` bytes. Strict: every line
/// ends with CRLF; a size is hex digits only; whitespace only around the
/// `;` and `=` of extensions, which are tokens or quoted strings (no
/// control characters); trailers are field lines.
pub(super) fn read_chunked<R: BufRead>(
    reader: &mut R,
    max: usize,
    budget: &mut Budget,
) -> Result<Vec<u8>, BodyError> {
    let bad = |m: String| BodyError::Problem(BodyProblem::BadChunk(m));
    let stopped = |stop: Stop, got: usize, what: &str| match stop {
        Stop::TimedOut => BodyError::Problem(BodyProblem::TimedOut),
        Stop::Eof => BodyError::Problem(BodyProblem::Short {
            expected: got + 1,
            got,
        }),
        Stop::TooLong => bad(format!("{what} too long")),
        Stop::Busy(over) => BodyError::Busy(over),
    };
    let mut body = Vec::new();
    loop {
        let mut size_line = Vec::new();
        read_line(reader, &mut size_line, 1024)
            .map_err(|s| stopped(s, body.len(), "chunk size line"))?;
        let size = chunk_size(&size_line).map_err(bad)?;
        if size == 0 {
            read_trailers(reader).map_err(|e| match e {
                Ok(stop) => stopped(stop, body.len(), "trailer line"),
                Err(m) => bad(m),
            })?;
            return Ok(body);
        }
        if size > max - body.len().min(max) {
            // This chunk takes the body past the limit: 413 now, without
            // waiting for (or reading) its bytes.
            return Err(BodyError::TooLarge);
        }
        let start = body.len();
        read_into(reader, size, &mut body, budget)
            .map_err(|(s, got)| stopped(s, start + got, "chunk"))?;
        let mut crlf = [0u8; 2];
        for b in &mut crlf {
            *b = read_byte(reader).map_err(|s| stopped(s, body.len(), "chunk"))?;
        }
        if &crlf != b"\r\n" {
            return Err(bad("chunk not followed by CRLF".into()));
        }
    }
}

fn read_byte<R: BufRead>(reader: &mut R) -> Result<u8, Stop> {
    loop {
        match reader.fill_buf() {
            Ok([]) => return Err(Stop::Eof),
            Ok(b) => {
                let byte = b[0];
                reader.consume(1);
                return Ok(byte);
            }
            Err(e) => {
                if let Some(stop) = stop_of(&e) {
                    return Err(stop);
                }
            }
        }
    }
}

/// The size of a chunk from its size line (CRLF included):
/// `1*HEXDIG *( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] ) CRLF`.
fn chunk_size(line: &[u8]) -> Result<usize, String> {
    let line = line
        .strip_suffix(b"\r\n")
        .ok_or_else(|| "chunk size line not ended by CRLF".to_string())?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(format!(
            "bad chunk size {:?}",
            String::from_utf8_lossy(&line[..line.len().min(32)])
        ));
    }
    let mut size: usize = 0;
    for &d in &line[..digits] {
        let v = (d as char).to_digit(16).unwrap_or(0) as usize;
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(v))
            .ok_or_else(|| "chunk size too large".to_string())?;
    }
    chunk_extensions(&line[digits..])?;
    Ok(size)
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && (s[i] == b' ' || s[i] == b'\t') {
        i += 1;
    }
    i
}

fn token_end(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && is_token(s[i]) {
        i += 1;
    }
    i
}

/// Checks `*( BWS ";" BWS name [ BWS "=" BWS value ] )`.
fn chunk_extensions(s: &[u8]) -> Result<(), String> {
    let bad = || "malformed chunk extension".to_string();
    let mut i = 0;
    loop {
        let j = skip_ws(s, i);
        if j == s.len() {
            // Whitespace only before a `;`.
            return if j == i { Ok(()) } else { Err(bad()) };
        }
        if s[j] != b';' {
            return Err(bad());
        }
        let name_start = skip_ws(s, j + 1);
        let name_end = token_end(s, name_start);
        if name_end == name_start {
            return Err(bad());
        }
        i = name_end;
        let k = skip_ws(s, i);
        if k < s.len() && s[k] == b'=' {
            let v = skip_ws(s, k + 1);
            if v < s.len() && s[v] == b'"' {
                i = quoted_string_end(s, v).ok_or_else(bad)?;
            } else {
                let e = token_end(s, v);
                if e == v {
                    return Err(bad());
                }
                i = e;
            }
        }
    }
}

/// The index just past the quoted string that starts at `s[start]`.
fn quoted_string_end(s: &[u8], start: usize) -> Option<usize> {
    let qdtext = |b: u8| {
        b == b'\t'
            || b == b' '
            || b == 0x21
            || (0x23..=0x7e).contains(&b) && b != b'\\'
            || b >= 0x80
    };
    let mut i = start + 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\' => {
                let escaped = *s.get(i + 1)?;
                if !(escaped == b'\t' || (0x20..=0x7e).contains(&escaped) || escaped >= 0x80) {
                    return None;
                }
                i += 2;
            }
            b if qdtext(b) => i += 1,
            _ => return None,
        }
    }
    None
}

/// The trailer section: field lines ended by CRLF, up to a blank line.
/// `Err(Ok(stop))` when the read stopped, `Err(Err(why))` when malformed.
fn read_trailers<R: BufRead>(reader: &mut R) -> Result<(), Result<Stop, String>> {
    for _ in 0..=MAX_TRAILERS {
        let mut t = Vec::new();
        read_line(reader, &mut t, 8 * 1024).map_err(Ok)?;
        let line = t
            .strip_suffix(b"\r\n")
            .ok_or_else(|| Err("trailer line not ended by CRLF".to_string()))?;
        if line.is_empty() {
            return Ok(());
        }
        if !field_line(line) {
            return Err(Err("malformed trailer line".into()));
        }
    }
    Err(Err(format!("more than {MAX_TRAILERS} trailer lines")))
}

/// `field-name ":" OWS field-value OWS` (RFC 9112 5), without its CRLF.
fn field_line(line: &[u8]) -> bool {
    let name_end = token_end(line, 0);
    name_end > 0
        && line.get(name_end) == Some(&b':')
        && line[name_end + 1..]
            .iter()
            .all(|&b| b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_size_lines_are_strict() {
        assert_eq!(chunk_size(b"1a\r\n"), Ok(26));
        assert_eq!(chunk_size(b"5 ;a=b ; c = \"d\\\"e\"\r\n"), Ok(5));
        for bad in [
            &b"5\n"[..],
            b"5 \r\n",
            b"\r\n",
            b"5;\r\n",
            b"5;a=\x01\r\n",
            b"5;a=\"x\r\n",
            b"5\x0b\r\n",
            b"\x0c5\r\n",
            b"5\r;a\r\n",
            b"fffffffffffffffffffff\r\n",
        ] {
            assert!(
                chunk_size(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
