//! The retry policy of forward actions, as pure functions: which answers
//! are worth retrying (and what kind of failure a request without an
//! answer was), and how long to wait. No IO; randomness and the
//! downstream's Retry-After come in as arguments, so it is tested without
//! sleeping.

use std::time::Duration;

/// What to do after one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: the job is done.
    Done,
    /// Connection errors, timeouts, 408, 429, 5xx: try again later.
    Retry,
    /// Any other status: the downstream refused the event; fail at once.
    Fail,
}

/// Classifies an HTTP status.
pub fn classify_status(status: u16) -> Verdict {
    match status {
        200..=299 => Verdict::Done,
        408 | 429 | 500..=599 => Verdict::Retry,
        _ => Verdict::Fail,
    }
}

/// The error kind (`connect`, `timeout` or `protocol`) and message of a
/// request that got no answer.
pub fn classify_error(e: &ureq::Error) -> (&'static str, String) {
    use std::io::ErrorKind;
    match e {
        ureq::Error::Timeout(t) => ("timeout", format!("timed out ({t})")),
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => ("connect", e.to_string()),
        ureq::Error::Io(io) => match io.kind() {
            ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable | ErrorKind::NotFound => {
                ("connect", io.to_string())
            }
            ErrorKind::TimedOut | ErrorKind::WouldBlock => ("timeout", io.to_string()),
            _ => ("protocol", io.to_string()),
        },
        other => ("protocol", other.to_string()),
    }
}

/// The delay before attempt `attempt + 1`, after `attempt` attempts
/// (1-based) have failed.
///
/// Exponential with full jitter above a floor: the ceiling is
/// `initial * 2^(attempt-1)` capped at `max`, and the delay is drawn
/// uniformly between `initial` and that ceiling (`jitter` in [0, 1) is the
/// draw), so the first retry waits `initial` and concurrent failures spread
/// out. A downstream's `Retry-After` is honoured up to `max`: the delay is
/// never shorter than it.
pub fn next_delay(
    attempt: u32,
    initial: Duration,
    max: Duration,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Duration {
    let exp = attempt.saturating_sub(1).min(40);
    let ceiling = initial.saturating_mul(1u32 << exp.min(31)).min(max);
    let span = ceiling.saturating_sub(initial);
    let jittered = initial + span.mul_f64(jitter.clamp(0.0, 1.0));
    match retry_after {
        Some(ra) => jittered.max(ra.min(max)),
        None => jittered,
    }
}

/// Parses a Retry-After header: delay-seconds or an HTTP date (IMF-fixdate),
/// relative to `now_secs`. None when absent or unreadable.
pub fn parse_retry_after(value: &str, now_secs: i64) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = parse_http_date(v)?;
    Some(Duration::from_secs(
        u64::try_from(at - now_secs).unwrap_or(0),
    ))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` to unix seconds.
fn parse_http_date(v: &str) -> Option<i64> {
    let parts: Vec<&str> = v.split_whitespace().collect();
    if parts.len() != 6 || parts[5] != "GMT" {
        return None;
    }
    let day: i64 = parts[1].parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])? as i64
        + 1;
    let year: i64 = parts[3].parse().ok()?;
    let hms: Vec<i64> = parts[4]
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
}

/// (year, month, day) to days since 1970-01-01, Howard Hinnant's algorithm.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn statuses() {
        assert_eq!(classify_status(200), Verdict::Done);
        assert_eq!(classify_status(204), Verdict::Done);
        for s in [408, 429, 500, 502, 503, 599] {
            assert_eq!(classify_status(s), Verdict::Retry, "{s}");
        }
        for s in [301, 400, 401, 404, 409, 410, 422] {
            assert_eq!(classify_status(s), Verdict::Fail, "{s}");
        }
    }

    #[test]
    fn first_retry_waits_initial() {
        assert_eq!(next_delay(1, S(1), S(3600), None, 0.99), S(1));
    }

    #[test]
    fn ceiling_doubles_and_caps() {
        assert_eq!(next_delay(2, S(1), S(3600), None, 1.0), S(2));
        assert_eq!(next_delay(5, S(1), S(3600), None, 1.0), S(16));
        assert_eq!(next_delay(30, S(1), S(3600), None, 1.0), S(3600));
        assert_eq!(next_delay(u32::MAX, S(1), S(60), None, 1.0), S(60));
        assert_eq!(next_delay(5, S(1), S(3600), None, 0.0), S(1));
        let mid = next_delay(5, S(1), S(3600), None, 0.5);
        assert!(mid > S(1) && mid < S(16), "{mid:?}");
    }

    #[test]
    fn retry_after_is_honoured_up_to_max() {
        assert_eq!(next_delay(1, S(1), S(3600), Some(S(30)), 0.0), S(30));
        assert_eq!(next_delay(1, S(1), S(60), Some(S(86_400)), 0.0), S(60));
        // A shorter Retry-After does not shorten our own backoff.
        assert_eq!(next_delay(5, S(1), S(3600), Some(S(1)), 1.0), S(16));
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("120", 0), Some(S(120)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777 - 10),
            Some(S(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_777 + 10),
            Some(S(0))
        );
        assert_eq!(parse_retry_after("soon", 0), None);
    }
}
