//! Country and network (AS) sets from a MaxMind DB file (`.mmdb`):
//! `policer rule import --mmdb FILE --country CC --asn N`, a `[[set]]` with
//! `mmdb`, `country` and `asn`, and CrowdSec's `Country` and `AS`
//! decisions (`[crowdsec] country_mmdb`, `asn_mmdb`). Read with the
//! `maxminddb` crate; the whole search tree is walked once and every
//! network whose record names a wanted country or AS is kept.
//!
//! The layouts read: GeoLite2/GeoIP2 Country and City and DB-IP lite
//! (`country.iso_code`), IPinfo lite (`country_code`), GeoLite2/GeoIP2 ASN
//! and DB-IP ASN lite (`autonomous_system_number`) and IPinfo lite (`asn`,
//! `"AS123"`). An IPv6 database holds IPv4 at `::/96`, which the crate
//! reports as IPv4, and may alias it (`::ffff:0:0/96`, `2002::/16`), which
//! it skips; networks a database holds under `::ffff:0:0/96` of their own
//! are taken as the IPv4 networks they are. Each network is listed once.

use std::{collections::HashMap, fmt, net::IpAddr, path::Path, sync::Arc};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    text::excerpt,
};

/// What to take from a database: countries (ISO 3166-1 alpha-2, upper
/// case) and AS numbers; a network matching either is taken.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Query {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub country: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asn: Vec<u32>,
}

impl Query {
    /// From the CLI's `--country DE,FR` and `--asn 64500,AS64501`: at
    /// least one of them.
    pub fn parse(country: Option<&str>, asn: Option<&str>) -> Result<Query> {
        let q = Query {
            country: country.map(parse_countries).transpose()?.unwrap_or_default(),
            asn: asn.map(parse_asns).transpose()?.unwrap_or_default(),
        };
        q.check()?;
        Ok(q)
    }

    /// At least one country or AS, each well formed (a config's lists).
    pub fn check(&self) -> Result<()> {
        if self.country.is_empty() && self.asn.is_empty() {
            return Err(Error::Invalid(
                "an MMDB set needs --country CC[,CC…] or --asn N[,N…] (`country`, `asn` in a [[set]])".into(),
            ));
        }
        for c in &self.country {
            country(c)?;
        }
        Ok(())
    }

    /// `country DE, FR; AS 64500` for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.country.is_empty() {
            parts.push(format!("country {}", self.country.join(", ")));
        }
        if !self.asn.is_empty() {
            parts.push(format!("AS {}", self.asn.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")));
        }
        parts.join("; ")
    }
}

/// A country code: two ASCII letters, taken in upper case.
pub fn country(s: &str) -> Result<String> {
    let t = s.trim();
    if t.len() == 2 && t.bytes().all(|b| b.is_ascii_alphabetic()) {
        Ok(t.to_ascii_uppercase())
    } else {
        Err(Error::Invalid(format!("country '{}': an ISO 3166-1 alpha-2 code of two letters (DE, FR, US)", excerpt(s))))
    }
}

/// An AS number: `64500`, `AS64500` or `as64500`.
pub fn asn(s: &str) -> Result<u32> {
    let t = s.trim();
    let digits = t.strip_prefix("AS").or_else(|| t.strip_prefix("as")).unwrap_or(t);
    match digits.parse::<u32>() {
        Ok(n) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(Error::Invalid(format!("AS number '{}': a number, 64500 or AS64500", excerpt(s)))),
    }
}

/// `DE,fr, US` → `["DE", "FR", "US"]` (sorted, each once).
pub fn parse_countries(s: &str) -> Result<Vec<String>> {
    let mut v = s.split(',').filter(|p| !p.trim().is_empty()).map(country).collect::<Result<Vec<_>>>()?;
    v.sort();
    v.dedup();
    Ok(v)
}

/// `64500,AS64501` → `[64500, 64501]` (sorted, each once).
pub fn parse_asns(s: &str) -> Result<Vec<u32>> {
    let mut v = s.split(',').filter(|p| !p.trim().is_empty()).map(asn).collect::<Result<Vec<_>>>()?;
    v.sort();
    v.dedup();
    Ok(v)
}

