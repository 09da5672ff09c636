//! What a config error may say: a TOML syntax or type error as line,
//! column, key path and what was expected, never the offending line nor a
//! value (a secret written where a list belongs would otherwise reach
//! stderr and the journal); and any URL password in a message replaced by
//! `[REDACTED]`.

/// A TOML error over `text`, told without its snippet or value:
/// `line 3, column 11, key sources.a.secrets: invalid type: a string,
/// expected a sequence`.
pub(super) fn describe(text: &str, mut error: toml::de::Error) -> String {
    let message = hide_values(error.message());
    let span = error.span();
    // Without the input, the error's Display is its message and then the
    // key path it carries (`in `sources.a.secrets``), if any.
    error.set_input(None);
    let shown = error.to_string();
    let keys = shown
        .lines()
        .filter_map(|l| l.strip_prefix("in `").and_then(|l| l.strip_suffix('`')))
        .next_back()
        .map(str::to_string);
    let mut out = String::new();
    let mut line_index = None;
    if let Some(span) = span {
        let (line, column) = position(text, span.start);
        line_index = Some(line);
        out.push_str(&format!("line {}, column {}", line + 1, column + 1));
    }
    let keys = keys.or_else(|| line_index.and_then(|l| key_on_line(text, l)));
    if let Some(keys) = keys {
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(&format!("key {keys}"));
    }
    if !out.is_empty() {
        out.push_str(": ");
    }
    out.push_str(&message);
    out
}

/// Zero-based line and column (in characters) of byte `offset`.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count();
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(start..).map_or(0, |s| s.chars().count());
    (line, column)
}

/// For a syntax error, which carries no key path: the key written on that
/// line, under the last table header above it.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.split('\n').collect();
    let key = lines
        .get(line)
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim())
        .filter(|k| plain_key(k))?;
    let table = lines
        .iter()
        .take(line)
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_start_matches('[').trim_end_matches(']').trim());
    Some(match table {
        Some(t) if plain_key(t) => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

/// A bare or dotted key: nothing that could be a value.
fn plain_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// serde's messages quote the value (`invalid type: string "whsec_..."`,
/// `unknown variant `...``): keep what kind of value it was and what was
/// expected, drop the value.
fn hide_values(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let kind = rest
                .split([' ', ','])
                .next()
                .filter(|w| w.chars().all(|c| c.is_ascii_alphabetic()))
                .unwrap_or("value");
            let expected = rest
                .rfind(", expected ")
                .map(|i| &rest[i..])
                .unwrap_or_default();
            return format!("{prefix}a {kind}{expected}");
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let expected = rest
            .find(", expected ")
            .map(|i| &rest[i..])
            .unwrap_or_default();
        return format!("unknown variant{expected}");
    }
    // Anything else from serde that quotes a value: drop the quoted part.
    match (message.find('"'), message.rfind('"')) {
        (Some(a), Some(b)) if b > a && !message.contains("expected `\"`") => {
            format!("{}(value not shown){}", &message[..a], &message[b + 1..])
        }
        _ => message.to_string(),
    }
}

/// `message` with the password of every URL in it (`scheme://user:pw@`)
/// and every `password=` value replaced by `[REDACTED]`.
pub(super) fn redact_urls(message: &str) -> String {
    if !message.contains("://") && !message.to_ascii_lowercase().contains("password=") {
        return message.to_string();
    }
    let mut out = String::with_capacity(message.len());
    let mut word = String::new();
    for c in message.chars() {
        if c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ',' | '(' | ')' | '<' | '>') {
            out.push_str(&redact_word(&word));
            word.clear();
            out.push(c);
        } else {
            word.push(c);
        }
    }
    out.push_str(&redact_word(&word));
    out
}

fn redact_word(word: &str) -> String {
    const MARK: &str = "[REDACTED]";
    let mut word = word.to_string();
    if let Some(start) = word.find("://") {
        let authority_start = start + 3;
        let after = &word[authority_start..];
        let end = after.find(['/', '?', '#']).unwrap_or(after.len());
        if let Some(at) = after[..end].rfind('@')
            && let Some(colon) = after[..at].find(':')
        {
            word = format!(
                "{}{MARK}{}",
                &word[..authority_start + colon + 1],
                &word[authority_start + at..]
            );
        }
    }
    let lower = word.to_ascii_lowercase();
    if let Some(i) = lower.find("password=") {
        let value_start = i + "password=".len();
        let value_end = word[value_start..]
            .find('&')
            .map_or(word.len(), |e| value_start + e);
        word = format!("{}{MARK}{}", &word[..value_start], &word[value_end..]);
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_redacted_in_any_message() {
        assert_eq!(
            redact_urls(
                "forward: scheme \"amqp\" in amqp://user:s3cret@broker:5672/vh is not http"
            ),
            "forward: scheme \"amqp\" in amqp://user:[REDACTED]@broker:5672/vh is not http"
        );
        assert_eq!(
            redact_urls("x \"https://a:b@h/p?password=zz&q=1\""),
            "x \"https://a:[REDACTED]@h/p?password=[REDACTED]&q=1\""
        );
        assert_eq!(redact_urls("http://h/p"), "http://h/p");
    }

    #[test]
    fn values_are_not_kept_in_serde_messages() {
        assert_eq!(
            hide_values("invalid type: string \"whsec_x\", expected a sequence"),
            "invalid type: a string, expected a sequence"
        );
        assert_eq!(
            hide_values("unknown variant `hunter2`, expected `a` or `b`"),
            "unknown variant, expected `a` or `b`"
        );
        assert_eq!(
            hide_values("invalid basic string, expected `\"`"),
            "invalid basic string, expected `\"`"
        );
    }

    #[test]
    fn a_syntax_error_names_its_key() {
        let text = "listen = \"x\"\n[sources.a]\nsecrets = \"abc\n";
        assert_eq!(key_on_line(text, 2).as_deref(), Some("sources.a.secrets"));
        assert_eq!(position(text, 14), (1, 1));
    }
}
