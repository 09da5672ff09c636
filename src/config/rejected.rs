//! `keep_rejected` and `keep_rejected_bytes`: how long, and how many bytes
//! of, a source's refused deliveries are kept for `idemhook reingest`.

use std::time::Duration;

use super::raw::RawSource;
use super::values::parse_duration;

/// `keep_rejected`'s default: 72 hours.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(72 * 3_600);
/// `keep_rejected_bytes`'s default: 64 MiB.
pub const DEFAULT_KEEP_BYTES: u64 = 64 * 1024 * 1024;

/// The source's (`keep_rejected`, `keep_rejected_bytes`).
pub(super) fn keep_of(rs: &RawSource) -> Result<(Duration, u64), String> {
    let keep = match &rs.keep_rejected {
        Some(s) => parse_duration(s).map_err(|e| format!("keep_rejected: {e}"))?,
        None => DEFAULT_KEEP,
    };
    let bytes = match &rs.keep_rejected_bytes {
        Some(s) => parse_size(s).map_err(|e| format!("keep_rejected_bytes: {e}"))?,
        None => DEFAULT_KEEP_BYTES,
    };
    Ok((keep, bytes))
}

/// Parses a size: `65536`, `512KiB`, `64MiB`, `1GiB` (also `KB`, `MB`,
/// `GB` as powers of 1000, and `B`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let s = text.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let hint = "expected a size such as 65536, 512KiB, 64MiB or 1GiB";
    if digits == 0 || digits > 15 {
        return Err(format!("invalid size {text:?}: {hint}"));
    }
    let number: u64 = s[..digits]
        .parse()
        .map_err(|_| format!("invalid size {text:?}: {hint}"))?;
    let unit: u64 = match s[digits..].trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(format!("invalid size {text:?}: {hint}")),
    };
    number
        .checked_mul(unit)
        .ok_or_else(|| format!("invalid size {text:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_and_nonsense_is_refused() {
        assert_eq!(parse_size("64MiB"), Ok(64 * 1024 * 1024));
        assert_eq!(parse_size("512KiB"), Ok(512 * 1024));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("2 MB"), Ok(2_000_000));
        assert_eq!(parse_size("0B"), Ok(0));
        for bad in [
            "",
            "MiB",
            "64 mebibytes",
            "-1",
            "1.5MiB",
            "99999999999999999GiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} was accepted");
        }
    }
}