/// What put a network in a set: its country or its AS.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Label {
    Country(String),
    As(u32),
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Country(c) => write!(f, "country {c}"),
            Label::As(n) => write!(f, "AS{n}"),
        }
    }
}

impl Label {
    /// The label of a state file's comment (`country DE`, `AS64500`).
    pub fn parse(s: &str) -> Option<Label> {
        let s = s.trim();
        if let Some(c) = s.strip_prefix("country ") {
            return country(c).ok().map(Label::Country);
        }
        s.strip_prefix("AS").and_then(|n| n.parse().ok()).map(Label::As)
    }
}

/// Each entry of a set and what put it there, sorted by entry: what
/// `inspect` names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    names: Vec<Label>,
    of: Vec<(IpNet, u32)>,
}

impl Labels {
    /// From (entry, label) pairs, in any order.
    pub fn new(pairs: impl IntoIterator<Item = (IpNet, Label)>) -> Labels {
        let mut idx: HashMap<Label, u32> = HashMap::new();
        let mut names = Vec::new();
        let mut of: Vec<(IpNet, u32)> = pairs
            .into_iter()
            .map(|(n, l)| {
                let i = *idx.entry(l.clone()).or_insert_with(|| {
                    names.push(l);
                    names.len() as u32 - 1
                });
                (n, i)
            })
            .collect();
        of.sort_by_key(|p| p.0);
        of.dedup_by_key(|p| p.0);
        Labels { names, of }
    }

    /// What put `net` in the set.
    pub fn get(&self, net: &IpNet) -> Option<&Label> {
        let i = self.of.binary_search_by(|p| p.0.cmp(net)).ok()?;
        self.names.get(self.of[i].1 as usize)
    }

    pub fn len(&self) -> usize {
        self.of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.of.is_empty()
    }

    /// The labels of a state file's lines (`10.0.0.0/8 # country FR`).
    pub fn from_text(text: &[u8]) -> Labels {
        Labels::new(text.split(|b| *b == b'\n').filter_map(|raw| {
            let line = std::str::from_utf8(raw).ok()?;
            let (net, label) = line.split_once('#')?;
            Some((net.trim().parse::<IpNet>().ok()?, Label::parse(label)?))
        }))
    }
}

/// The networks a query took from a database.
#[derive(Clone, Debug)]
pub struct Selected {
    /// Sorted, each once; IPv4 first.
    pub entries: Vec<IpNet>,
    pub labels: Arc<Labels>,
    /// Networks with data in the database (all of them, taken or not).
    pub networks: usize,
    /// Networks held under `::ffff:0:0/96`, taken as IPv4.
    pub mapped: usize,
    /// The database's type (`GeoLite2-Country`), for messages.
    pub database_type: String,
}

impl Selected {
    /// The set's list as a state file keeps it: a line per entry with
    /// what put it there as a comment (`10.0.0.0/8 # country FR`), which
    /// the list parser skips and [`Labels::from_text`] reads back.
    pub fn text(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * 32);
        for e in &self.entries {
            match self.labels.get(e) {
                Some(l) => out.extend_from_slice(format!("{e} # {l}\n").as_bytes()),
                None => out.extend_from_slice(format!("{e}\n").as_bytes()),
            }
        }
        out
    }
}

/// A database read whole into memory (the file may be replaced under us:
/// the bytes are ours), its tree checked.
pub struct Db {
    reader: maxminddb::Reader<Vec<u8>>,
    shown: String,
}

/// The most bytes a database may have (a GeoLite2 City is ~70 MB).
pub const MAX_BYTES: u64 = 1 << 30;

