//! Source and destination prefixes as operators write them: one parser
//! for rules, classes (`--dst`), bans and the CLI.

use std::{net::IpAddr, str::FromStr};

use ipnet::IpNet;

use crate::error::{Error, Result};

/// Parses a prefix. A bare address means one host (/32 or /128); host bits
/// set after the prefix length are refused rather than silently cleared,
/// since `203.0.113.5/24` is more often a typo than a wish.
pub fn parse_prefix(s: &str) -> Result<IpNet> {
    let s = s.trim();
    if s.is_empty() {
        return Err(Error::Invalid("empty prefix".into()));
    }
    if !s.contains('/') {
        let a = IpAddr::from_str(s).map_err(|_| Error::Invalid(format!("'{s}' is not an IP address or prefix")))?;
        return Ok(IpNet::from(a));
    }
    let (addr, len) = s.split_once('/').expect("has /");
    let a = IpAddr::from_str(addr).map_err(|_| Error::Invalid(format!("'{addr}' in '{s}' is not an IP address")))?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| *l <= max)
        .ok_or_else(|| Error::Invalid(format!("prefix length '/{len}' in '{s}' must be 0..={max}")))?;
    let net = IpNet::new(a, len).map_err(|e| Error::Invalid(format!("'{s}': {e}")))?;
    if net.trunc() != net {
        return Err(Error::Invalid(format!("'{s}' has host bits set; did you mean {}?", net.trunc())));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(parse_prefix("203.0.113.0/24").unwrap().to_string(), "203.0.113.0/24");
        assert_eq!(parse_prefix("203.0.113.7").unwrap().to_string(), "203.0.113.7/32");
        assert_eq!(parse_prefix("2001:db8::/32").unwrap().to_string(), "2001:db8::/32");
        for bad in [
            "",
            "203.0.113.0/33",
            "2001:db8::/129",
            "203.0.113.5/24",
            "300.1.1.1/8",
            "10.0.0.0/-1",
            "10.0.0.0/",
            "foo/8",
            "10.0.0.0/8/8",
        ] {
            assert!(parse_prefix(bad).is_err(), "{bad} accepted");
        }
        let e = parse_prefix("203.0.113.5/24").unwrap_err().to_string();
        assert!(e.contains("did you mean 203.0.113.0/24"), "{e}");
    }
}
