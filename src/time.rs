//! Time, in the one unit the project stores: every `*_at` column is unix
//! milliseconds, and JSON shows integer unix seconds. Reading the clock
//! ([`now_ms`], and [`steady_now_ms`] where a jump of the wall clock must
//! not hurry anything) and formatting times as RFC 3339 UTC, without a
//! time crate.
//! No other IO; nothing else in the crate is used.

/// Unix time in milliseconds: the unit of every *_at column.
pub fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The wall clock as far as a long-running process can trust it, in unix
/// ms: never ahead of the wall time at the process's first call plus the
/// monotonic time since. A wall clock that jumps forward while the process
/// runs does not move it (so serve's pruner never deletes a key early);
/// one that jumps back does (that only delays what waits for it).
pub fn steady_now_ms() -> i64 {
    static ANCHOR: std::sync::OnceLock<(i64, std::time::Instant)> = std::sync::OnceLock::new();
    let wall = now_ms();
    let (wall_then, mono_then) = *ANCHOR.get_or_init(|| (wall, std::time::Instant::now()));
    let since = i64::try_from(mono_then.elapsed().as_millis()).unwrap_or(i64::MAX);
    wall.min(wall_then.saturating_add(since))
}

/// Milliseconds to the integer unix seconds of the JSON output.
pub fn ms_to_secs(ms: i64) -> i64 {
    ms.div_euclid(1000)
}

/// Unix seconds as RFC 3339 UTC: `2025-11-30T10:00:00Z`.
pub fn rfc3339_secs(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds:
/// `2025-11-30T10:00:00.123Z`.
pub fn rfc3339_ms(ms: i64) -> String {
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

/// Days since 1970-01-01 of a civil date (the inverse of [`civil_from_days`]).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// An RFC 3339 time (`2025-11-30T10:00:00Z`, `...10:00:00.123456789Z`,
/// `...10:00:00+01:00`; `t` and `z` in either case) as unix seconds, the
/// fraction dropped. None when it is not one.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(range)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (h, mi, s) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut rest = &text[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let n = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 12 {
            return None;
        }
        rest = &fraction[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let o = rest.as_bytes();
            if o.len() != 6 || o[3] != b':' {
                return None;
            }
            let sign = match o[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            if oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
    };
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_422), (2025, 11, 30));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn rfc3339_parses_what_it_formats_and_offsets_and_fractions() {
        for secs in [0, 1_764_460_800, 951_782_400, -86_400] {
            assert_eq!(parse_rfc3339(&rfc3339_secs(secs)), Some(secs));
        }
        assert_eq!(
            parse_rfc3339("2025-11-30T10:00:00.123456789Z"),
            parse_rfc3339("2025-11-30T10:00:00Z")
        );
        assert_eq!(
            parse_rfc3339("2025-11-30T11:00:00+01:00"),
            parse_rfc3339("2025-11-30T10:00:00Z")
        );
        for bad in [
            "",
            "2025-11-30",
            "2025-13-30T10:00:00Z",
            "2025-11-30T10:00:00",
            "2025-11-30T10:00:00.Z",
            "2025-11-30T10:00:00+0100",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_secs(1_764_496_800), "2025-11-30T10:00:00Z");
        assert_eq!(rfc3339_ms(1_764_496_800_123), "2025-11-30T10:00:00.123Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(ms_to_secs(-1), -1);
    }
}
