//! The config file's keys, once: every key of every table (`[daemon]`,
//! `[[rule]]`, `[[set]]`, `[crowdsec]`) with its kind, its default and its
//! help, in [`KEYS`].
//!
//! - The reader (`read.rs`) looks each key it meets up here ([`find`]): a
//!   key not in [`KEYS`] is unknown, and the error names the table's keys
//!   from here ([`listed`]). It then dispatches on the key's [`Field`],
//!   with matches that are exhaustive: a key added here without a reading
//!   does not compile, and the reader cannot take a key that is not here.
//! - policer.toml(5) (`cli/docs.rs`) renders its tables and key lists from
//!   [`TABLES`] and [`KEYS`].
//! - serde's structs ([`Config`], [`DaemonConfig`], [`RuleConfig`],
//!   [`SetConfig`], [`CrowdsecConfig`]) write the file and carry rules on
//!   the wire; a test reads their field names (through a probe
//!   deserializer) and compares them with the keys here.
//!
//! [`Config`]: super::Config
//! [`DaemonConfig`]: super::DaemonConfig
//! [`RuleConfig`]: crate::rules::RuleConfig
//! [`SetConfig`]: super::SetConfig
//! [`CrowdsecConfig`]: crate::crowdsec::CrowdsecConfig

/// A table of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Daemon,
    Rule,
    Set,
    Crowdsec,
    Chain,
    Global,
}

impl Table {
    /// Its name in the file: `daemon`, `rule`, `set`, `crowdsec`.
    pub const fn name(self) -> &'static str {
        match self {
            Table::Daemon => "daemon",
            Table::Rule => "rule",
            Table::Set => "set",
            Table::Crowdsec => "crowdsec",
            Table::Chain => "chain",
            Table::Global => "global",
        }
    }

    /// The table named `name` at the top of the file.
    pub fn named(name: &str) -> Option<Table> {
        TABLES.iter().map(|t| t.table).find(|t| t.name() == name)
    }
}

/// What the reader does with a key's value: which setting it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Daemon(DaemonField),
    Rule(RuleField),
    Set(SetField),
    Crowdsec(CrowdsecField),
    Chain(ChainField),
    Global(GlobalField),
}

impl Field {
    pub const fn table(self) -> Table {
        match self {
            Field::Daemon(_) => Table::Daemon,
            Field::Rule(_) => Table::Rule,
            Field::Set(_) => Table::Set,
            Field::Crowdsec(_) => Table::Crowdsec,
            Field::Chain(_) => Table::Chain,
            Field::Global(_) => Table::Global,
        }
    }
}

/// `[daemon]`'s settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DaemonField {
    Interfaces,
    Mode,
    MaxSources,
    MaxRules,
    Protect,
}

/// The settings a rule and a set share: their bucket and action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedField {
    Rate,
    TotalRate,
    Burst,
    TotalBurst,
    Action,
    KeyLen,
}

/// `[[rule]]`'s settings beyond [`SharedField`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleField {
    Prefix,
    Shared(SharedField),
    Proto,
    Dport,
    Sport,
    TcpFlags,
    IcmpType,
    Dst,
    SynCookies,
    SynAckRate,
    BanFor,
    BanAfter,
    BanMax,
    BanWithin,
    Inherit,
    Ban,
    Reason,
    Expires,
    /// `global = "svc"`: the total is a fleet budget (docs/fleet.md).
    Global,
    /// On the wire only (`--ttl`): read, so that its problem can say to
    /// write `expires` instead, but never listed.
    Ttl,
}

/// `[[set]]`'s settings beyond [`SharedField`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetField {
    Name,
    File,
    Mmdb,
    Country,
    Asn,
    Shared(SharedField),
}

/// `[[chain]]`'s settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainField {
    Interface,
    Slot,
    Object,
    Program,
    PinMaps,
    Pinned,
}

/// `[global]`'s settings (docs/fleet.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalField {
    RedisUrl,
    PasswordFile,
    Database,
    NodeId,
    LeasePeriod,
    Fallback,
}

/// `[crowdsec]`'s settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrowdsecField {
    LapiUrl,
    ApiKey,
    ApiKeyFile,
    UpdateFrequency,
    FullSyncEvery,
    Origins,
    Scopes,
    Scenarios,
    ScenariosContaining,
    ScenariosNotContaining,
    Types,
    Action,
    Set,
    MinPrefixLenV4,
    MinPrefixLenV6,
    MaxCoverV4,
    MaxCoverV6,
    Publish,
    MachineId,
    Password,
    PasswordFile,
    CountryMmdb,
    AsnMmdb,
}

