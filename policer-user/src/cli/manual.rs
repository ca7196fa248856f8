//! The manual's own text: what clap's definition of the CLI cannot say.
//!
//! Each man page is clap's SYNOPSIS and OPTIONS (so they cannot drift from
//! the binary) around the sections here: a one-line summary for NAME, the
//! DESCRIPTION, EXAMPLES, the `--json` schema (taken from docs/json.md, so
//! the page and the doc are one text), and the common EXIT STATUS, FILES,
//! ENVIRONMENT and SEE ALSO. `policer.toml(5)`'s tables and keys are the
//! config's own [`schema`](crate::config::schema). A page
//! without an entry here, an option without help, or a reference to a page
//! that is not generated fails the tests (`docs.rs`, and `man` itself in
//! tests/tests/observe.rs).

/// What one page says beyond clap's definition.
pub struct Page {
    /// The page's name: `policer`, `policer-rule-set`.
    pub name: &'static str,
    /// NAME: what it does, in one line.
    pub summary: &'static str,
    /// DESCRIPTION: paragraphs, separated by blank lines. A line starting
    /// with `- ` is an item of a list.
    pub description: &'static str,
    /// EXAMPLES: (what it does, the command).
    pub examples: &'static [(&'static str, &'static str)],
    /// The heading of its section in docs/json.md, if it prints JSON.
    pub json: Option<&'static str>,
    /// Pages to see besides policer(8) and policer.toml(5).
    pub see_also: &'static [&'static str],
    /// Whether it talks to a running daemon (and so takes `--timeout`).
    pub asks_daemon: bool,
}

/// docs/json.md, the schemas of every `--json`.
pub const JSON_DOC: &str = include_str!("../../../docs/json.md");