/// Opens `path` (named `shown` in messages): a regular file of at most
/// [`MAX_BYTES`] whose metadata reads. A file cut short loses its
/// metadata (at its end) and says so; nothing is taken.
pub fn open(path: &Path, shown: &str) -> Result<Db> {
    let limit = crate::files::Limit { what: "an MMDB database", max_bytes: MAX_BYTES };
    let bytes = crate::files::read_regular(path, limit).map_err(|e| {
        Error::Invalid(match e {
            crate::files::ReadError::Io(e) => format!("{shown}: {e}"),
            e => format!("{shown} {e}"),
        })
    })?;
    from_bytes(bytes, shown)
}

/// [`open`] of bytes already read.
pub fn from_bytes(bytes: Vec<u8>, shown: &str) -> Result<Db> {
    let n = bytes.len();
    let reader = maxminddb::Reader::from_source(bytes).map_err(|e| {
        Error::Invalid(format!("{shown} ({n} bytes) is not a whole MaxMind DB file: {e} (cut short, or not an .mmdb?)"))
    })?;
    // Not `Reader::verify`: it also insists on metadata no lookup needs
    // (a description), which some vendors' files may lack. A file cut
    // short has lost its metadata, at its end; a damaged tree or record is
    // an error of the walk ([`Db::select`]).
    Ok(Db { reader, shown: shown.to_string() })
}

