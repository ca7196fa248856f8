//! `--dry-run` of a change (`rule set`, `rule rm`, `rule import`, `ban`,
//! `reload`): the owner runs the change's own validation and planner in a
//! mode that stops before anything is written (`Daemon::preview`, `owner.rs`), and
//! hands back the rules and sets before and after ([`Preview`]). The connection's task then says what differs ([`diff`],
//! host-tested) and, off the owner, which sources live in the bucket table
//! would change verdict ([`judge_live`]): each source's rate measured over
//! a window, judged under the rule the program's longest-prefix lookup
//! gives it before and after (as [`crate::resolve`] answers it), with the bucket math of `policer_common`.
//! What it can and cannot predict: docs/dry-run.md.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use ipnet::IpNet;
use policer_common::{
    Bucket, BucketKey, FAMILY_V4, Rule,
    ban::{SlotBan, slot_ban},
    bucket::Action,
};

use super::sets::{SetState, SetsAfter};
use crate::{
    control::{DRY_SAMPLE, DryAggregate, DryLive, DryRule, DryRuleChange, DryRunView, DrySet, DrySource, FieldChange},
    loader::MapReader,
    resolve::{By, Resolver, SetList},
    rules::{RuleKey, RuleSpec},
};

/// What a previewed change captured on its way, where the real change
/// would have started writing.
#[derive(Default)]
pub(super) struct PreviewCapture {
    /// The planned rules (a change of the rules).
    pub rules: Option<super::Rules>,
    /// The sets after (an import, a reload with `[[set]]`s).
    pub sets: Option<BTreeMap<String, SetState>>,
    /// How the sets' entries and rules change.
    pub set_changes: Vec<DrySet>,
    /// The planned protected prefixes (a reload: the file's `protect`).
    pub protect: Option<crate::protect::Protect>,
}

impl PreviewCapture {
    /// A set change's preview ([`SetsAfter`]): the sets after, and each
    /// set's change as the dry run shows it.
    pub(super) fn of_sets(after: SetsAfter) -> PreviewCapture {
        let set_changes = after.changes.iter().map(|(o, n)| set_change(o.as_ref(), n.as_ref())).collect();
        PreviewCapture { sets: Some(after.sets), set_changes, ..PreviewCapture::default() }
    }
}

/// The rules, sets and protected prefixes as the program would hold
/// them: what a source is judged against ([`Resolver`]).
pub(crate) struct World {
    rules: super::Rules,
    sets: Vec<SetList>,
    protect: Vec<IpNet>,
}

impl World {
    pub(super) fn new(
        rules: super::Rules,
        sets: &BTreeMap<String, SetState>,
        protect: &crate::protect::Protect,
    ) -> World {
        let sets = sets
            .values()
            .filter_map(|s| {
                let (v4, v6) = s.values().ok()?;
                let (name, action, entries) = (s.header.name.clone(), s.spec4.action, s.entries.clone());
                Some(SetList { name, action, v4, v6, entries })
            })
            .collect();
        World { rules, sets, protect: protect.nets().to_vec() }
    }

    fn resolver(&self) -> Resolver<'_, super::Rules> {
        Resolver::new(&self.rules, &self.sets, &self.protect)
    }
}

/// What a dry run found on the owner.
pub struct Preview {
    pub(crate) verb: &'static str,
    /// What the change would say it did.
    pub(crate) message: String,
    pub(crate) before: World,
    pub(crate) after: World,
    pub(crate) set_changes: Vec<DrySet>,
}

/// A set's change for the diff: `old` → `new` (`None`: absent).
fn set_change(old: Option<&SetState>, new: Option<&SetState>) -> DrySet {
    let empty: &[IpNet] = &[];
    let (a, b) = (old.map_or(empty, |s| &s.entries[..]), new.map_or(empty, |s| &s.entries[..]));
    let d = crate::sets::diff(a, b);
    let sample = |v: &[IpNet]| v.iter().take(DRY_SAMPLE).map(|n| n.to_string()).collect();
    let rule_changes = match (old, new) {
        (Some(o), Some(n)) => field_changes(&o.spec4, &n.spec4),
        _ => vec![],
    };
    DrySet {
        set: old.or(new).map(|s| s.header.name.clone()).unwrap_or_default(),
        change: match (old, new) {
            (None, _) => "added",
            (_, None) => "removed",
            _ => "changed",
        }
        .into(),
        entries_before: a.len() as u64,
        entries_after: b.len() as u64,
        entries_in: d.add.len() as u64,
        entries_out: d.remove.len() as u64,
        rule_changes,
        sample_in: sample(&d.add),
        sample_out: sample(&d.remove),
    }
}

