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

#[cfg(test)]
mod tests {
    use super::*;

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