/// The fields of a record read: the layouts differ by vendor.
#[derive(Deserialize, Default)]
struct Record {
    /// GeoLite2/GeoIP2, DB-IP: `country.iso_code` (IPinfo lite: the
    /// country's name, a string).
    #[serde(default)]
    country: Option<CountryField>,
    /// IPinfo lite: `country_code`.
    #[serde(default)]
    country_code: Option<String>,
    /// GeoLite2/GeoIP2 ASN, DB-IP ASN lite: a uint32 in MaxMind's files,
    /// any unsigned width in others' (read through `AsnField`, which takes
    /// them all).
    #[serde(default)]
    autonomous_system_number: Option<AsnField>,
    /// IPinfo lite: `"AS13335"` (or a number).
    #[serde(default)]
    asn: Option<AsnField>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum CountryField {
    Map {
        #[serde(default)]
        iso_code: Option<String>,
    },
    Name(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum AsnField {
    Number(u32),
    Text(String),
}

impl Record {
    fn country(&self) -> Option<String> {
        let iso = match &self.country {
            Some(CountryField::Map { iso_code }) => iso_code.as_deref(),
            _ => None,
        };
        let c = iso.or(self.country_code.as_deref())?;
        Some(c.trim().to_ascii_uppercase())
    }

    fn asn(&self) -> Option<u32> {
        let of = |f: &AsnField| match f {
            AsnField::Number(n) => Some(*n),
            AsnField::Text(t) => asn(t).ok(),
        };
        self.autonomous_system_number.as_ref().and_then(of).or_else(|| self.asn.as_ref().and_then(of))
    }

    /// The label under which `q` takes a network of this record.
    fn matches(&self, q: &Query) -> Option<Label> {
        if !q.country.is_empty()
            && let Some(c) = self.country()
            && q.country.binary_search(&c).is_ok()
        {
            return Some(Label::Country(c));
        }
        match self.asn() {
            Some(a) if q.asn.binary_search(&a).is_ok() => Some(Label::As(a)),
            _ => None,
        }
    }
}

/// A network as the set holds it: under `::ffff:0:0/96`, the IPv4 network
/// it maps (and whether it was).
fn as_set_entry(addr: IpAddr, len: u8) -> Option<(IpNet, bool)> {
    let net = IpNet::new(addr, len).ok()?.trunc();
    if let (IpAddr::V6(a), len) = (net.addr(), net.prefix_len())
        && len >= 96
        && let Some(v4) = a.to_ipv4_mapped()
    {
        return Some((IpNet::V4(Ipv4Net::new(v4, len - 96).ok()?), true));
    }
    Some((net, false))
}

/// What a walk of the whole tree took ([`Db::walk`]).
struct Walked {
    /// Each network taken, with its label.
    pairs: Vec<(IpNet, Label)>,
    /// Networks with data in the database, taken or not.
    networks: usize,
    /// Networks taken from under `::ffff:0:0/96`.
    mapped: usize,
}

impl Db {
    /// The database's type (`GeoLite2-Country`).
    pub fn database_type(&self) -> &str {
        &self.reader.metadata().database_type
    }

    /// Every network of the database with the label `pick` gives its
    /// record (none: not taken), IPv4 as IPv4; how many networks it holds
    /// in all, and how many were under `::ffff:0:0/96`. A database with no
    /// network at all is refused (an empty download).
    fn walk(&self, pick: impl Fn(&Record) -> Option<Label>) -> Result<Walked> {
        let bad = |e: maxminddb::MaxMindDbError| Error::Invalid(format!("{}: {e} (a damaged database?)", self.shown));
        // Records are shared by many networks: decoded once each.
        let mut seen: HashMap<usize, Option<Label>> = HashMap::new();
        let (mut networks, mut mapped) = (0usize, 0usize);
        let mut pairs = Vec::new();
        for r in self.reader.networks(maxminddb::WithinOptions::default()).map_err(bad)? {
            let r = r.map_err(bad)?;
            networks += 1;
            let Some(off) = r.offset() else { continue };
            let label = match seen.get(&off) {
                Some(l) => l.clone(),
                None => {
                    // Every field is optional: a record that does not
                    // decode as a map is a damaged database.
                    let l = r.decode::<Record>().map_err(bad)?.and_then(|rec| pick(&rec));
                    seen.insert(off, l.clone());
                    l
                }
            };
            let Some(label) = label else { continue };
            let n = r.network().map_err(bad)?;
            let Some((net, m)) = as_set_entry(n.network(), n.prefix()) else { continue };
            mapped += usize::from(m);
            pairs.push((net, label));
        }
        if networks == 0 {
            return Err(Error::Invalid(format!(
                "{} holds no network (an empty database: a failed download?)",
                self.shown
            )));
        }
        Ok(Walked { pairs, networks, mapped })
    }

    /// Every network of the database whose record names a country or AS
    /// of `q` (both families), each once. A database with no network at
    /// all is refused (an empty download); so is a query that takes none
    /// (naming the database's type: an ASN database has no countries).
    pub fn select(&self, q: &Query) -> Result<Selected> {
        let mut q = q.clone();
        q.country.sort();
        q.asn.sort();
        let Walked { pairs, networks, mapped } = self.walk(|rec| rec.matches(&q))?;
        let labels = Labels::new(pairs);
        let entries: Vec<IpNet> = labels.of.iter().map(|p| p.0).collect();
        if entries.is_empty() {
            return Err(Error::Invalid(format!(
                "{} ({}, {networks} networks) has no network of {}",
                self.shown,
                self.database_type(),
                q.describe()
            )));
        }
        Ok(Selected { entries, labels: Arc::new(labels), networks, mapped, database_type: self.database_type().into() })
    }

    /// Every network of the database by its country (`country`) or its AS:
    /// what CrowdSec's `Country` and `AS` decisions stand for. Each list
    /// sorted, each network once.
    pub fn by_label(&self, country: bool) -> Result<HashMap<Label, Vec<IpNet>>> {
        let pick = |rec: &Record| if country { rec.country().map(Label::Country) } else { rec.asn().map(Label::As) };
        let Walked { pairs, networks, .. } = self.walk(pick)?;
        if pairs.is_empty() {
            return Err(Error::Invalid(format!(
                "{} ({}, {networks} networks) names no {} (a {} database?)",
                self.shown,
                self.database_type(),
                if country { "country" } else { "AS" },
                if country { "Country" } else { "ASN" }
            )));
        }
        let mut out: HashMap<Label, Vec<IpNet>> = HashMap::new();
        for (n, l) in pairs {
            out.entry(l).or_default().push(n);
        }
        for v in out.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        Ok(out)
    }
}

/// Opens `path` and takes the networks of `q` from it: the one call of an
/// import and a `[[set]]`.
pub fn read(path: &Path, shown: &str, q: &Query) -> Result<Selected> {
    open(path, shown)?.select(q)
}

#[cfg(test)]
mod tests;