fn field_changes(old: &RuleSpec, new: &RuleSpec) -> Vec<FieldChange> {
    crate::rules::field_changes(old, new).into_iter().map(|(field, old, new)| FieldChange { field, old, new }).collect()
}

/// The rules added, changed (field by field) and removed from `before`
/// to `after`, in key order.
pub fn diff(
    before: &BTreeMap<RuleKey, RuleSpec>,
    after: &BTreeMap<RuleKey, RuleSpec>,
) -> (Vec<DryRule>, Vec<DryRuleChange>, Vec<DryRule>) {
    let row = |k: &RuleKey, s: &RuleSpec| DryRule { rule: k.to_string(), fields: crate::rules::fields(s) };
    let added = after.iter().filter(|(k, _)| !before.contains_key(k)).map(|(k, s)| row(k, s)).collect();
    let removed = before.iter().filter(|(k, _)| !after.contains_key(k)).map(|(k, s)| row(k, s)).collect();
    let changed = after
        .iter()
        .filter_map(|(k, new)| {
            let old = before.get(k)?;
            let changes = field_changes(old, new);
            (!changes.is_empty()).then(|| DryRuleChange { rule: k.to_string(), changes })
        })
        .collect();
    (added, changed, removed)
}

impl std::fmt::Debug for Preview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preview").field("verb", &self.verb).field("message", &self.message).finish_non_exhaustive()
    }
}

impl Preview {
    /// The view without the live sources (filled by [`judge_live`]).
    pub fn view(&self) -> DryRunView {
        let specs = |w: &World| w.rules.iter().map(|(k, i)| (k.clone(), (*i.spec).clone())).collect::<BTreeMap<_, _>>();
        let (rules_added, rules_changed, rules_removed) = diff(&specs(&self.before), &specs(&self.after));
        DryRunView {
            dry_run: true,
            verb: self.verb.into(),
            message: self.message.clone(),
            rules_added,
            rules_changed,
            rules_removed,
            sets: self.set_changes.clone(),
            live: DryLive::default(),
        }
    }
}

/// How long the table is watched to measure each source's rate.
pub const WINDOW: Duration = Duration::from_secs(1);

/// The frame size a byte-mode rule is judged with (as `policer inspect`).
const FRAME_BYTES: u32 = 1500;

/// A rule a source falls to, and its name.
struct Judged {
    /// The tries' value over the source (before classes).
    rule: Option<Rule>,
    /// Whether that value has classes (frames are looked up in them).
    classes: bool,
    label: String,
}

impl World {
    /// The rule the program gives a frame from `addr` before classes, by
    /// the resolver (as `policer inspect` finds it in the kernel's tries).
    fn lookup(&self, r: &Resolver<'_, super::Rules>, addr: IpAddr) -> Judged {
        let a = r.resolve(addr, None);
        let label = match (a.by, a.prefix) {
            (By::Nothing, _) | (_, None) => "-".into(),
            (By::Protect(p), Some(n)) if p == n => format!("protect {p}"),
            (By::Protect(_) | By::Classes { fallback: None }, Some(n)) => n.to_string(),
            (By::Ban(e) | By::Rule(e) | By::Classes { fallback: Some(e) }, _) => e.key.to_string(),
            (By::Set { set, entry }, _) => format!("set:{} ({entry})", self.sets[set].name),
        };
        Judged { rule: a.trie, classes: a.classes(), label }
    }

