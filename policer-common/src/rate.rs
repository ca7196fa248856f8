//! Parsing of rates and bursts as operators write them.
//!
//! Packet rates: `500pps`, `10kpps`, `1.5Mpps` (k = 10^3, M = 10^6, G = 10^9).
//! Bit rates, tc-style: `64kbit`, `100mbit`, `10gbit` (decimal prefixes);
//! they switch a rule to byte mode. Bursts: a packet count (`200`, `2k`),
//! or in byte mode a size (`1500b`, `64kb`, `1mb`; k = 1024 as in tc).

use core::fmt;
use std::string::{String, ToString};

use crate::bucket::{MAX_BURST, Rule, RuleError};

/// A parsed rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rate {
    /// Packets per second.
    Pps(u64),
    /// Bits per second (byte mode).
    Bps(u64),
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Rate::Pps(v) => write!(f, "{}pps", si(v)),
            Rate::Bps(v) => write!(f, "{}bit", si(v).to_lowercase()),
        }
    }
}

/// `10000` -> `10k`, `1500000` -> `1.5M`.
fn si(v: u64) -> String {
    for (div, p) in [(1_000_000_000u64, "G"), (1_000_000, "M"), (1_000, "k")] {
        if v >= div && (v * 1000).is_multiple_of(div) {
            let whole = v / div;
            let frac = v % div * 1000 / div;
            return if frac == 0 {
                std::format!("{whole}{p}")
            } else {
                let f = std::format!("{frac:03}");
                std::format!("{whole}.{}{p}", f.trim_end_matches('0'))
            };
        }
    }
    v.to_string()
}

/// Why a rate or burst string was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    Empty,
    Number(String),
    Unit(String),
    NotWhole(String),
    Overflow(String),
    Range(RuleError),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Empty => write!(f, "empty value"),
            ParseError::Number(s) => write!(f, "'{s}' does not start with a non-negative number"),
            ParseError::Unit(s) => write!(
                f,
                "unknown unit in '{s}': rates take pps, kpps, Mpps, Gpps, bit, kbit, mbit, gbit, tbit; \
                 bursts take a packet count or b, kb, mb, gb"
            ),
            ParseError::NotWhole(s) => {
                write!(f, "'{s}' is not a whole number of packets, bits or bytes")
            }
            ParseError::Overflow(s) => write!(f, "'{s}' is too large"),
            ParseError::Range(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Splits `12.5kpps` into the number scaled by `mult` and checks it is whole.
fn scaled(s: &str, num: &str, mult: u64) -> Result<u64, ParseError> {
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(ParseError::Number(s.into()));
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::Number(s.into()));
    }
    if frac.len() > 18 {
        return Err(ParseError::NotWhole(s.into()));
    }
    let int_v: u128 =
        if int.is_empty() { 0 } else { int.parse::<u128>().map_err(|_| ParseError::Overflow(s.into()))? };
    let frac_v: u128 = if frac.is_empty() { 0 } else { frac.parse().unwrap_or(0) };
    let denom = 10u128.pow(frac.len() as u32);
    let total = int_v
        .checked_mul(denom)
        .and_then(|v| v.checked_add(frac_v))
        .and_then(|v| v.checked_mul(mult as u128))
        .ok_or_else(|| ParseError::Overflow(s.into()))?;
    if total % denom != 0 {
        return Err(ParseError::NotWhole(s.into()));
    }
    u64::try_from(total / denom).map_err(|_| ParseError::Overflow(s.into()))
}

/// Number and unit of `s`, the unit lower-cased.
fn split(s: &str) -> Result<(&str, String), ParseError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(ParseError::Empty);
    }
    let at = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(at);
    if num.is_empty() {
        return Err(ParseError::Number(s.into()));
    }
    Ok((num, unit.trim().to_ascii_lowercase()))
}

/// The least default burst in packets: a TCP client's SYN, its ACK and
/// its first request go out within one round trip, faster than any low
/// rate refills; with a burst of 1 the ACK and the request are dropped and
/// the connection waits for retransmissions (measured: tests/tests/veth.rs,
/// `a_tcp_connection_opens_untouched_under_a_low_default_rate`). iptables'
/// hashlimit and nftables' limit default to 5 as well.
pub const MIN_DEFAULT_BURST_PACKETS: u64 = 5;

impl Rate {
    /// Parses `500pps`, `10kpps`, `1.5Mpps`, `64kbit`, `10gbit`.
    pub fn parse(s: &str) -> Result<Rate, ParseError> {
        let (num, unit) = split(s)?;
        let (mult, bits) = match unit.as_str() {
            "pps" => (1, false),
            "kpps" => (1_000, false),
            "mpps" => (1_000_000, false),
            "gpps" => (1_000_000_000, false),
            "bit" => (1, true),
            "kbit" => (1_000, true),
            "mbit" => (1_000_000, true),
            "gbit" => (1_000_000_000, true),
            "tbit" => (1_000_000_000_000, true),
            _ => return Err(ParseError::Unit(s.trim().into())),
        };
        let v = scaled(s.trim(), num, mult)?;
        Ok(if bits { Rate::Bps(v) } else { Rate::Pps(v) })
    }

