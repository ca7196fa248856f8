//! Source and destination prefixes as operators write them: one parser
//! for rules, classes (`--dst`), bans and the CLI.

use std::{net::IpAddr, str::FromStr};

use ipnet::IpNet;

use crate::{
    error::{Error, Result},
    text::excerpt,
};

/// An IPv4-mapped IPv6 prefix (`::ffff:a.b.c.d`, of length 96 or more) as
/// the IPv4 prefix it means (length − 96); `None` for any other address.
/// The program sees an IPv4 frame's source as IPv4, so an IPv6 entry
/// `::ffff:10.0.0.1` would never match: taken as `10.0.0.1`, which is what
/// an operator pasting it from a dual-stack socket's log means.
///
/// A mapped prefix that would be an IPv4 prefix shorter than /8 is an
/// error: `::ffff:0:0/96`, in lists of special-purpose IPv6 space, means
/// "every IPv4-mapped address", and taken as `0.0.0.0/0` it would deny all
/// of IPv4.
pub fn unmap(addr: IpAddr, len: u8) -> std::result::Result<Option<(std::net::Ipv4Addr, u8)>, String> {
    match addr {
        IpAddr::V6(a) if len >= 96 => match a.to_ipv4_mapped() {
            Some(v4) if len < 96 + 8 => Err(format!(
                "{a}/{len} is the IPv4-mapped space of {}/{}, a block shorter than /8; \
                 write the IPv4 prefix if that is what you mean",
                std::net::Ipv4Addr::from(u32::from(v4) & (u32::MAX.checked_shl(32 - u32::from(len - 96)).unwrap_or(0))),
                len - 96
            )),
            Some(v4) => Ok(Some((v4, len - 96))),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// The note that `text` (as typed) was an IPv4-mapped prefix, taken as
/// `net`: for the CLI to print.
pub fn mapped_note(text: &str, net: &IpNet) -> Option<String> {
    (net.addr().is_ipv4() && text.contains(':'))
        .then(|| format!("{} is an IPv4-mapped IPv6 address: taken as the IPv4 {net}", text.trim()))
}

/// Parses a prefix. A bare address means one host (/32 or /128); host bits
/// set after the prefix length are refused rather than silently cleared,
/// since `203.0.113.5/24` is more often a typo than a wish. An IPv4-mapped
/// prefix is the IPv4 one ([`unmap`]).
pub fn parse_prefix(s: &str) -> Result<IpNet> {
    let s = s.trim();
    if s.is_empty() {
        return Err(Error::Invalid("empty prefix".into()));
    }
    if !s.contains('/') {
        let a = IpAddr::from_str(s)
            .map_err(|_| Error::Invalid(format!("'{}' is not an IP address or prefix", excerpt(s))))?;
        return Ok(match unmap(a, 128).map_err(Error::Invalid)? {
            Some((v4, _)) => IpNet::from(IpAddr::V4(v4)),
            None => IpNet::from(a),
        });
    }
    let (addr, len) = s.split_once('/').expect("has /");
    let a = IpAddr::from_str(addr)
        .map_err(|_| Error::Invalid(format!("'{}' in '{}' is not an IP address", excerpt(addr), excerpt(s))))?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    let len: u8 = len.parse().ok().filter(|l| *l <= max).ok_or_else(|| {
        Error::Invalid(format!("prefix length '/{}' in '{}' must be 0 to {max}", excerpt(len), excerpt(s)))
    })?;
    let net = match unmap(a, len).map_err(Error::Invalid)? {
        Some((v4, len)) => IpNet::new(IpAddr::V4(v4), len),
        None => IpNet::new(a, len),
    }
    .map_err(|e| Error::Invalid(format!("'{s}': {e}")))?;
    if net.trunc() != net {
        return Err(Error::Invalid(format!("'{s}' has host bits set; did you mean {}?", net.trunc())));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_mapped_prefix_is_refused_not_all_of_ipv4() {
        assert_eq!(parse_prefix("::ffff:10.0.0.0/104").unwrap().to_string(), "10.0.0.0/8");
        for short in ["::ffff:0:0/96", "::ffff:0.0.0.0/97", "::ffff:128.0.0.0/103"] {
            let e = parse_prefix(short).unwrap_err().to_string();
            assert!(e.contains("a block shorter than /8"), "{short}: {e}");
        }
        let e = parse_prefix("::ffff:0:0/96").unwrap_err().to_string();
        assert!(e.contains("IPv4-mapped space of 0.0.0.0/0"), "{e}");
    }

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

    #[test]
    fn ipv4_mapped_prefixes_are_ipv4() {
        for (typed, want) in [
            ("::ffff:10.0.0.1", "10.0.0.1/32"),
            ("::ffff:10.0.0.1/128", "10.0.0.1/32"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("::FFFF:0a00:0000/104", "10.0.0.0/8"),
        ] {
            let net = parse_prefix(typed).unwrap();
            assert_eq!(net.to_string(), want, "{typed}");
            assert_eq!(
                mapped_note(typed, &net).unwrap(),
                format!("{typed} is an IPv4-mapped IPv6 address: taken as the IPv4 {want}")
            );
        }
        // Shorter than /96, or not mapped: IPv6 as written.
        for v6 in ["::fffe:0:0/95", "::/0", "2001:db8::/32", "::1", "64:ff9b::10.0.0.1"] {
            let net = parse_prefix(v6).unwrap();
            assert!(net.addr().is_ipv6(), "{v6}");
            assert_eq!(mapped_note(v6, &net), None);
        }
        assert_eq!(mapped_note("10.0.0.0/8", &parse_prefix("10.0.0.0/8").unwrap()), None);
        let e = parse_prefix("::ffff:10.0.0.1/104").unwrap_err().to_string();
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
        let e = parse_prefix(&"9".repeat(1000)).unwrap_err().to_string();
        assert!(e.len() < 200 && e.contains("…(1000 bytes)"), "{e}");
    }
}