    /// The class rule of counter slot `slot`, and its key.
    fn class_rule(&self, slot: u32) -> Option<(RuleKey, Rule)> {
        let (k, i) = self.rules.iter().find(|(k, i)| !k.class().is_none() && i.slot == slot)?;
        Some((k.clone(), i.spec.kernel(i.id).ok()?.with_counter_slot(i.slot)))
    }

    /// The class rule with key `key`.
    fn class_rule_of(&self, key: &RuleKey) -> Option<Rule> {
        let i = self.rules.get(key)?;
        i.spec.kernel(i.id).ok().map(|r| r.with_counter_slot(i.slot))
    }
}

/// The frames per second a rule admits from one source (byte mode: of
/// [`FRAME_BYTES`] frames).
fn capacity_fps(r: &Rule) -> f64 {
    let cost = r.cost(FRAME_BYTES).max(1) as f64;
    1e9 * (1u64 << r.shift.min(policer_common::bucket::MAX_SHIFT)) as f64 / cost
}

/// The verdict on the wire of a source sending `fps` under `rule`, whose
/// bucket is `b`: pass or drop, and why.
fn verdict(rule: Option<&Rule>, fps: f64, b: &Bucket, now_ns: u64, window_s: f64) -> (bool, String) {
    let Some(r) = rule.filter(|r| r.action != policer_common::ACTION_NONE) else {
        return (true, "no rule".into());
    };
    match Action::from_u32(r.action) {
        Some(Action::Allow) => (true, "allow".into()),
        Some(Action::Deny) => (false, "deny".into()),
        Some(Action::Monitor) => (true, "monitor (counts, passes)".into()),
        None => (true, "no rule".into()),
        // A total only: no source has a rate of its own; the total is
        // judged for all of them together (`aggregates`).
        Some(Action::Police) if r.flags & policer_common::class::RULE_NO_SOURCE != 0 => {
            (true, "no rate of its own (the rule's total is judged as an aggregate)".into())
        }
        Some(Action::Police) => {
            if slot_ban(b.stamp()) == SlotBan::Banned && b.tat > now_ns {
                return (false, "banned automatically".into());
            }
            let cap = capacity_fps(r);
            if r.cost(FRAME_BYTES) > r.limit {
                return (false, "a frame costs more than the burst".into());
            }
            // One frame over the window, or 1 %, is measurement noise.
            let over = fps > cap * 1.01 + 1.0 / window_s;
            let how = if over { "over" } else { "within" };
            (!over, format!("sends {fps:.0} pps, {how} the rule's {cap:.0} pps"))
        }
    }
}

fn source_of(k: &BucketKey) -> (IpAddr, String) {
    let addr: IpAddr = if k.family == FAMILY_V4 {
        std::net::Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3]).into()
    } else {
        std::net::Ipv6Addr::from(k.addr).into()
    };
    let full = if addr.is_ipv4() { 32 } else { 128 };
    let text = if k.key_len >= full { addr.to_string() } else { format!("{addr}/{}", k.key_len) };
    (addr, text)
}

/// Whether the bucket `b`, under `r` at `now_ns`, refuses a frame (a
/// police or monitor rule's bucket at its limit).
fn limited(r: &Rule, b: &Bucket, now_ns: u64) -> bool {
    let polices = r.action == Action::Police as u32 || r.action == Action::Monitor as u32;
    let same = b.stamp() as u64 == r.stamp as u64 & policer_common::bucket::STAMP_MASK;
    polices && same && r.admit(b.tat, now_ns, FRAME_BYTES).is_none()
}

/// Whether two rules judge a source alike (ids and counter slots aside).
fn alike(a: &Judged, b: &Judged) -> bool {
    let plain = |r: &Rule| (r.action, r.pkt_cost, r.byte_cost, r.limit, r.shift, r.key_len);
    (a.rule.as_ref().map(plain), a.classes) == (b.rule.as_ref().map(plain), b.classes)
}

