//! `:name` parameters for PostgreSQL. SQL actions and `setup_sql` are
//! written with SQLite's `:name` parameters on both backends; PostgreSQL
//! only knows `$1`, `$2`, ... This small tokenizer rewrites one into the
//! other and leaves alone everything that is not a parameter: `::type`
//! casts, string literals (`'...'`, `E'...'` with backslash escapes),
//! quoted identifiers (`"..."`), dollar-quoted strings (`$$...$$`,
//! `$tag$...$tag$`) and comments (`--` to the end of the line, `/* */`,
//! nested as PostgreSQL nests them).
//!
//! Owns the rewrite; does not know what the names are bound to.

/// SQL with `$n` placeholders and, at index n - 1, the name that `$n`
/// stands for. A name used twice gets one number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Positional {
    pub sql: String,
    pub names: Vec<String>,
}

/// Rewrites `:name` parameters to `$n`. Refuses text PostgreSQL would
/// misread after the rewrite: an unterminated literal, identifier or
/// comment, and `$n` placeholders of its own (they would collide).
pub fn to_positional(sql: &str) -> Result<Positional, String> {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 8);
    let mut names: Vec<String> = Vec::new();
    let mut i = 0;
    // Where the text not yet copied starts.
    let mut copied = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\'' => {
                // E'...' (and e'...') allows backslash escapes.
                let escapes = i > 0
                    && matches!(bytes[i - 1], b'E' | b'e')
                    && (i < 2 || !is_ident_byte(bytes[i - 2]));
                i = end_of_quoted(bytes, i, b'\'', escapes)
                    .ok_or_else(|| format!("unterminated string literal at byte {i}"))?;
            }
            b'"' => {
                i = end_of_quoted(bytes, i, b'"', false)
                    .ok_or_else(|| format!("unterminated quoted identifier at byte {i}"))?;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = sql[i..].find('\n').map_or(bytes.len(), |n| i + n + 1);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = end_of_block_comment(bytes, i)
                    .ok_or_else(|| format!("unterminated /* comment at byte {i}"))?;
            }
            b'$' => i = end_of_dollar(sql, i)?,
            b':' if bytes.get(i + 1) == Some(&b':') => {
                // A cast: skip both colons so the type is not a name.
                i += 2;
            }
            b':' if bytes.get(i + 1).is_some_and(|&c| is_ident_start(c)) => {
                let end = end_of_name(bytes, i + 1);
                let n = number_of(&mut names, &sql[i + 1..end]);
                out.push_str(&sql[copied..i]);
                out.push('$');
                out.push_str(&n.to_string());
                i = end;
                copied = end;
            }
            _ if is_ident_byte(b) => {
                // Skip a whole word, so a `$` inside an identifier
                // (PostgreSQL allows one after the first character) is not
                // read as a dollar quote; the quote arm looks back for E.
                i = end_of_word(bytes, i);
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[copied..]);
    Ok(Positional { sql: out, names })
}

/// The index just past what a `$` at `i` starts: a dollar-quoted string
/// (`$$...$$`, `$tag$...$tag$`), or the `$` alone. A `$n` placeholder is
/// refused.
fn end_of_dollar(sql: &str, i: usize) -> Result<usize, String> {
    let bytes = sql.as_bytes();
    if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
        return Err(format!(
            "positional parameter at byte {i}: write :name parameters, not $n"
        ));
    }
    match dollar_tag(bytes, i) {
        Some(tag_len) => {
            let tag = &sql[i..i + tag_len];
            let body = i + tag_len;
            sql[body..]
                .find(tag)
                .map(|n| body + n + tag_len)
                .ok_or_else(|| format!("unterminated {tag} string at byte {i}"))
        }
        None => Ok(i + 1),
    }
}

/// The index just past the parameter name that starts at `start`.
fn end_of_name(bytes: &[u8], start: usize) -> usize {
    let mut end = start;
    while end < bytes.len() && is_ident_byte(bytes[end]) {
        end += 1;
    }
    end
}

/// The number `name` stands as (1-based): its first use's, or the next.
fn number_of(names: &mut Vec<String>, name: &str) -> usize {
    match names.iter().position(|x| x == name) {
        Some(p) => p + 1,
        None => {
            names.push(name.to_string());
            names.len()
        }
    }
}