/// One key of the file.
#[derive(Debug)]
pub struct Key {
    /// Its table, and what the reader makes of it.
    pub field: Field,
    pub key: &'static str,
    /// Its type and its default, as policer.toml(5) says them.
    pub kind: &'static str,
    pub default: &'static str,
    /// What it does (policer.toml(5); `code` in backquotes).
    pub help: &'static str,
    /// Whether policer.toml(5) and the reader's list of the table's keys
    /// name it (all but `ttl`, which a file may not hold).
    pub listed: bool,
}

impl Key {
    pub const fn table(&self) -> Table {
        self.field.table()
    }
}

/// One table of the file, as policer.toml(5) heads it.
pub struct TableDoc {
    pub table: Table,
    /// `[daemon]`, `[[rule]]`.
    pub header: &'static str,
    /// When its keys take effect.
    pub help: &'static str,
}

/// The key `key` of `table`, if the file may hold it.
pub fn find(table: Table, key: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.table() == table && k.key == key)
}

/// The keys of `table` that are listed, in their order: `a, b, c`.
pub fn listed(table: Table) -> String {
    let keys: Vec<&str> = KEYS.iter().filter(|k| k.table() == table && k.listed).map(|k| k.key).collect();
    keys.join(", ")
}

const fn key(field: Field, key: &'static str, kind: &'static str, default: &'static str, help: &'static str) -> Key {
    Key { field, key, kind, default, help, listed: true }
}

const fn daemon(f: DaemonField, k: &'static str, kind: &'static str, default: &'static str, help: &'static str) -> Key {
    key(Field::Daemon(f), k, kind, default, help)
}

const fn rule(f: RuleField, k: &'static str, kind: &'static str, default: &'static str, help: &'static str) -> Key {
    key(Field::Rule(f), k, kind, default, help)
}

const fn chain(f: ChainField, k: &'static str, kind: &'static str, default: &'static str, help: &'static str) -> Key {
    key(Field::Chain(f), k, kind, default, help)
}

const fn set(f: SetField, k: &'static str, kind: &'static str, default: &'static str, help: &'static str) -> Key {
    key(Field::Set(f), k, kind, default, help)
}

const fn crowdsec(
    f: CrowdsecField,
    k: &'static str,
    kind: &'static str,
    default: &'static str,
    help: &'static str,
) -> Key {
    key(Field::Crowdsec(f), k, kind, default, help)
}

const fn global(f: GlobalField, k: &'static str, kind: &'static str, default: &'static str, help: &'static str) -> Key {
    key(Field::Global(f), k, kind, default, help)
}

use CrowdsecField as C;
use DaemonField as D;
use RuleField as R;
use SetField as S;

/// The tables, in the order policer.toml(5) gives them.
pub static TABLES: &[TableDoc] = &[
    TableDoc {
        table: Table::Daemon,
        header: "[daemon]",
        help: "Settings of the daemon. Read at start; a reload applies `protect` and leaves the rest for the next start.",
    },
    TableDoc {
        table: Table::Rule,
        header: "[[rule]]",
        help: "One table per rule (a prefix and an optional class). A reload applies every change; buckets keep their fill.",
    },
    TableDoc {
        table: Table::Set,
        header: "[[set]]",
        help: "A named set: many prefixes under one rule, listed in a file or taken from a MaxMind DB file (mmdb). The file \
         is read at start and by a reload (a list file is not followed: reload after changing it; a database is).",
    },
    TableDoc {
        table: Table::Crowdsec,
        header: "[crowdsec]",
        help: "A CrowdSec Local API whose decisions are pulled into a set. Read at start (a reload keeps the feed as it \
         started).",
    },
    TableDoc {
        table: Table::Chain,
        header: "[[chain]]",
        help: "A program behind policer: what policer passes on an interface is handed to the first filled slot of its \
         chain (`policer chain add` writes these). Read at start and by a reload, which fill the slots they name.",
    },
    TableDoc {
        table: Table::Global,
        header: "[global]",
        help: "Fleet budgets (docs/fleet.md): the Redis through which the rules with `global` share their `total_rate` \
         with every node that names the same budget, in leases of tokens. Read at start (a reload keeps it as it \
         started).",
    },
];