/// Sources whose rate is measured at most: each is read
/// [`samples`] times over the window.
pub const MAX_MEASURED: usize = 2048;
/// Reads of each measured source's bucket over the window: at least
/// 40, and as many as [`READS`] shared by the sources allow, up to 2 000
/// (a read each half millisecond: faster than the frames of a source of up
/// to ~2 000 pps, whose frames are then each seen, [`Rule::admitted_between`]).
fn samples(sources: usize) -> u64 {
    (READS / sources.max(1) as u64).clamp(40, 2000)
}
/// Bucket reads a dry run makes over its window, at most (each is a
/// system call: 80 000 of them take a fraction of a core for a second).
const READS: u64 = 80_000;

/// A source whose rule would change: what it is judged under.
struct ChangingSource {
    key: BucketKey,
    source: String,
    class: String,
    now: Judged,
    after: Judged,
    /// (bucket, clock) of the first and last read; reads with debt, reads.
    first: Option<(Bucket, u64)>,
    last: Option<(Bucket, u64)>,
    busy: u64,
    /// Reads that found the bucket refusing a frame (at its limit).
    refusing: u64,
    reads: u64,
    /// Frames admitted between reads, as the bucket's moves show them.
    admitted: u64,
}

/// The frames per second `c` sent while watched (admitted and dropped).
/// Admitted work = the debt's change + the time the bucket held debt: a
/// bucket drains at one second per second while it holds any, and the
/// share of reads that found debt is the share of time it held some (a
/// source in profile drains it between frames; a heavy one never does).
fn rate(c: &ChangingSource) -> f64 {
    let (Some((b0, t0)), Some((b1, t1))) = (c.first, c.last) else { return 0.0 };
    let secs = t1.saturating_sub(t0) as f64 / 1e9;
    if secs <= 0.0 {
        return 0.0;
    }
    let drops = b1.drops().saturating_sub(b0.drops()) as f64;
    let Some(r) =
        c.now.rule.as_ref().filter(|r| r.action == Action::Police as u32 || r.action == Action::Monitor as u32)
    else {
        return drops / secs;
    };
    let ok = |b: &Bucket| b.stamp() as u64 == r.stamp as u64 & policer_common::bucket::STAMP_MASK;
    let work_ns = if ok(&b0) && ok(&b1) {
        let busy = c.busy as f64 / c.reads.max(1) as f64;
        (r.debt_ns(b1.tat, t1) as f64 - r.debt_ns(b0.tat, t0) as f64 + busy * secs * 1e9).max(0.0)
    } else {
        0.0
    };
    let frame_ns = (r.cost(FRAME_BYTES) >> r.shift.min(policer_common::bucket::MAX_SHIFT)).max(1) as f64;
    // The frames the bucket's moves showed are exact while it stays in
    // debt, and while the reads come faster than the frames (at least two
    // reads a frame); else at least that many, and the work it took (a
    // share of reads, so within a few percent) says more.
    let seen = c.admitted as f64;
    let admitted = if seen > 0.0 && c.reads as f64 >= 2.0 * seen { seen } else { (work_ns / frame_ns).max(seen) };
    (admitted + drops) / secs
}

/// Rule counters of every slot, and the clock when read.
type Counted = (Vec<(u32, policer_common::RuleCounters)>, u64);

/// The frames per second a total of `rate`, `burst` admits (of
/// [`FRAME_BYTES`] frames for a bit rate).
fn total_fps(total: Option<(policer_common::rate::Rate, u64)>) -> Option<f64> {
    let (rate, burst) = total?;
    rate.rule(burst).ok().map(|r| capacity_fps(&r))
}