/// Every page.
pub const PAGES: &[Page] = &[
    Page {
        name: "policer",
        summary: "per-source packet-rate policer in XDP",
        description: "\
policer attaches an XDP program to network interfaces and gives every source address (or every group of \
addresses, --key-len) its own token bucket: frames beyond a source's rate are dropped in the driver, before \
the kernel's stack sees them. Rules are per prefix (the longest matching prefix wins) and optionally per class \
of traffic (protocol, destination port, TCP flags, ICMP type, destination prefix); a rule polices, monitors \
(counts what it would drop), allows or denies.

`policer attach` runs the daemon, which owns the program and its rules. Every other verb talks to the daemon \
of the caller's network namespace over a unix socket (run both under the same `ip netns exec NS`), except \
`check` and `replay`, which need no daemon. Changes are written to the config file (policer.toml(5)) before \
they are acknowledged, and applied in the kernel atomically.

Every verb has its own page: policer-attach(8), policer-rule-set(8) and so on.",
        examples: &[
            (
                "Police every source on eth0 at 10 000 packets/s, bursts of 200",
                "policer attach eth0 --rate 10kpps --burst 200",
            ),
            (
                "A tighter rule for one network, live when the command returns",
                "policer rule set 203.0.113.0/24 --rate 500pps --burst 50",
            ),
            ("Ban a prefix for an hour", "policer ban 198.51.100.0/24 --for 1h --reason \"incident 42\""),
            ("Why a source is dropped", "policer inspect 198.51.100.7"),
        ],
        json: None,
        see_also: &["policer-attach", "policer-rule-set", "policer-ban", "policer-inspect", "policer-check"],
        asks_daemon: true,
    },
    Page {
        name: "policer-attach",
        summary: "run the daemon: attach to interfaces and police every source",
        description: "\
Loads the XDP program, attaches it to each IFACE (or the config file's `daemon.interfaces`) and polices until \
SIGINT or SIGTERM, which detach it (with --persist the program stays attached and policing; a later \
`policer attach` adopts it with its buckets). SIGHUP re-reads the config file, as `policer reload` does.

The rules come from the config file; --rate and --burst set the default rules (0.0.0.0/0 and ::/0) and write \
them into the file, saying what they changed there (\"change by policer attach: --rate/--burst changed the rules \
of FILE: 0.0.0.0/0: rate 100pps → 10kpps\", in the audit trail too): leave them out to start with the file's rules \
as they are. One daemon runs per network namespace: a second is refused, naming the first's pid.

Errors leave nothing attached and the file untouched: a bad interface, rate, burst or config file, a missing \
privilege (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON), or another XDP program on the interface, which is never \
replaced: the error names it. When one of several interfaces fails, the ones done are put back.

Member mode (--join BPFFS_PATH --slot N): another root owns the interface's hook (a Katran-style root that \
tail-calls into a program array pinned at BPFFS_PATH). policer puts its program in slot N of that array instead \
of attaching, and hands what it passes to the slots behind its own (N + 1 and up); what it drops goes no \
further. A path outside a bpffs, a pinned object that is not a program array, a slot past its end or a slot \
that holds another program is refused, and nothing changes. Detach, and a plain exit, empty only that slot.",
        examples: &[
            (
                "Two interfaces, native XDP, 1.5 Mpps per source",
                "policer attach eth0 eth1 --rate 1.5Mpps --burst 5k --mode native",
            ),
            ("Byte mode: 100 Mbit/s per source, 64 KiB bursts", "policer attach eth0 --rate 100mbit --burst 64kb"),
            (
                "Behind a root that owns eth0's hook, in slot 1 of its array",
                "policer attach eth0 --join /sys/fs/bpf/root/progs --slot 1",
            ),
            (
                "As the systemd unit runs it: the config's interfaces, metrics on port 9100",
                "policer attach --config /etc/policer/policer.toml --persist --metrics 9100",
            ),
        ],
        json: None,
        see_also: &["policer-detach", "policer-status", "policer-reload"],
        asks_daemon: false,
    },
    Page {
        name: "policer-detach",
        summary: "detach the program from an interface",
        description: "\
Through the running daemon: detaches that interface (the daemon exits when none is left). With no daemon: \
removes a policer program left attached (by --persist, or a daemon that was killed); any other XDP program is \
refused, never removed. While the interface's chain holds programs, detach refuses and names them: \
--hand-over attaches slot 0's program in policer's place (atomically), --force detaches and empties the chain.",
        examples: &[
            ("Stop policing eth1", "policer detach eth1"),
            ("Leave xdp-filter alone on eth0", "policer detach eth0 --hand-over"),
        ],
        json: None,
        see_also: &["policer-attach", "policer-status", "policer-chain"],
        asks_daemon: true,
    },
    Page {
        name: "policer-rule",
        summary: "change and list the running daemon's rules",
        description: "\
A rule is a prefix and, optionally, a class; it polices (a bucket per source at its rate), monitors, allows or \
denies. The longest matching prefix wins, then its most specific class that matches. Each change is written to \
the config file first, then applied atomically; --runtime changes the kernel only.",
        examples: &[
            ("List the rules", "policer rule ls"),
            (
                "Police DNS queries per source",
                "policer rule set 0.0.0.0/0 --proto udp --dport 53 --rate 50pps --burst 100",
            ),
        ],
        json: None,
        see_also: &["policer-rule-set", "policer-rule-rm", "policer-rule-ls", "policer-rule-import"],
        asks_daemon: true,
    },
    Page {
        name: "policer-rule-set",
        summary: "add the rule for a prefix and class, or change the one there",
        description: "\
The options given change those fields of the rule; the others keep their values (--replace: the options given \
alone). The reply names every field it changed, old → new. --rate is required for police and monitor; allow \
and deny take none. A bit rate (64kbit, 10gbit) puts the rule in byte mode: the burst is in bytes.

The change is live when the command returns, and written to the config file first: if the file cannot be \
written, nothing changes and the command says why. Buckets keep their fill across a change (at the same \
fraction of their size), also when a source moves to another prefix's rule; changing --key-len regroups \
sources into new, empty buckets.

A class (--proto, --dport, --sport, --tcp-flags, --icmp-type, --dst) gives each source a bucket per class, apart \
from its class-less bucket: a flood of one kind is cut without starving the same source's other traffic. \
--sport (tcp, udp) takes a reflection flood by its reflectors' service port (53 DNS, 123 NTP); like --dport it \
needs a first fragment (later fragments carry no ports). The most specific class wins: more fields, then \
narrower port ranges; of a --sport and a --dport class otherwise equal, the --dport class. Classes that could tie \
are refused. Classes compose: those of shorter (covering) prefixes apply under a longer prefix unless it defines the \
same class (a 0.0.0.0/0 DNS class still limits the DNS of a later 203.0.113.0/24 rule); --no-inherit gives a prefix \
its own rules alone, --inherit undoes it. The reply (and --dry-run) says which classes of shorter prefixes the rule \
inherits, overrides or hides. --total-rate adds one bucket for the whole rule, all sources together, charged after the \
source's own. --ban-for bans a source whose bucket refuses --ban-after frames within --ban-within (admitted frames \
between them or not; without it, in a row since its last admission). A class-less deny of a whole \
family (0.0.0.0/0, ::/0) is refused without --force; a rule inside a protected prefix (policer.toml(5), \
`protect`) that does anything but allow is refused.",
        examples: &[
            ("500 packets/s per source, bursts of 50", "policer rule set 203.0.113.0/24 --rate 500pps --burst 50"),
            ("One bucket per /24", "policer rule set 198.18.0.0/15 --rate 1kpps --key-len 24"),
            (
                "Count what would be dropped, drop nothing",
                "policer rule set 192.0.2.0/24 --rate 1kpps --action monitor",
            ),
            (
                "A prefix's own rules alone, without the classes of shorter prefixes",
                "policer rule set 203.0.113.0/24 --rate 100pps --no-inherit",
            ),
            (
                "Bare SYNs per source",
                "policer rule set 0.0.0.0/0 --proto tcp --tcp-flags 'syn,!ack' --rate 20pps --burst 40",
            ),
            (
                "SSH: ban a source for 10 minutes after 20 refused frames within a minute, doubling up to a day",
                "policer rule set 0.0.0.0/0 --proto tcp --dport 22 --rate 5pps --burst 10 --ban-for 10m --ban-after 20 --ban-within 1m --ban-max 1d",
            ),
            (
                "A DNS reflection: replies from port 53, per reflector",
                "policer rule set 0.0.0.0/0 --proto udp --sport 53 --rate 100pps --burst 200",
            ),
            (
                "An NTP reflection: replies from port 123, all reflectors together",
                "policer rule set 0.0.0.0/0 --proto udp --sport 123 --total-rate 5kpps",
            ),
            ("A rule that removes itself in two hours", "policer rule set 198.51.100.0/24 --action deny --ttl 2h"),
            (
                "What lowering a rate would do to the sources live now, changing nothing",
                "policer rule set 10.77.0.0/16 --rate 40pps --dry-run",
            ),
        ],
        json: None,
        see_also: &["policer-rule-rm", "policer-rule-ls", "policer-inspect"],
        asks_daemon: true,
    },
    Page {
        name: "policer-rule-rm",
        summary: "remove the rule for a prefix and class, or a set",
        description: "\
Removes exactly that prefix and class; its sources fall to the next matching rule, atomically. Removing a rule \
that does not exist is an error. --set NAME removes a set and all of its prefixes.",
        examples: &[
            ("Remove the DNS class of the default rule", "policer rule rm 0.0.0.0/0 --proto udp --dport 53"),
            ("Remove a set", "policer rule rm --set scanners"),
        ],
        json: None,
        see_also: &["policer-rule-set", "policer-rule-ls"],
        asks_daemon: true,
    },
    Page {
        name: "policer-rule-ls",
        summary: "list the rules in force",
        description: "\
One line per rule: prefix, class, action, rate, burst, aggregate, key length, and whether it is saved in the \
config file (a --runtime change is not). A set is one line (set:NAME); --set NAME lists its prefixes.",
        examples: &[("The rules", "policer rule ls"), ("A set's prefixes", "policer rule ls --set drop-feed")],
        json: Some("## `policer rule ls --json`"),
        see_also: &["policer-rule-set", "policer-stats"],
        asks_daemon: true,
    },
    Page {
        name: "policer-rule-import",
        summary: "load a blocklist file as a set: one rule over any number of prefixes",
        description: "\
The file has one prefix or address per line; `#` and `;` start comments (the format of Spamhaus DROP). All or \
nothing: the first bad line is named and nothing is imported.

With --set NAME the set is the file: a later import makes the set equal the file, in one change, so a timer can \
import a feed. A file with no entries is refused, and so is a replacement that would remove more than \
--max-remove of the set (default 50%) unless --force: a truncated download cannot open a blocklist. Without \
--set, the prefixes are added to the implicit set of the action and rate.

Sets are kept in the state directory (/var/lib/policer/sets/). Longest prefix wins between sets and rules; a \
prefix in several sets: deny over police over monitor over allow.",
        examples: &[
            (
                "Drop a feed's prefixes (deny is the default action)",
                "policer rule import /var/lib/feeds/drop.txt --set drop-feed",
            ),
            (
                "Police scanners at 10 packets/s for a day",
                "policer rule import scanners.txt --action police --rate 10pps --set scanners --ttl 1d",
            ),
        ],
        json: Some("## `policer rule import FILE --json`"),
        see_also: &["policer-rule-ls", "policer-rule-rm"],
        asks_daemon: true,
    },
    Page {
        name: "policer-ban",
        summary: "ban a prefix for a while, or list the bans in force",
        description: "\
A manual ban drops every frame from the prefix, whatever rule it or a more specific prefix has, until it ends; \
it is an entry of the config file (ban = true, with expires and reason), so it survives restarts. A second ban \
of a prefix replaces the first. A ban of a whole family (0.0.0.0/0, ::/0) is refused without --force, and a \
ban inside a protected prefix is refused. `policer ban ls` lists manual bans (by prefix), then the automatic \
bans (--ban-for) in force.",
        examples: &[
            ("Ban for an hour, with a reason", "policer ban 198.51.100.0/24 --for 1h --reason \"incident 42\""),
            ("The bans in force", "policer ban ls"),
        ],
        json: None,
        see_also: &["policer-unban", "policer-ban-ls", "policer-inspect"],
        asks_daemon: true,
    },
    Page {
        name: "policer-ban-ls",
        summary: "list the manual and automatic bans in force",
        description: "\
Prefix, origin (manual, or auto with the rule that banned it), reason, end, time left and frames dropped \
(estimated for automatic bans, marked ~): manual bans by prefix, then automatic bans in the order of the \
ban store. The daemon streams them as it reads them and each is printed as it comes, so 100 000 bans start \
printing at once (`policer top` shows the soonest to end).",
        examples: &[("As JSON, for a script", "policer ban ls --json")],
        json: Some("## `policer ban ls --json`"),
        see_also: &["policer-ban", "policer-unban"],
        asks_daemon: true,
    },
    Page {
        name: "policer-unban",
        summary: "lift a manual ban and the automatic bans of sources in a prefix",
        description: "\
Lifts the prefix's manual ban and every automatic ban of a source inside it. With nothing to lift it fails.",
        examples: &[("Lift a ban", "policer unban 198.51.100.0/24")],
        json: None,
        see_also: &["policer-ban", "policer-ban-ls"],
        asks_daemon: true,
    },
    Page {
        name: "policer-chain",
        summary: "the programs behind policer on an interface",
        description: "\
What policer passes on an interface (admitted, allowed, monitored, unmatched, not IP) is handed to the first \
filled slot of its chain, a program array of 8 slots pinned at /sys/fs/bpf/policer/IFACE/chain; that program's \
verdict is final. What policer drops never reaches it. Any XDP program like policer's (not built for xdp.frags, \
attach type xdp) can join: xdp-filter's objects, your own, or one another tool puts in the pinned array \
(bpftool map update pinned ... key N 0 0 0 value pinned PROG). add and rm write the config's [[chain]] tables; \
a start or reload fills the empty slots they name. The chain is pinned: it survives kill -9, restarts and \
upgrades. Each interface has a chain of its own, also when one daemon polices several. See docs/chain.md.",
        examples: &[
            (
                "xdp-filter behind policer",
                "policer chain add eth0 /usr/lib/x86_64-linux-gnu/bpf/xdpfilt_alw_udp.o --pin-maps /sys/fs/bpf/xdp-filter",
            ),
            ("What runs behind policer", "policer chain ls eth0"),
        ],
        json: None,
        see_also: &["policer-chain-add", "policer-chain-rm", "policer-chain-ls", "policer-detach"],
        asks_daemon: true,
    },
    Page {
        name: "policer-chain-add",
        summary: "put a program in a slot of an interface's chain",
        description: "\
Loads OBJECT's program (--program, else its only XDP program) in the daemon, its pin-by-name maps pinned under \
--pin-maps (default /sys/fs/bpf, reused when pinned there already, as libbpf does), and puts it in --slot (else \
the first free one); or puts the program pinned at --pinned. Then writes a [[chain]] table. A program built for \
xdp.frags, for another attach type (devmap, cpumap), not XDP, or whose maps cannot be pinned is refused with the \
reason, and nothing changes; so is a slot that holds a program.",
        examples: &[
            (
                "xdp-filter's UDP filter in slot 0",
                "policer chain add eth0 /usr/lib/x86_64-linux-gnu/bpf/xdpfilt_alw_udp.o --pin-maps /sys/fs/bpf/xdp-filter",
            ),
            ("A program bpftool loaded", "policer chain add eth0 --pinned /sys/fs/bpf/my_xdp --slot 1"),
        ],
        json: None,
        see_also: &["policer-chain", "policer-chain-rm"],
        asks_daemon: true,
    },
    Page {
        name: "policer-chain-rm",
        summary: "empty a slot of an interface's chain",
        description: "\
Removes the slot's [[chain]] table from the config file, then empties the slot: what policer passes goes to the \
next filled slot, or up the stack.",
        examples: &[("Take slot 0's program out", "policer chain rm eth0 --slot 0")],
        json: None,
        see_also: &["policer-chain", "policer-chain-add"],
        asks_daemon: true,
    },
    Page {
        name: "policer-chain-ls",
        summary: "list the programs behind policer",
        description: "\
For each interface (or IFACE): where its chain is pinned, the frames handed to it (all to the first filled \
slot) and those passed with it empty, and each filled slot: program id, name, tag, and where it came from (the \
config's table, or outside policer for a program another tool put there).",
        examples: &[("Every interface's chain", "policer chain ls"), ("As JSON", "policer chain ls eth0 --json")],
        json: Some("## `policer chain ls [IFACE] --json`"),
        see_also: &["policer-chain", "policer-stats"],
        asks_daemon: true,
    },
    Page {
        name: "policer-object",
        summary: "write the XDP object policer carries to a file",
        description: "\
Writes the XDP object embedded in this binary (the program policer attaches, with its BTF and BTF maps) to FILE, \
or to stdout with --write -, so libbpf tools and other loaders can inspect or load it: bpftool prog loadall, \
bpftool btf dump, xdp-loader. The Debian package installs it as /usr/lib/policer/policer.bpf.o. A program loaded \
that way has no rules (its maps are empty: every frame passes) and no daemon; policer attach loads its own.",
        examples: &[
            ("The object as a file", "policer object --write /tmp/policer.bpf.o"),
            ("Its programs and maps, loaded by bpftool", "bpftool prog loadall /tmp/policer.bpf.o /sys/fs/bpf/policer-obj"),
        ],
        json: None,
        see_also: &["policer-attach", "policer-chain"],
        asks_daemon: false,
    },
    Page {
        name: "policer-reload",
        summary: "re-read the config file and apply it if all of it is valid",
        description: "\
Applies the config file only if the whole file is valid; otherwise prints why, exits 1 and changes nothing. \
SIGHUP does the same, and so does the daemon by itself when the file is rewritten (then only a file that ends \
with a newline, as a write cut inside a line leaves none; a reload that would remove most rules or every ban \
needs it too). [daemon] settings take \
effect at the next start. What was changed with --runtime is kept over the file (the reply says what); \
--discard-runtime drops it, so the rules in force become exactly the file's.",
        examples: &[
            ("After editing the file by hand", "policer reload"),
            ("Forget every --runtime change", "policer reload --discard-runtime"),
            ("What forgetting them would change, first", "policer reload --discard-runtime --dry-run"),
        ],
        json: None,
        see_also: &["policer-check", "policer-status"],
        asks_daemon: true,
    },
    Page {
        name: "policer-check",
        summary: "validate a config file, without root or a daemon",
        description: "\
Checks a config file as attach and reload would, and reports every problem in one run (syntax, keys and values, \
rules that do not hold together), each with its line, the key and an example of a valid value. Exits 0 when \
the file is valid, 1 otherwise: usable as a configuration manager's validate command. A max_sources whose \
tables (176 B a source) would take more than this machine's memory is a problem; over half of it, and a file \
that does not end with a newline (the daemon refuses a followed update of it), are warned of on stderr, exit 0.",
        examples: &[
            ("Check the file in place", "policer check /etc/policer/policer.toml"),
            ("Ansible's template module", "validate: policer check %s"),
        ],
        json: Some("## `policer check --json`"),
        see_also: &["policer-reload"],
        asks_daemon: false,
    },
    Page {
        name: "policer-status",
        summary: "the running daemon: interfaces, config, rules, sets, bans, feeds",
        description: "\
The daemon's pid and uptime, its program and whether it detaches on exit, the interfaces and their XDP mode, \
the config file (writable or not, rules not saved, the last refused reload and why), sets, bans, feeds and the \
metrics address. With no daemon it exits 3 (LSB status: not running) and names any policer program still \
attached and policing.",
        examples: &[("Whether it runs", "policer status || echo \"not running ($?)\"")],
        json: Some("## `policer status --json`"),
        see_also: &["policer-stats", "policer-attach"],
        asks_daemon: true,
    },
    Page {
        name: "policer-stats",
        summary: "exact counters per interface and per rule",
        description: "\
The kernel's per-CPU counters, summed: per interface, frames passed, dropped, would-drop (what a monitor rule \
passed but would have dropped), unmatched, non-IP, malformed and fragments; per rule, the same with the \
aggregate's drops (BY-TOTAL) and the sources seen; then the table's pressure. --watch SECS repeats it with \
per-second rates.",
        examples: &[
            ("Once", "policer stats"),
            ("Every second, one JSON object per line", "policer stats --json --watch 1"),
        ],
        json: Some("## `policer stats --json [--watch SECS]`"),
        see_also: &["policer-top", "policer-status"],
        asks_daemon: true,
    },
    Page {
        name: "policer-top",
        summary: "the sources with the most debt and the most drops now",
        description: "\
Reads the bucket table and lists the sources whose buckets are fullest (100% means it is dropping) and those \
that dropped most, with their rule, and the bans in force. Drops per source are sampled (one in 64): an \
estimate; the rules' counts in `policer stats` are exact.",
        examples: &[("The top 20, every 2 seconds", "policer top -n 20 --watch 2")],
        json: Some("## `policer top --json [-n N] [--watch SECS]`"),
        see_also: &["policer-inspect", "policer-stats"],
        asks_daemon: true,
    },
    Page {
        name: "policer-inspect",
        summary: "one source now: its rule, bucket, debt and when a frame would pass",
        description: "\
Resolves the address as the program does, from its maps, for a frame with the given fields (a class needs \
them): the rule and its action, the bucket key, the debt, how long until a frame would be admitted, and the \
verdict now (would drop for a monitor rule; byte mode judges a --frame-bytes frame). Then every bucket the \
source has, and everything over it (protected prefix, bans, sets, rules) with which one applies and why the \
others do not.",
        examples: &[
            ("Why a source is dropped", "policer inspect 198.18.0.1"),
            ("Its DNS queries", "policer inspect 198.18.0.1 --proto udp --dport 53"),
            ("Its DNS replies (a reflector)", "policer inspect 198.18.0.1 --proto udp --sport 53 --dport 40000"),
        ],
        json: Some("## `policer inspect ADDR --json`"),
        see_also: &["policer-top", "policer-rule-ls"],
        asks_daemon: true,
    },
    Page {
        name: "policer-capture",
        summary: "write the frames the daemon drops (or passes) to pcapng",
        description: "\
Asks the running daemon for the frames its rules judge, as they are judged: the kernel hands a copy of each \
chosen frame (its first 256 bytes, its length, the kernel's timestamp, the verdict, the rule and the interface) \
to the daemon through a BPF ring buffer, and the daemon writes pcapng to FILE or to stdout (-w -), each packet \
with a comment naming its verdict, rule and interface. tcpdump and Wireshark read it.

The filters (--dropped, --passed, --would-drop, --all; --rule; --source), the sampling (--sample 1/N) and the \
rate bound (--max-pps) are applied in the kernel: a flood cannot flood the daemon, and a full ring or a slow \
reader loses frames (counted in the summary), never time. Up to 8 captures run at once, each with its own \
filters and bound. A capture ends at --count, at --duration, before -w FILE passes --max-size (100M by \
default; -w - has no bound unless given one), on Ctrl-C, when its reader goes away, or when the daemon finds \
it took nothing for 10 s; the summary (frames written, bounded, lost) goes to stderr. With no capture running the drop path reads one word \
more.

Only frames a rule judged are captured: not non-IP, malformed or unmatched frames.",
        examples: &[
            (
                "What is dropped now, live, at most 100 frames a second",
                "policer capture -w - --dropped --max-pps 100 | tcpdump -nn -r -",
            ),
            (
                "One frame in 1000 of a prefix's drops for five minutes, to a file",
                "policer capture -w drops.pcapng --rule 203.0.113.0/24 --sample 1/1000 --duration 5m",
            ),
            (
                "Prove a customer was not blocked: its passed frames",
                "policer capture -w cust.pcapng --passed --source 198.51.100.7 --count 100",
            ),
        ],
        json: None,
        see_also: &["policer-replay", "policer-inspect", "policer-stats"],
        asks_daemon: true,
    },
    Page {
        name: "policer-replay",
        summary: "what the rules would have done to a capture",
        description: "\
Runs every frame of a pcap or pcapng file (tcpdump -w) through the real XDP program (BPF_PROG_TEST_RUN), on the \
capture's own timestamps as the program's clock, with the rules of --config (their classes, automatic bans, \
manual bans, [[set]]s and protect) or of --rate/--burst, and the sets the daemon saved in --state-dir (default \
/var/lib/policer, as policer attach: rule import's sets, and with [crowdsec] in the config the feed's saved set), \
installed as a start installs them: a [[set]] of the config replaces a saved set of its name, a set whose --ttl \
ended is left out. A state directory that does not exist holds no saved set; a state file that does not read is \
an error naming it. The feed's set is replayed as saved: live decisions are not fetched, and without a saved set \
it is empty. Nothing is attached and no daemon is needed. Reports which sets were installed and from where \
(config, saved, feed) with their entries, and per rule and per source the frames and bytes admitted and dropped, \
the first and last drop, and the top dropped sources. The capture is streamed: memory stays bounded whatever its size (the source table holds 65 536 sources, \
or twice --top; past that the sources with the fewest drops are let go, and the report says so). Frames are \
judged in order, up to 34 to a test run (millions a second); a frame longer than a test run takes (3 520 bytes) \
is replayed clipped, its IP length made to fit, and counted in clipped_frames. A progress bar is shown on a \
terminal. FILE may be a FIFO (mkfifo; tcpdump -U -w FIFO: without -U tcpdump holds even the file's header until \
its buffer fills): replay waits at most 30 s for a writer to open it, and says so. A damaged capture is refused \
at the first bad record, named by frame number and byte offset (a record \
whose captured length is past the file's snap length or 256 KiB is refused by its header, before anything is read \
for it). Needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN.",
        examples: &[
            ("What 2 kpps with bursts of 50 would have done", "policer replay tuesday.pcap --rate 2kpps --burst 50"),
            ("A candidate config against a capture", "policer replay tuesday.pcapng --config new.toml --top 20"),
            (
                "The daemon's config and saved sets (imports, the CrowdSec feed's set)",
                "policer replay tuesday.pcap --config /etc/policer/policer.toml --state-dir /var/lib/policer",
            ),
            (
                "Live traffic through a FIFO",
                "mkfifo /tmp/live; tcpdump -i eth0 -U -w /tmp/live & policer replay /tmp/live",
            ),
        ],
        json: None,
        see_also: &["policer-check", "policer-capture", "policer-inspect"],
        asks_daemon: false,
    },
    Page {
        name: "policer-suggest",
        summary: "propose per rule a rate and burst that a share of its sources stays within",
        description: "\
Counts, per rule, each source's frames (a source is a bucket key: the rule's key_len leading bits) in bins of \
100 ms, and takes each source's peak over sliding windows of 100 ms, 1 s and 10 s (only windows wholly inside \
the observation: 10 s windows need 10 s observed). Per rule it prints those peaks' distribution over the \
sources (p50, p90, p99, p99.9, max: nearest rank, no interpolation), the sources seen and how long was \
observed, and proposes the rate and burst that the --keep share of sources stays within: the rate is the kept \
share's 10 s peak (its 1 s peak when less than 10 s was observed), the burst what its 1 s and 100 ms peaks \
exceed the rate by, and at least a tenth of a second at the rate. It lists the sources the proposal would cut, \
and ends with the `policer rule set PREFIX --rate Rpps --burst B` lines that apply it (the rule's other fields, \
its action among them, keep their values): run them with --dry-run first (with --action police for a rule in \
monitor mode), to see which live sources they would drop, and leave a rule in monitor mode until that looks \
right.

With --watch DURATION the numbers come from the running daemon. The daemon keeps no per-source frame counts (a \
bucket holds only when its debt drains, and its drops), so suggest observes: it captures every frame the rules \
judge (as policer capture --all, bounded in the kernel by --max-pps, 100 000 frames a second by default) for \
DURATION, counts each under the rule that judged it (class rules too) on the kernel's timestamps, and says how \
many frames the capture did not deliver (then the peaks are low bounds). With --pcap FILE --config FILE the \
numbers come from a capture, read as policer replay reads it (pcap or pcapng), on its own timestamps: each frame \
counts under the class-less rule of the config whose prefix is the longest over its source; class rules are \
left out (and said so). Up to 262 144 sources are tracked; frames of more are counted and said.",
        examples: &[
            ("Ten minutes of a rule in monitor mode", "policer suggest --watch 10m --rule 198.51.100.0/24"),
            ("From last Tuesday's capture, keeping 99 % of sources", "policer suggest --pcap tuesday.pcap --config /etc/policer/policer.toml --keep 99%"),
            (
                "What the proposal would drop now, for a rule in monitor mode",
                "policer rule set 198.51.100.0/24 --rate 240pps --burst 24 --action police --dry-run",
            ),
        ],
        json: Some("## `policer suggest --json`"),
        see_also: &["policer-rule-set", "policer-capture", "policer-replay"],
        asks_daemon: true,
    },
    Page {
        name: "policer-man",
        summary: "write the man pages: policer(8), a page per verb, and policer.toml(5)",
        description: "\
Writes the manual into a directory: policer.8, policer-VERB.8 for every verb (and policer-rule-set.8 and the like \
for the verbs under rule), and policer.toml.5, each page from the same definitions as the command line's help, \
so the pages and the binary never disagree. The Debian package and `cargo xtask install` ship them; this verb \
is for an install by hand. Prints the path of each page written.",
        examples: &[(
            "Pages for an install under /usr/local",
            "policer man --out /usr/local/share/man/man8 && mv /usr/local/share/man/man8/policer.toml.5 /usr/local/share/man/man5/",
        )],
        json: None,
        see_also: &["policer-completions"],
        asks_daemon: false,
    },
    Page {
        name: "policer-completions",
        summary: "print a shell completion script (bash, zsh, fish)",
        description: "\
Prints the completion script of a shell: verbs, options and their values, interface names where an interface \
is asked for, and the running daemon's set names for --set (asked when completing, through `policer \
completions --list sets`, which prints nothing when no daemon answers). The Debian package installs the three \
scripts where each shell looks.",
        examples: &[
            ("bash, for this shell", "source <(policer completions bash)"),
            ("zsh, for every shell of this user", "policer completions zsh > ~/.zfunc/_policer"),
            ("fish", "policer completions fish > ~/.config/fish/completions/policer.fish"),
        ],
        json: None,
        see_also: &["policer-man"],
        asks_daemon: false,
    },
];

/// The files every page names.
pub const FILES: &[(&str, &str)] = &[
    ("/etc/policer/policer.toml", "the config file (policer.toml(5)); --config for another"),
    ("/var/lib/policer/", "the state directory (--state-dir): sets, feed state"),
    (
        "/run/policer/ns-INODE.sock",
        "the daemon's control socket, one per network namespace (INODE of /proc/self/ns/net)",
    ),
];

/// The environment the binary reads.
pub const ENVIRONMENT: &[(&str, &str)] = &[(
    "RUST_LOG",
    "the daemon's log level (error, warn, info, debug); the kernel's sampled events are logged at warn",
)];