/// Every key of the file, each table's in the order its list names them.
pub static KEYS: &[Key] = &[
    daemon(
        D::Interfaces,
        "interfaces",
        "array of strings",
        "none",
        "Interfaces `policer attach` uses when the command line names none; `@default-route` is the default route's interface at start.",
    ),
    daemon(D::Mode, "mode", "string", "\"auto\"", "XDP mode: auto (native, else generic), native, or skb."),
    daemon(
        D::MaxSources,
        "max_sources",
        "integer",
        "1048576",
        "Sources tracked at once, per address family (176 bytes of kernel memory each, both families with the recall, preallocated at start): 1 to 16777216 (2.75 GiB). `policer check` and a reload refuse a size past it.",
    ),
    daemon(
        D::MaxRules,
        "max_rules",
        "integer",
        "16384",
        "Rules held at once (each with its own counters); past it a rule change is refused.",
    ),
    daemon(
        D::Protect,
        "protect",
        "array of prefixes",
        "none",
        "Prefixes no rule, ban, set or feed may drop: sources in them always pass. A rule, ban or set entry inside one that does anything but allow is refused.",
    ),
    rule(
        R::Prefix,
        "prefix",
        "string (CIDR)",
        "required",
        "The source prefix: 203.0.113.0/24, 2001:db8::/32. The longest matching prefix wins.",
    ),
    rule(
        R::Shared(SharedField::Rate),
        "rate",
        "string",
        "required for police and monitor",
        "Rate per source (per key_len group): 500pps, 10kpps (k = 1000); or a bit rate 64kbit, 100mbit (byte mode).",
    ),
    rule(
        R::Shared(SharedField::Burst),
        "burst",
        "integer or string",
        "1/50 s of the rate, at least 5 packets",
        "Bucket size: packets (200, \"2k\"), or bytes in byte mode (\"1500b\", \"64kb\").",
    ),
    rule(
        R::Shared(SharedField::Action),
        "action",
        "string",
        "\"police\"",
        "police, monitor (count what would be dropped), allow (never police) or deny (drop everything).",
    ),
    rule(
        R::Shared(SharedField::KeyLen),
        "key_len",
        "integer",
        "32 (IPv4), 64 (IPv6)",
        "Leading source bits that form one bucket; not shorter than the prefix.",
    ),
    rule(
        R::Proto,
        "proto",
        "string or integer",
        "none",
        "Class: tcp, udp, icmp, icmpv6, sctp, udplite or a protocol number.",
    ),
    rule(R::Dport, "dport", "integer or string", "none", "Class: a destination port, or a range \"8000-8999\"."),
    rule(
        R::Sport,
        "sport",
        "integer or string",
        "none",
        "Class: a source port, or a range \"1024-65535\" (tcp or udp): sport = 53 is DNS replies, a reflection.",
    ),
    rule(R::TcpFlags, "tcp_flags", "string", "none", "Class: TCP flags, ! negates: \"syn,!ack\" is a bare SYN."),
    rule(
        R::IcmpType,
        "icmp_type",
        "integer",
        "none",
        "Class: ICMP or ICMPv6 type (8 is an echo request, 128 for ICMPv6).",
    ),
    rule(R::Dst, "dst", "string (CIDR or address)", "none", "Class: a destination prefix."),
    rule(
        R::Shared(SharedField::TotalRate),
        "total_rate",
        "string",
        "none",
        "Rate of the whole rule, all sources together (an aggregate bucket charged after the source's).",
    ),
    rule(
        R::Shared(SharedField::TotalBurst),
        "total_burst",
        "integer or string",
        "from total_rate",
        "Burst of the aggregate bucket.",
    ),
    rule(
        R::Global,
        "global",
        "string",
        "none",
        "The fleet budget (a name) this rule's total_rate is: every node whose rule names it shares that rate, \
         leased through [global]'s Redis (packet rates only).",
    ),
    rule(
        R::SynCookies,
        "syn_cookies",
        "string",
        "\"off\"",
        "A TCP class: answer SYNs of unverified sources with the kernel's cookies: off, flood (above total_rate) or always.",
    ),
    rule(
        R::SynAckRate,
        "syn_ack_rate",
        "string",
        "\"1000pps\"",
        "SYN cookies' reflection cap: SYN-ACKs a second toward one /24 (IPv6: /48).",
    ),
    rule(
        R::BanFor,
        "ban_for",
        "string (duration)",
        "none",
        "Ban a source whose bucket refuses ban_after frames, for this long (500ms, 30s, 10m, 1h, 7d).",
    ),
    rule(
        R::BanAfter,
        "ban_after",
        "integer",
        "1",
        "Refused frames that start an automatic ban: since the source was last admitted, or within ban_within.",
    ),
    rule(
        R::BanWithin,
        "ban_within",
        "string (duration)",
        "none",
        "Count ban_after's refusals in a window this long, admissions or not (fail2ban's findtime).",
    ),
    rule(
        R::BanMax,
        "ban_max",
        "string (duration)",
        "ban_for",
        "A source banned again within twice its last ban's length is banned twice as long, up to this.",
    ),
    rule(
        R::Inherit,
        "inherit",
        "boolean",
        "true",
        "Whether the classes of shorter (covering) prefixes apply under this prefix where it defines no class of \
         the same match; false: its own rules alone (`--no-inherit`).",
    ),
    rule(
        R::Ban,
        "ban",
        "boolean",
        "false",
        "A manual ban (written by `policer ban`): every frame of the prefix is dropped until expires.",
    ),
    rule(R::Reason, "reason", "string", "none", "Why the ban: one line of plain text, at most 200 characters."),
    rule(
        R::Expires,
        "expires",
        "string (RFC 3339)",
        "none",
        "When the rule or ban ends (written by --ttl and --for as an absolute time).",
    ),
    Key {
        field: Field::Rule(R::Ttl),
        key: "ttl",
        kind: "string (duration)",
        default: "none",
        help: "On the wire only (`rule set --ttl`); refused in a file, where every reload would restart it.",
        listed: false,
    },
    set(
        S::Name,
        "name",
        "string",
        "required",
        "The set's name (letters, digits, - and _): `rule ls` shows it as set:NAME.",
    ),
    set(
        S::File,
        "file",
        "string (path)",
        "required",
        "The file of prefixes, one per line (# and ; comments); relative to the config file's directory. Or mmdb.",
    ),
    set(
        S::Mmdb,
        "mmdb",
        "string (path)",
        "none",
        "A MaxMind DB file (GeoLite2/GeoIP2 Country or ASN, DB-IP lite, IPinfo lite) instead of file: the set is its \
         networks of country and asn, both families. Read at start, by a reload, and when it is replaced (followed); one \
         that does not open, is empty or cut short changes nothing.",
    ),
    set(S::Country, "country", "array of strings", "none", "With mmdb: the countries, ISO 3166-1 codes ([\"DE\"])."),
    set(S::Asn, "asn", "array of integers", "none", "With mmdb: the AS numbers ([64500])."),
    set(S::Shared(SharedField::Action), "action", "string", "\"deny\" (\"police\" with a rate)", "As a rule's action."),
    set(S::Shared(SharedField::Rate), "rate", "string", "required for police and monitor", "As a rule's rate."),
    set(S::Shared(SharedField::Burst), "burst", "integer or string", "as a rule's", "As a rule's burst."),
    set(S::Shared(SharedField::KeyLen), "key_len", "integer", "as a rule's", "As a rule's key_len."),
    crowdsec(
        C::LapiUrl,
        "lapi_url",
        "string (URL)",
        "required",
        "The Local API, plain HTTP: \"http://127.0.0.1:8080/\".",
    ),
    crowdsec(
        C::ApiKey,
        "api_key",
        "string",
        "one of api_key, api_key_file",
        "The bouncer key (`cscli bouncers add NAME -o raw`).",
    ),
    crowdsec(
        C::ApiKeyFile,
        "api_key_file",
        "string (path)",
        "none",
        "A file holding the key (relative to the config file's directory); mode 0600: one others than its owner may read is warned of at a start and by `policer check`.",
    ),
    crowdsec(
        C::UpdateFrequency,
        "update_frequency",
        "string (duration)",
        "\"10s\"",
        "How often the decision stream is pulled (1s to 1h).",
    ),
    crowdsec(
        C::FullSyncEvery,
        "full_sync_every",
        "string (duration)",
        "\"10m\"",
        "How often a whole pull (`startup=true`) replaces what the pulls of changes built, \"0s\" for never (at least `update_frequency`, at most 24h): the Local API can leave out of every pull of changes a decision written while one was answered.",
    ),
    crowdsec(
        C::Origins,
        "origins",
        "array of strings",
        "all",
        "Only decisions of these origins (crowdsec, cscli, lists, ...).",
    ),
    crowdsec(
        C::Scopes,
        "scopes",
        "array of strings",
        "[\"ip\", \"range\"]",
        "Decision scopes pulled; only Ip and Range can be applied.",
    ),
    crowdsec(C::Scenarios, "scenarios", "array of strings", "all", "Only decisions of these scenarios."),
    crowdsec(
        C::ScenariosContaining,
        "scenarios_containing",
        "array of strings",
        "all",
        "Only scenarios containing one of these words.",
    ),
    crowdsec(
        C::ScenariosNotContaining,
        "scenarios_not_containing",
        "array of strings",
        "none",
        "Not scenarios containing one of these words.",
    ),
    crowdsec(
        C::Types,
        "types",
        "array of strings",
        "[\"ban\"]",
        "Decision types applied (a captcha cannot be served by a packet filter).",
    ),
    crowdsec(
        C::Action,
        "action",
        "string",
        "\"deny\"",
        "What the set does to the decisions' prefixes: deny, or monitor (count what it would drop, to try a feed first).",
    ),
    crowdsec(C::Set, "set", "string", "\"crowdsec\"", "The name of the set the decisions go into."),
    crowdsec(
        C::CountryMmdb,
        "country_mmdb",
        "string (path)",
        "none",
        "A MaxMind DB Country file: Country decisions are applied as its networks of that country (without it they \
         are counted and skipped). Read at start.",
    ),
    crowdsec(
        C::AsnMmdb,
        "asn_mmdb",
        "string (path)",
        "none",
        "A MaxMind DB ASN file: AS decisions are applied as its networks of that AS. Read at start.",
    ),
    crowdsec(
        C::MinPrefixLenV4,
        "min_prefix_len_v4",
        "integer",
        "8",
        "Wider IPv4 ranges are refused (counted, never applied).",
    ),
    crowdsec(C::MinPrefixLenV6, "min_prefix_len_v6", "integer", "32", "Wider IPv6 ranges are refused."),
    crowdsec(
        C::MaxCoverV4,
        "max_cover_v4",
        "integer",
        "7, or min_prefix_len_v4 - 1 if shorter",
        "What all the decisions may cover: as many IPv4 addresses as one prefix of this length. A pull beyond it \
         is refused whole; what was in force stays.",
    ),
    crowdsec(C::MaxCoverV6, "max_cover_v6", "integer", "31, or min_prefix_len_v6 - 1 if shorter", "The same for IPv6."),
    crowdsec(
        C::Publish,
        "publish",
        "boolean",
        "false",
        "Post this node's automatic bans to the Local API as alerts (scenario `policer/auto-ban`, decisions of \
         origin `crowdsec`), so other nodes drop them too and `cscli decisions list` and `cscli alerts list` show \
         them.",
    ),
    crowdsec(
        C::MachineId,
        "machine_id",
        "string",
        "required with publish",
        "The machine login (`cscli machines add`).",
    ),
    crowdsec(C::Password, "password", "string", "one of password, password_file", "The machine password."),
    crowdsec(
        C::PasswordFile,
        "password_file",
        "string (path)",
        "none",
        "A file holding it; mode 0600 (warned of otherwise, as api_key_file).",
    ),
    global(
        GlobalField::RedisUrl,
        "redis_url",
        "string",
        "required",
        "The Redis: \"redis://HOST:PORT/DB\" (plain TCP; a password may be in the URL, or in password_file).",
    ),
    global(
        GlobalField::PasswordFile,
        "password_file",
        "string (path)",
        "none",
        "A file holding the Redis password (one line), relative to the config file's directory.",
    ),
    global(GlobalField::Database, "database", "integer", "the URL's, else 0", "The Redis database."),
    global(
        GlobalField::NodeId,
        "node_id",
        "string",
        "the hostname",
        "This node's name in the fleet, one to each node (two nodes with one name are warned about): letters, \
         digits, '.', '_', '-'.",
    ),
    global(
        GlobalField::LeasePeriod,
        "lease_period",
        "string (duration)",
        "\"100ms\"",
        "How often a node asks for its lease (10ms to 10s); a node is live for 10 periods after its last ask, and a \
         budget must be at least one packet a period.",
    ),
    global(
        GlobalField::Fallback,
        "fallback",
        "string",
        "\"share\"",
        "While Redis cannot be asked: share (the budget divided by the nodes last seen live) or local (the whole budget).",
    ),
    chain(ChainField::Interface, "interface", "string", "required", "The interface whose chain the program joins."),
    chain(ChainField::Slot, "slot", "integer", "required", "The slot, 0 to 7: the first filled slot runs."),
    chain(
        ChainField::Object,
        "object",
        "string (path)",
        "one of object, pinned",
        "A libbpf-style XDP object (BTF maps); relative to the config file's directory.",
    ),
    chain(ChainField::Program, "program", "string", "the object's only XDP program", "The object's program to load."),
    chain(
        ChainField::PinMaps,
        "pin_maps",
        "string (path)",
        "\"/sys/fs/bpf\"",
        "Where the object's pin-by-name maps are pinned (reused when pinned there already), as libbpf does.",
    ),
    chain(
        ChainField::Pinned,
        "pinned",
        "string (path)",
        "one of object, pinned",
        "A program already loaded and pinned in bpffs (`bpftool prog load OBJ PATH`).",
    ),
];