/// Each rule with a total that the change adds, changes or removes: what
/// its sources sent together while watched against its total now and
/// after. A rule in force is measured by its counters over the window
/// (`counts`: before and after it); a new one by the buckets of the
/// sources it would take (`cands`, measured), when they have any.
fn aggregates(preview: &Preview, cands: &[ChangingSource], counts: Option<&(Counted, Counted)>) -> Vec<DryAggregate> {
    let (before, after) = (&preview.before.rules, &preview.after.rules);
    let total = |r: &super::Rules, k: &RuleKey| r.get(k).and_then(|i| i.spec.total());
    let mut keys: Vec<&RuleKey> = after.keys().chain(before.keys().filter(|k| !after.contains_key(*k))).collect();
    keys.retain(|&k| {
        let (now, then) = (total(before, k), total(after, k));
        let spec = |r: &super::Rules| r.get(k).map(|i| i.spec.clone());
        (now.is_some() || then.is_some()) && (now != then || spec(before) != spec(after))
    });
    keys.into_iter()
        .map(|k| {
            let (rate_pps, measured_by) = match (before.get(k), counts) {
                (Some(i), Some(((c0, t0), (c1, t1)))) => {
                    let sum = |c: &[(u32, policer_common::RuleCounters)]| {
                        c.iter()
                            .find(|(s, _)| *s == i.slot)
                            .map_or(0, |(_, r)| r.passed_pkts + r.dropped_pkts + r.would_drop_pkts)
                    };
                    let secs = t1.saturating_sub(*t0) as f64 / 1e9;
                    let pps = (secs > 0.0).then(|| sum(c1).saturating_sub(sum(c0)) as f64 / secs);
                    (pps, "the rule's counters".to_string())
                }
                (Some(_), None) => (None, "not measured: the rule counters could not be read".into()),
                (None, _) => {
                    let label = k.to_string();
                    let under: Vec<&ChangingSource> = cands.iter().filter(|c| c.after.label == label).collect();
                    if under.is_empty() {
                        (None, "not measured: no source under it has a bucket now (a new rule over sources that a deny, a ban or a total only judges, or none sent)".into())
                    } else {
                        (Some(under.iter().map(|c| rate(c)).sum()), format!("the buckets of {} sources under it", under.len()))
                    }
                }
            };
            let (now, then) = (total_fps(total(before, k)), total_fps(total(after, k)));
            let drop = |cap: Option<f64>| match (rate_pps, cap) {
                (Some(r), Some(c)) => ((r - c).max(0.0) * 10.0).round() / 10.0,
                _ => 0.0,
            };
            DryAggregate {
                rule: k.to_string(),
                rate_pps: rate_pps.map(|r| (r * 10.0).round() / 10.0),
                measured_by,
                total_now_pps: now,
                total_after_pps: then,
                drop_now_pps: drop(now),
                drop_after_pps: drop(then),
            }
        })
        .collect()
}

/// Which sources in the bucket table would change verdict from `before`
/// to `after`: the table read once (off the owner) for the sources whose
/// rule would change, the buckets of those (the first [`MAX_MEASURED`],
/// most dropped first) read [`samples`] times over `window` to measure
/// their rate, each judged under the rule each side gives it.
pub(crate) fn judge_live(reader: &MapReader, preview: &Preview, window: Duration) -> DryLive {
    let mut live = DryLive { window_ms: window.as_millis() as u64, ..Default::default() };
    let mut cands = match changing_sources(reader, preview, &mut live.sources) {
        Ok(cands) => cands,
        Err(e) => {
            live.error = Some(e.to_string());
            return live;
        }
    };
    live.judged = cands.len() as u64;
    // The read's time is the middle of the clocks taken around it: a
    // thread held between the read and one clock (a busy host) would
    // otherwise shift the window by all of that.
    let counted = |r: &MapReader| {
        let a = super::monotonic_ns();
        let c = r.rule_counters()?;
        let b = super::monotonic_ns();
        Ok::<_, crate::Error>((c, a + (b - a) / 2))
    };
    let before = counted(reader);
    if let Err(e) = watch(reader, &mut cands, window) {
        live.error = Some(e.to_string());
        return live;
    }
    let counts = before.and_then(|b| Ok((b, counted(reader)?)));
    live.aggregates = aggregates(preview, &cands, counts.as_ref().ok());
    let window_s = window.as_secs_f64().max(1e-3);
    // A source that sent nothing while watched changes no verdict now.
    let (idle, sending): (Vec<_>, Vec<_>) = cands.into_iter().partition(|c| {
        let dropped = match (c.first, c.last) {
            (Some((b0, _)), Some((b1, _))) => b1.drops() > b0.drops(),
            _ => false,
        };
        rate(c) == 0.0 && !dropped
    });
    live.idle = idle.len() as u64;
    let rows: Vec<(bool, DrySource)> = sending.into_iter().filter_map(|c| changed_verdict(c, window_s)).collect();
    let (mut p2d, mut d2p): (Vec<_>, Vec<_>) = rows.into_iter().partition(|(pass_now, _)| *pass_now);
    for (list, count, top) in [
        (&mut p2d, &mut live.pass_to_drop, &mut live.pass_to_drop_top),
        (&mut d2p, &mut live.drop_to_pass, &mut live.drop_to_pass_top),
    ] {
        *count = list.len() as u64;
        list.sort_by(|a, b| b.1.rate_pps.total_cmp(&a.1.rate_pps).then_with(|| a.1.source.cmp(&b.1.source)));
        *top = list.drain(..).take(DRY_SAMPLE).map(|(_, s)| s).collect();
    }
    live
}

