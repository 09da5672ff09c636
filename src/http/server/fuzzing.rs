//! The head parser and the chunked decoder on bytes, for the fuzz target
//! (not part of the API).

use super::Limits;
use super::body::read_chunked;
use super::head::{HeadError, read_head};
use super::read::{BodyPool, Budget};

/// A parsed head: the method, the target as sent and in origin form,
/// the fields, and how many bytes of `input` the head took.
pub struct ParsedHead {
    pub method: String,
    pub raw_target: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub consumed: usize,
    pub chunked: bool,
    pub content_length: Option<usize>,
}

/// Reads one head off `input` as a connection would; the status it
/// would be refused with otherwise (0: the input ended first).
pub fn parse_head(input: &[u8], limits: &Limits) -> Result<ParsedHead, u16> {
    let mut reader = input;
    let (head, _) = match read_head(&mut reader, limits) {
        Ok(h) => h,
        Err(HeadError::Closed) => return Err(0),
        Err(HeadError::Refused { status, .. }) => return Err(status),
    };
    let consumed = input.len() - reader.len();
    let first = input[..consumed]
        .split(|&b| b == b'\n')
        .find(|l| !l.is_empty() && *l != b"\r")
        .unwrap_or_default();
    let raw_target = String::from_utf8_lossy(first)
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    Ok(ParsedHead {
        method: head.method,
        raw_target,
        target: head.target,
        headers: head.headers,
        consumed,
        chunked: head.chunked,
        content_length: head.content_length,
    })
}

/// Decodes a chunked body off `input`: the body and how many bytes it
/// took, or why it is refused ("too large" past `max`).
pub fn decode_chunked(input: &[u8], max: usize) -> Result<(Vec<u8>, usize), String> {
    let pool = std::sync::Arc::new(BodyPool::new(usize::MAX, usize::MAX));
    let mut budget = Budget::new(&pool, std::net::Ipv4Addr::LOCALHOST.into());
    let mut reader = input;
    match read_chunked(&mut reader, max, &mut budget) {
        Ok(body) => Ok((body, input.len() - reader.len())),
        Err(e) => Err(format!("{e:?}")),
    }
}