/// The field names a serde struct `T` takes, as its derived
/// `Deserialize` hands them to `deserialize_struct`: a probe deserializer
/// notes them and refuses to go on.
#[cfg(test)]
pub(crate) fn serde_fields<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
    use serde::de::{Deserializer, Error as _, Visitor, value::Error};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            Err(Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Error> {
            *self.0 = fields;
            Err(Error::custom("probed"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let probed = T::deserialize(Probe(&mut fields));
    assert!(probed.is_err() && !fields.is_empty(), "{} is not a struct with fields", std::any::type_name::<T>());
    fields.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<&'static str>) -> Vec<&'static str> {
        v.sort_unstable();
        v
    }

    fn keys_of(table: Table) -> Vec<&'static str> {
        sorted(KEYS.iter().filter(|k| k.table() == table).map(|k| k.key).collect())
    }

    /// The keys here are serde's fields, table by table, and the tables
    /// are the top level's: what the file is written from and what it is
    /// read with hold the same keys.
    #[test]
    fn the_keys_are_serdes_fields() {
        use crate::{crowdsec::CrowdsecConfig, rules::RuleConfig};
        for (table, fields) in [
            (Table::Daemon, serde_fields::<super::super::DaemonConfig>()),
            (Table::Rule, serde_fields::<RuleConfig>()),
            (Table::Set, serde_fields::<super::super::SetConfig>()),
            (Table::Crowdsec, serde_fields::<CrowdsecConfig>()),
            (Table::Chain, serde_fields::<crate::chain::ChainConfig>()),
            (Table::Global, serde_fields::<crate::fleet::GlobalConfig>()),
        ] {
            assert_eq!(keys_of(table), sorted(fields), "[{}]: the schema and serde's struct disagree", table.name());
        }
        let tables: Vec<&str> = TABLES.iter().map(|t| t.table.name()).collect();
        assert_eq!(sorted(tables), sorted(serde_fields::<super::super::Config>()));
    }

    /// Each key once, each setting read from one key, every table headed,
    /// and every listed key documented.
    #[test]
    fn each_key_once_and_documented() {
        for (i, k) in KEYS.iter().enumerate() {
            for other in &KEYS[i + 1..] {
                assert!(k.table() != other.table() || k.key != other.key, "{} twice", k.key);
                assert!(k.field != other.field, "{} and {} are one setting", k.key, other.key);
            }
            assert!(find(k.table(), k.key).is_some_and(|f| std::ptr::eq(f, k)));
            assert!(TABLES.iter().any(|t| t.table == k.table()), "{}: no table", k.key);
            if k.listed {
                assert!(!k.kind.is_empty() && !k.default.is_empty() && k.help.len() > 10, "{}", k.key);
            }
        }
        assert!(find(Table::Daemon, "rate").is_none() && find(Table::Rule, "zzz").is_none());
        assert_eq!(listed(Table::Set), "name, file, mmdb, country, asn, action, rate, burst, key_len");
        assert!(!listed(Table::Rule).contains("ttl"));
        assert_eq!(Table::named("crowdsec"), Some(Table::Crowdsec));
        assert_eq!(Table::named("rules"), None);
    }
}