    /// True when the rate charges by bytes.
    pub fn is_bytes(&self) -> bool {
        matches!(self, Rate::Bps(_))
    }

    /// Parses a burst for this rate: packets for a packet rate, bytes for a
    /// bit rate.
    pub fn parse_burst(&self, s: &str) -> Result<u64, ParseError> {
        let (num, unit) = split(s)?;
        let mult = match (self, unit.as_str()) {
            (Rate::Pps(_), "" | "p" | "pkt" | "pkts" | "packets") => 1,
            (Rate::Pps(_), "k") => 1_000,
            (Rate::Pps(_), "m") => 1_000_000,
            (Rate::Bps(_), "" | "b") => 1,
            (Rate::Bps(_), "k" | "kb") => 1 << 10,
            (Rate::Bps(_), "m" | "mb") => 1 << 20,
            (Rate::Bps(_), "g" | "gb") => 1 << 30,
            _ => return Err(ParseError::Unit(s.trim().into())),
        };
        let v = scaled(s.trim(), num, mult)?;
        if v == 0 || v > MAX_BURST {
            return Err(ParseError::Range(RuleError::BurstOutOfRange));
        }
        Ok(v)
    }

    /// The kernel rule for this rate and `burst` (packets or bytes).
    pub fn rule(&self, burst: u64) -> Result<Rule, ParseError> {
        match *self {
            Rate::Pps(r) => Rule::packets(r, burst),
            Rate::Bps(r) => Rule::bytes(r, burst),
        }
        .map_err(ParseError::Range)
    }

    /// A default burst: 1/50 s of traffic, at least
    /// [`MIN_DEFAULT_BURST_PACKETS`] packets / 1500 bytes.
    pub fn default_burst(&self) -> u64 {
        match *self {
            Rate::Pps(r) => (r / 50).max(MIN_DEFAULT_BURST_PACKETS),
            Rate::Bps(r) => (r / 8 / 50).max(1500),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_bursts_take_a_handshake_at_low_rates() {
        assert_eq!(Rate::Pps(10).default_burst(), 5);
        assert_eq!(Rate::Pps(250).default_burst(), 5);
        assert_eq!(Rate::Pps(300).default_burst(), 6);
        assert_eq!(Rate::Pps(10_000).default_burst(), 200);
        assert_eq!(Rate::Bps(1_000_000).default_burst(), 2500);
        assert_eq!(Rate::Bps(8_000).default_burst(), 1500);
    }

    #[test]
    fn good_rates() {
        for (s, r) in [
            ("500pps", Rate::Pps(500)),
            ("10kpps", Rate::Pps(10_000)),
            ("1.5Mpps", Rate::Pps(1_500_000)),
            ("1.5mpps", Rate::Pps(1_500_000)),
            ("100Mpps", Rate::Pps(100_000_000)),
            (" 7 pps ", Rate::Pps(7)),
            ("64kbit", Rate::Bps(64_000)),
            ("100mbit", Rate::Bps(100_000_000)),
            ("10gbit", Rate::Bps(10_000_000_000)),
            ("0.4tbit", Rate::Bps(400_000_000_000)),
        ] {
            assert_eq!(Rate::parse(s), Ok(r), "{s}");
        }
    }

    #[test]
    fn bad_rates() {
        for s in [
            "",
            "pps",
            "-5pps",
            "5",
            "5p",
            "5 bps",
            "1.5pps",
            "1e3pps",
            "abc",
            "10kpp",
            "1..5kpps",
            "99999999999999999999999999pps",
        ] {
            assert!(Rate::parse(s).is_err(), "{s} parsed");
        }
    }

    #[test]
    fn rates_out_of_range_fail_as_rules() {
        assert!(Rate::parse("0pps").unwrap().rule(1).is_err());
        assert!(Rate::parse("101Mpps").unwrap().rule(1).is_err());
        assert!(Rate::parse("999bit").unwrap().rule(1500).is_err());
        assert!(Rate::parse("401gbit").unwrap().rule(1500).is_err());
        assert!(Rate::parse("1pps").unwrap().rule(1).is_ok());
    }

    #[test]
    fn bursts() {
        let p = Rate::Pps(1000);
        assert_eq!(p.parse_burst("200"), Ok(200));
        assert_eq!(p.parse_burst("2k"), Ok(2000));
        assert!(p.parse_burst("0").is_err());
        assert!(p.parse_burst("1.5").is_err());
        assert!(p.parse_burst("64kb").is_err());
        assert!(p.parse_burst("1000000001").is_err());
        let b = Rate::Bps(64_000);
        assert_eq!(b.parse_burst("1500b"), Ok(1500));
        assert_eq!(b.parse_burst("64kb"), Ok(65_536));
        assert_eq!(b.parse_burst("1500"), Ok(1500));
        assert!(b.parse_burst("10pkts").is_err());
    }

    #[test]
    fn display_round_trips() {
        for s in ["500pps", "10kpps", "1.5Mpps", "64kbit", "10gbit"] {
            let r = Rate::parse(s).unwrap();
            assert_eq!(Rate::parse(&r.to_string()), Ok(r));
        }
        assert_eq!(Rate::Pps(1_500_000).to_string(), "1.5Mpps");
    }
}
