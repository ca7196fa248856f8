//! `policer inspect ADDR [--proto … --dport … --sport … --tcp-flags … --icmp-type …
//! --dst … --frame-bytes N] [--json]`: one source, as the policer sees it
//! now.

use std::net::IpAddr;

use super::daemon;
use crate::control::{InspectFrame, InspectView};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// The source address (IPv4 or IPv6).
    addr: IpAddr,
    /// The frame's IP protocol (tcp, udp, icmp, icmpv6, sctp, udplite, or
    /// a number): judge a frame of this protocol, choosing among the
    /// prefix's classes as the XDP program does. Without frame options,
    /// the frame matches no class (the prefix's class-less rule), and every
    /// bucket the source has is listed.
    #[arg(long, value_name = "PROTO")]
    proto: Option<String>,
    /// The frame's destination port (with --proto tcp, udp, sctp or
    /// udplite).
    #[arg(long, value_name = "PORT", requires = "proto")]
    dport: Option<u16>,
    /// The frame's source port (with --proto tcp or udp).
    #[arg(long, value_name = "PORT", requires = "proto")]
    sport: Option<u16>,
    /// The TCP flags the frame has set, e.g. `syn` or `syn,ack` (with
    /// --proto tcp).
    #[arg(long, value_name = "FLAGS", requires = "proto")]
    tcp_flags: Option<String>,
    /// The frame's ICMP type, e.g. 8 for an echo request (with --proto
    /// icmp or icmpv6).
    #[arg(long, value_name = "TYPE", requires = "proto")]
    icmp_type: Option<u8>,
    /// The frame's destination address; without it, classes that name a
    /// destination (--dst) do not match.
    #[arg(long, value_name = "ADDR", requires = "proto")]
    dst: Option<IpAddr>,
    /// The frame's length in bytes, for a byte-mode rule (default 1500, a
    /// full-size frame): whether a frame of this size is admitted now.
    #[arg(long, value_name = "BYTES")]
    frame_bytes: Option<u32>,
    /// One JSON object; see docs/json.md for the fields.
    #[arg(long)]
    pub(super) json: bool,
}

/// `1.5 ms`, `2.0 s`: a duration in ns for people.
fn human(ns: u64) -> String {
    match ns {
        0 => "0".into(),
        n if n < 1_000 => format!("{n} ns"),
        n if n < 1_000_000 => format!("{:.1} µs", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n => format!("{:.1} s", n as f64 / 1e9),
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let frame = InspectFrame {
        proto: a.proto,
        dport: a.dport,
        sport: a.sport,
        tcp_flags: a.tcp_flags,
        icmp_type: a.icmp_type,
        dst: a.dst,
        bytes: a.frame_bytes,
    };
    let v = daemon()?.inspect(a.addr, frame)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for n in &v.not_attached {
        println!(
            "warning: the program is NOT ATTACHED on {n} (removed from outside): there every frame passes, whatever follows"
        );
    }
    let Some(rule) = &v.rule else {
        println!("{}: no rule matches; its frames pass unpoliced", v.address);
        print_buckets(&v);
        print_covering(&v);
        return Ok(());
    };
    let action = v.action.as_deref().unwrap_or("-");
    println!("source      {}", v.address);
    println!("rule        {rule} ({action})");
    if let Some(t) = &v.total_rate {
        match &v.global {
            Some(g) => println!("total       {t} for the whole fleet, shared as global {g} (`policer status`)"),
            None => println!("total       {t} for the rule's sources together"),
        }
    }
    match v.syn_verified {
        Some(true) => println!("syn cookies verified: its SYNs are policed by its bucket"),
        Some(false) => println!("syn cookies not verified: its SYNs to a listener get cookies"),
        None => {}
    }
    print_buckets(&v);
    print_covering(&v);
    if let Some(k) = &v.key {
        println!("bucket key  {k}");
    }
    if let Some(b) = &v.ban {
        let by = match (&b.origin[..], &b.rule, &b.reason) {
            ("auto", Some(r), _) => format!("automatic ban (rule {r})"),
            (_, _, Some(why)) => format!("manual ban of {} ({why})", b.prefix),
            _ => format!("manual ban of {}", b.prefix),
        };
        println!("banned      {by} until {}, {:.1} s left", b.expires, b.left_seconds);
        println!("now         {}", verdict(&v));
        return Ok(());
    }
    if matches!(action, "allow" | "deny") {
        let article = if action == "allow" { "an" } else { "a" };
        println!("now         {} ({article} {action} rule has no bucket)", v.now);
        return Ok(());
    }
    if v.has_bucket {
        println!("debt        {} ({:.1} % of the bucket)", human(v.debt_ns), v.fill * 100.0);
        println!("drops       {}", crate::report::estimate(v.drops, v.drops_margin));
    } else if v.new_source.as_deref() == Some("recalled") {
        println!(
            "debt        {} ({:.1} % of the bucket), kept by the recall: no bucket (evicted), its next frame \
             resumes this debt without asking the new-source limiter",
            human(v.debt_ns),
            v.fill * 100.0
        );
    } else {
        println!("debt        none: no bucket (drained and evicted, or never seen); its next frame starts one");
        if let Some(ns) = &v.new_source {
            println!(
                "new source  {ns}{}",
                if ns == "limited" { " (the rule's new-source limiter refuses fresh buckets now)" } else { "" }
            );
        }
    }
    let unit = if v.frame_bytes > 0 { format!("a {}-byte frame", v.frame_bytes) } else { "a packet".into() };
    match v.next_admit_ns {
        Some(0) => println!("next admit  now ({unit})"),
        Some(ns) => println!("next admit  in {} ({unit})", human(ns)),
        None => println!("next admit  never ({unit} costs more than the bucket holds)"),
    }
    println!("now         {}", verdict(&v));
    Ok(())
}

/// The verdict for people: a monitor rule's refusal is a would-drop.
fn verdict(v: &InspectView) -> String {
    match v.verdict.as_str() {
        "would drop" => "would drop (monitor: the frame passes, counted as a would-drop)".into(),
        "" => v.now.clone(),
        s => s.into(),
    }
}

/// Every bucket the source has (listed without frame options).
fn print_buckets(v: &InspectView) {
    if v.buckets.is_empty() {
        return;
    }
    let mut out = String::new();
    crate::report::top_rows(&mut out, "buckets     (each rule that charges this source)", &v.buckets);
    print!("{out}");
}

/// Everything over the source, most specific first: `*` marks what the
/// program applies; each line says why it does or does not.
fn print_covering(v: &InspectView) {
    if v.covering.is_empty() {
        return;
    }
    println!("covering    (most specific first; * applies)");
    let label = |c: &crate::control::InspectCover| {
        let mut l = match c.kind.as_str() {
            "auto ban" => format!("auto ban of {} ({})", c.prefix, c.rule),
            _ => c.rule.clone(),
        };
        if c.has_bucket == Some(false) {
            l.push_str(" (no bucket yet)");
        }
        l
    };
    let width = v.covering.iter().map(|c| label(c).chars().count()).max().unwrap_or(0);
    for c in &v.covering {
        let mark = if c.applies { '*' } else { ' ' };
        println!("  {mark} {:<width$}  {:<7}  {}", label(c), c.action, c.why);
    }
}