/// The index just past the word (identifier bytes and `$`) that starts
/// at `start`.
fn end_of_word(bytes: &[u8], start: usize) -> usize {
    let mut end = start + 1;
    while end < bytes.len() && (is_ident_byte(bytes[end]) || bytes[end] == b'$') {
        end += 1;
    }
    end
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

/// The index just past the closing quote of the literal opened at `start`;
/// a doubled quote is part of it, and with `escapes` a backslash takes the
/// next byte.
fn end_of_quoted(bytes: &[u8], start: usize, quote: u8, escapes: bool) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        let b = bytes[i];
        if escapes && b == b'\\' {
            i += 2;
            continue;
        }
        if b == quote {
            if bytes.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// The index just past the `*/` that closes the comment opened at `start`,
/// counting nested comments.
fn end_of_block_comment(bytes: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = start;
    while i + 1 < bytes.len() {
        if bytes[i] == b'/' && bytes[i + 1] == b'*' {
            depth += 1;
            i += 2;
        } else if bytes[i] == b'*' && bytes[i + 1] == b'/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Some(i);
            }
        } else {
            i += 1;
        }
    }
    None
}

/// The length of a dollar-quote tag (`$$` or `$tag$`) starting at `start`,
/// when there is one there.
fn dollar_tag(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    if bytes
        .get(i)
        .is_some_and(|&b| !is_ident_start(b) && b != b'$' && b < 0x80)
    {
        return None;
    }
    while i < bytes.len() && bytes[i] != b'$' {
        if !is_ident_byte(bytes[i]) {
            return None;
        }
        i += 1;
    }
    (i < bytes.len()).then_some(i + 1 - start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, sql: &str, names: &[&str]) {
        let got = to_positional(input).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(got.sql, sql, "input: {input}");
        assert_eq!(got.names, names, "input: {input}");
    }

    #[test]
    fn names_become_numbers_in_order_of_first_use() {
        check(
            "INSERT INTO ledger (id, customer, again) VALUES (:event_id, :customer, :event_id)",
            "INSERT INTO ledger (id, customer, again) VALUES ($1, $2, $1)",
            &["event_id", "customer"],
        );
        check(":a", "$1", &["a"]);
        check("x=:a_1,y=:B2", "x=$1,y=$2", &["a_1", "B2"]);
    }

    #[test]
    fn casts_are_not_parameters() {
        check(
            "SELECT :amount::numeric, :at::bigint, '1'::int, x::text[]",
            "SELECT $1::numeric, $2::bigint, '1'::int, x::text[]",
            &["amount", "at"],
        );
        check(
            "SELECT (:p)::jsonb ->> 'k'",
            "SELECT ($1)::jsonb ->> 'k'",
            &["p"],
        );
    }

    #[test]
    fn quoted_text_is_left_alone() {
        check(
            "SELECT ':no', 'it''s :no', \":no\"\"x\", E'\\':no', e'\\\\' || :yes",
            "SELECT ':no', 'it''s :no', \":no\"\"x\", E'\\':no', e'\\\\' || $1",
            &["yes"],
        );
        // A plain string ending in a backslash is closed by its quote.
        check("SELECT 'a\\' || :p", "SELECT 'a\\' || $1", &["p"]);
        // An identifier ending in e before a string is not an E'' prefix.
        check("SELECT name'x' , :p", "SELECT name'x' , $1", &["p"]);
    }

    #[test]
    fn dollar_quotes_are_left_alone() {
        check(
            "DO $$ BEGIN PERFORM ':no'; END $$; SELECT :p",
            "DO $$ BEGIN PERFORM ':no'; END $$; SELECT $1",
            &["p"],
        );
        check(
            "CREATE FUNCTION f() RETURNS int AS $body$ SELECT :no $x$ $body$ LANGUAGE sql; SELECT :p",
            "CREATE FUNCTION f() RETURNS int AS $body$ SELECT :no $x$ $body$ LANGUAGE sql; SELECT $1",
            &["p"],
        );
        // `$` inside an identifier is not a quote.
        check("SELECT a$b, :p", "SELECT a$b, $1", &["p"]);
    }

    #[test]
    fn comments_are_left_alone() {
        check(
            "SELECT 1 -- :no\n, :p /* :no /* nested :no */ still :no */ , :q",
            "SELECT 1 -- :no\n, $1 /* :no /* nested :no */ still :no */ , $2",
            &["p", "q"],
        );
        check("SELECT :p -- :no", "SELECT $1 -- :no", &["p"]);
    }

    #[test]
    fn what_it_cannot_rewrite_is_refused() {
        for bad in [
            "SELECT ':p",
            "SELECT \"x",
            "SELECT /* :p",
            "SELECT $$ :p",
            "SELECT $1, :p",
        ] {
            assert!(to_positional(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_parameters_no_change() {
        for sql in ["", "SELECT 1", "CREATE TABLE t (a int)", "SELECT arr[1:2]"] {
            check(sql, sql, &[]);
        }
    }
}
