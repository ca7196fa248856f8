//! Durations as operators write them: `500ms`, `30s`, `10m`, `1h`, `7d`,
//! or several of those together (`1h30m`). Whole numbers only, no sign, no
//! spaces; zero is refused (a ban or a rule that ends before it starts is a
//! typo, not a wish). Hand-written rather than a crate's: the grammar is
//! five units, and the errors must name what was wrong.

use std::time::Duration;

use crate::error::{Error, Result};

/// The longest duration accepted: 10 years, so that an end time in ns of
/// the monotonic clock or in Unix seconds never overflows.
pub const MAX: Duration = Duration::from_secs(10 * 365 * 86_400);

/// Parses a duration (see the module doc).
pub fn parse(s: &str) -> Result<Duration> {
    let bad = |why: &str| {
        Error::Invalid(format!(
            "bad duration '{s}': {why} (write a whole number and a unit: 500ms, 30s, 10m, 1h, 7d; or several, as in 1h30m)"
        ))
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad("empty"));
    }
    if t.starts_with('-') {
        return Err(bad("negative"));
    }
    let mut total: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad("expected a number"));
        }
        let n: u128 = rest[..digits].parse().map_err(|_| bad("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        let ns: u128 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "" if rest.starts_with('.') => return Err(bad("whole numbers only")),
            "" if !rest.is_empty() => return Err(bad(&format!("unexpected '{}'", rest.chars().next().unwrap_or(' ')))),
            "" => return Err(bad("missing unit")),
            _ => return Err(bad(&format!("unknown unit '{unit}'"))),
        };
        total = total.saturating_add(n.saturating_mul(ns));
        rest = &rest[unit_len..];
    }
    if total == 0 {
        return Err(bad("must be more than zero"));
    }
    if total > MAX.as_nanos() {
        return Err(bad("longer than 10 years"));
    }
    Ok(Duration::from_nanos(total as u64))
}

/// A duration in the shortest form [`parse`] reads back exactly: `1h30m`,
/// `500ms`, `7d`.
pub fn format(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, len) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)] {
        if ms >= len {
            out.push_str(&format!("{}{unit}", ms / len));
            ms %= len;
        }
    }
    out
}

/// Unix milliseconds as RFC 3339 UTC: `2026-11-25T01:02:03.500Z` (the
/// fraction only when there is one). How expiries are written in the
/// config file and shown.
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let frac = if ms == 0 { String::new() } else { format!(".{ms:03}") };
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}{frac}Z")
}

/// Parses what [`rfc3339`] writes (UTC, `Z`, an optional fraction of up
/// to 9 digits, kept to the millisecond) back into Unix milliseconds.
pub fn parse_rfc3339(s: &str) -> Result<u64> {
    let bad = || Error::Invalid(format!("bad time '{s}': write it as 2026-11-25T01:02:03Z (UTC)"));
    let t = s.trim();
    let t = t.strip_suffix('Z').or_else(|| t.strip_suffix('z')).ok_or_else(bad)?;
    let (date, time) = t.split_once(['T', 't', ' ']).ok_or_else(bad)?;
    let num = |x: &str, len: usize| -> Result<i64> {
        if x.len() != len || !x.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        x.parse().map_err(|_| bad())
    };
    let mut dp = date.split('-');
    let (y, m, d) = match (dp.next(), dp.next(), dp.next(), dp.next()) {
        (Some(y), Some(m), Some(d), None) => (num(y, 4)?, num(m, 2)?, num(d, 2)?),
        _ => return Err(bad()),
    };
    let (hms, frac) = time.split_once('.').map_or((time, None), |(a, b)| (a, Some(b)));
    let mut tp = hms.split(':');
    let (hh, mm, ss) = match (tp.next(), tp.next(), tp.next(), tp.next()) {
        (Some(h), Some(m), Some(s), None) => (num(h, 2)?, num(m, 2)?, num(s, 2)?),
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 || y < 1970 {
        return Err(bad());
    }
    let ms = match frac {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{f:0<3}")[..3].parse::<i64>().map_err(|_| bad())?
        }
        Some(_) => return Err(bad()),
    };
    // A civil date to days since 1970-01-01.
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Ok((secs * 1000 + ms) as u64)
}

/// CLOCK_MONOTONIC in ns: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Now, in Unix milliseconds.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_032_523_500), "2025-11-25T01:02:03.500Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        for ms in [0u64, 1, 999, 1_764_032_523_500, 951_782_400_000, 4_102_444_800_000, 1_709_164_800_123] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)).unwrap(), ms, "{}", rfc3339(ms));
        }
        assert_eq!(parse_rfc3339("2025-11-25T01:02:03.5Z").unwrap(), 1_764_032_523_500);
        for bad in ["", "2025-11-25", "2025-11-25T01:02:03", "2025-13-01T00:00:00Z", "25-11-25T01:02:03Z", "x"] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn units_and_compounds() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse(" 2s ").unwrap(), Duration::from_secs(2));
    }

    #[test]
    fn bad_input_is_named() {
        for (s, why) in [
            ("0s", "more than zero"),
            ("0ms", "more than zero"),
            ("-1m", "negative"),
            ("10x", "unknown unit 'x'"),
            ("10", "missing unit"),
            ("", "empty"),
            ("s", "expected a number"),
            ("1.5s", "whole numbers only"),
            ("1 s", "unexpected ' '"),
            ("1é", "unexpected 'é'"),
            ("99999999999999999999999999999999999999999d", "number too large"),
            ("4000d", "10 years"),
        ] {
            let e = parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn format_reads_back() {
        for s in ["500ms", "30s", "10m", "1h", "7d", "1h30m", "1d2h3m4s5ms"] {
            let d = parse(s).unwrap();
            assert_eq!(format(d), s);
            assert_eq!(parse(&format(d)).unwrap(), d);
        }
    }
}