/// The sources in the bucket table (read once, off the owner; `sources`
/// counts them) whose rule would change: the first [`MAX_MEASURED`], most
/// dropped first.
fn changing_sources(reader: &MapReader, preview: &Preview, sources: &mut u64) -> crate::Result<Vec<ChangingSource>> {
    let mut cands: Vec<(u64, ChangingSource)> = Vec::new();
    let (before, after) = (preview.before.resolver(), preview.after.resolver());
    reader.for_each_bucket_read(|k, b, _, _| {
        *sources += 1;
        let (addr, source) = source_of(k);
        let (now, after, class) = if k.class == 0 {
            (preview.before.lookup(&before, addr), preview.after.lookup(&after, addr), "-".to_string())
        } else {
            let Some((key, rule)) = preview.before.class_rule(k.class) else { return };
            let base = preview.after.lookup(&after, addr);
            let denied = !base.classes && base.rule.is_some_and(|r| r.action == Action::Deny as u32);
            let after = match (denied, preview.after.class_rule_of(&key)) {
                (true, _) => base,
                (false, Some(r)) => Judged { rule: Some(r), classes: false, label: key.to_string() },
                // Its frames fall to a rule only a frame tells.
                (false, None) => return,
            };
            (Judged { rule: Some(rule), classes: false, label: key.to_string() }, after, key.class().to_string())
        };
        if alike(&now, &after) {
            return;
        }
        let c = ChangingSource {
            key: *k,
            source,
            class,
            now,
            after,
            first: None,
            last: None,
            busy: 0,
            refusing: 0,
            reads: 0,
            admitted: 0,
        };
        cands.push((b.drops(), c));
    })?;
    cands.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.source.cmp(&b.1.source)));
    Ok(cands.into_iter().take(MAX_MEASURED).map(|(_, c)| c).collect())
}

/// Reads the bucket of each of `cands` [`samples`] times over `window`,
/// each read kept in its [`ChangingSource`].
fn watch(reader: &MapReader, cands: &mut [ChangingSource], window: Duration) -> crate::Result<()> {
    // Reads spread over the window, each pause jittered so that a source
    // sending at a steady pace is not read in step with it.
    let n = samples(cands.len());
    let step = window / n as u32;
    let mut seed = super::monotonic_ns() | 1;
    for _ in 0..n {
        for c in cands.iter_mut() {
            // Stamped at the middle of the clocks around the read (a thread
            // held on one side of it would shift the window).
            let a = super::monotonic_ns();
            let Some(b) = reader.bucket(&c.key)? else { continue };
            let t = a + (super::monotonic_ns() - a) / 2;
            if let (Some((pb, pt)), Some(r)) = (c.last, c.now.rule.as_ref())
                && pb.stamp() == b.stamp()
            {
                c.admitted += r.admitted_between(pb.tat, pt, b.tat, t, FRAME_BYTES);
            }
            c.first.get_or_insert((b, t));
            c.last = Some((b, t));
            c.reads += 1;
            if c.now.rule.is_some_and(|r| r.debt_ns(b.tat, t) > 0) {
                c.busy += 1;
            }
            if c.now.rule.is_some_and(|r| limited(&r, &b, t)) {
                c.refusing += 1;
            }
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let jitter = step.mul_f64(0.5 + (seed % 1000) as f64 / 1000.0);
        std::thread::sleep(jitter);
    }
    Ok(())
}

/// A watched source judged now and after at the rate it sent (`window_s`:
/// the window, in seconds): its row and whether it passes now, if its
/// verdict changes.
fn changed_verdict(c: ChangingSource, window_s: f64) -> Option<(bool, DrySource)> {
    let (b, t) = c.last?;
    let fps = rate(&c);
    let (mut pass_now, mut why_now) = verdict(c.now.rule.as_ref(), fps, &b, t, window_s);
    // Drops counted while watched are the verdict now, whatever the
    // rate says (drops are counted one in 2^N, as 2^N: the rate of a
    // dropped source is the less exact part).
    let dropped = c.first.map_or(0, |(b0, _)| b.drops().saturating_sub(b0.drops()));
    let polices = |r: Option<&Rule>| r.is_some_and(|r| r.action == Action::Police as u32);
    // A bucket found refusing at most reads is at its limit: the source
    // sends at least the rule's rate and loses the rest (the drops it
    // lost are counted one in 2^N, so their absence says little).
    let at_limit = c.refusing * 2 > c.reads;
    if pass_now && polices(c.now.rule.as_ref()) && (dropped > 0 || at_limit) {
        let how = if at_limit { "is at its limit" } else { "lost frames" };
        (pass_now, why_now) = (false, format!("sends {fps:.0} pps or more and {how} while watched"));
    }
    let (mut pass_after, mut why_after) = verdict(c.after.rule.as_ref(), fps, &b, t, window_s);
    // At its limit now, it sends at least that rate: a rule after that
    // admits no more than the rule now drops it too.
    if at_limit
        && pass_after
        && let (Some(n), Some(a)) = (c.now.rule.as_ref(), c.after.rule.as_ref())
        && polices(Some(a))
        && capacity_fps(a) <= capacity_fps(n) * 1.01 + 1.0 / window_s
    {
        (pass_after, why_after) =
            (false, format!("sends at least the {:.0} pps it is held to now, over the rule's", capacity_fps(a)));
    }
    if pass_now == pass_after {
        return None;
    }
    let word = |p: bool| if p { "pass" } else { "drop" }.to_string();
    Some((
        pass_now,
        DrySource {
            source: c.source,
            class: c.class,
            rule_now: c.now.label,
            rule_after: c.after.label,
            rate_pps: (fps * 10.0).round() / 10.0,
            now: word(pass_now),
            after: word(pass_after),
            why: format!("now: {why_now}; after: {why_after}"),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleConfig;

    fn spec(prefix: &str, f: impl FnOnce(&mut RuleConfig)) -> RuleSpec {
        let mut c = RuleConfig { prefix: prefix.into(), rate: Some("100pps".into()), ..Default::default() };
        f(&mut c);
        c.validate().unwrap()
    }

    fn map(specs: &[RuleSpec]) -> BTreeMap<RuleKey, RuleSpec> {
        specs.iter().map(|s| (s.key(), s.clone())).collect()
    }

    #[test]
    fn the_diff_names_each_field_that_changes_old_to_new() {
        let a = spec("10.0.0.0/8", |_| {});
        let a2 = spec("10.0.0.0/8", |c| {
            c.rate = Some("2kbit".into());
            c.burst = Some(crate::rules::BurstValue::Text("3000b".into()));
            c.ttl = Some("1h".into());
            c.total_rate = Some("10kbit".into());
        });
        let b = spec("192.0.2.0/24", |c| c.action = Some(Action::Monitor));
        let c = spec("198.51.100.0/24", |c| {
            c.proto = Some("udp".into());
            c.dport = Some(crate::rules::PortValue::Text("53".into()));
        });
        let (added, changed, removed) = diff(&map(&[a.clone(), b.clone()]), &map(&[a2, c.clone()]));
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].rule, c.key().to_string());
        assert_eq!(added[0].fields.get("proto").map(String::as_str), Some("udp"), "{:?}", added[0].fields);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].rule, "192.0.2.0/24");
        assert_eq!(removed[0].fields.get("action").map(String::as_str), Some("monitor"));
        assert_eq!(changed.len(), 1);
        let f: BTreeMap<&str, (Option<&str>, Option<&str>)> =
            changed[0].changes.iter().map(|c| (c.field.as_str(), (c.old.as_deref(), c.new.as_deref()))).collect();
        assert_eq!(f.get("rate"), Some(&(Some("100pps"), Some("2kbit"))), "{f:?}");
        assert_eq!(f.get("burst").map(|b| b.1), Some(Some("3000b")), "{f:?}");
        assert!(f.get("expires").is_some_and(|e| e.0.is_none() && e.1.is_some()), "the ttl as an expiry: {f:?}");
        assert_eq!(f.get("total-rate"), Some(&(None, Some("10kbit"))), "{f:?}");
        assert!(!f.contains_key("action") && !f.contains_key("key-len"), "only what differs: {f:?}");
    }

    #[test]
    fn the_same_rules_diff_to_nothing() {
        let a = map(&[spec("10.0.0.0/8", |_| {}), spec("::/0", |c| c.action = Some(Action::Allow))]);
        let (added, changed, removed) = diff(&a, &a);
        assert!(added.is_empty() && changed.is_empty() && removed.is_empty());
    }

    #[test]
    fn a_rate_measured_from_the_bucket_is_judged_against_the_rule() {
        let r = spec("10.0.0.0/8", |_| {}).kernel(1).unwrap();
        let shift = r.shift;
        let now = 10_000_000_000u64;
        // A bucket read 40 times over a second, holding debt at 20 of
        // the reads, its debt the same at both ends: half a second of
        // work, 50 frames of 10 ms; and 7 dropped.
        let b = |drops: u64| Bucket { tat: now.wrapping_shl(shift), meta: r.bucket(0).meta | (drops << 24) };
        let c = ChangingSource {
            key: BucketKey::default(),
            source: String::new(),
            class: String::new(),
            now: Judged { rule: Some(r), classes: false, label: String::new() },
            after: Judged { rule: None, classes: false, label: String::new() },
            first: Some((b(3), now)),
            last: Some((b(10), now + 1_000_000_000)),
            busy: 20,
            refusing: 0,
            reads: 40,
            admitted: 0,
        };
        assert!((rate(&c) - 57.0).abs() < 0.01, "{}", rate(&c));
        let b2 = b(10);
        // Within 100 pps: passes; a 30 pps rule drops it.
        assert!(verdict(Some(&r), 50.0, &b2, now, 1.0).0);
        let low = spec("10.0.0.0/8", |c| c.rate = Some("30pps".into())).kernel(2).unwrap();
        let (pass, why) = verdict(Some(&low), 50.0, &b2, now, 1.0);
        assert!(!pass && why.contains("over the rule's 30 pps"), "{why}");
        assert!((capacity_fps(&low) - 30.0).abs() < 0.01);
        // Deny drops, allow passes, whatever the rate.
        let deny = r.with_action(Action::Deny);
        assert!(!verdict(Some(&deny), 0.0, &b2, now, 1.0).0);
        assert!(verdict(Some(&r.with_action(Action::Allow)), 1e6, &b2, now, 1.0).0);
    }

    #[test]
    fn a_bucket_at_its_limit_is_found_refusing() {
        let r = spec("10.0.0.0/8", |_| {}).kernel(1).unwrap();
        let now = 10_000_000_000u64;
        let at = |debt_ns: u64| Bucket { tat: (now + debt_ns).wrapping_shl(r.shift), meta: r.bucket(0).meta };
        // No debt, half the burst: a frame passes.
        assert!(!limited(&r, &at(0), now));
        assert!(!limited(&r, &at((r.limit / 2) >> r.shift), now));
        // Full: refused.
        let full = at(r.limit >> r.shift);
        assert!(limited(&r, &full, now), "{:?}", r.admit(full.tat, now, FRAME_BYTES));
        // A deny rule's or another rule's bucket is not "at its limit".
        assert!(!limited(&r.with_action(Action::Deny), &full, now));
    }
}
