//! What `--dry-run` prints (`rule set`, `rule rm`, `rule import`, `ban`,
//! `reload`): a first line that says nothing changed, the diff, and the
//! live sources whose verdict would change; or the JSON object of
//! docs/json.md.

use crate::control::{DryAggregate, DryRunView, DrySource, FieldChange};

pub fn print(v: &DryRunView, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        print!("{}", text(v));
    }
    Ok(())
}

fn field(c: &FieldChange) -> String {
    format!("{} {} → {}", c.field, c.old.as_deref().unwrap_or("none"), c.new.as_deref().unwrap_or("none"))
}

fn fields(f: &std::collections::BTreeMap<String, String>) -> String {
    f.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

fn source(s: &DrySource) -> String {
    let class = if s.class == "-" { String::new() } else { format!(" [{}]", s.class) };
    let rule =
        if s.rule_now == s.rule_after { s.rule_now.clone() } else { format!("{} → {}", s.rule_now, s.rule_after) };
    format!("    {}{class}  {} pps  rule {rule}  ({})\n", s.source, s.rate_pps, s.why)
}

/// A rule's total judged for all its sources together.
fn aggregate(a: &DryAggregate) -> String {
    let total = |t: Option<f64>| t.map_or("none".to_string(), |t| format!("{t:.0} pps"));
    let Some(rate) = a.rate_pps else {
        return format!(
            "  total of {}: {} → {}; {}\n",
            a.rule,
            total(a.total_now_pps),
            total(a.total_after_pps),
            a.measured_by
        );
    };
    let dropped = |t: Option<f64>, d: f64| match t {
        None => "no total".to_string(),
        Some(_) if d > 0.0 => format!("about {d:.0} pps dropped"),
        Some(_) => "nothing dropped".to_string(),
    };
    format!(
        "  total of {}: its sources send {rate:.0} pps together ({}); total {} → {}: now {}, after {} \
         (which sources lose them: first come, first served)\n",
        a.rule,
        a.measured_by,
        total(a.total_now_pps),
        total(a.total_after_pps),
        dropped(a.total_now_pps, a.drop_now_pps),
        dropped(a.total_after_pps, a.drop_after_pps)
    )
}

/// The human form: leads with "dry run: nothing changed".
pub fn text(v: &DryRunView) -> String {
    let mut o = format!("dry run: nothing changed. `policer {}` would be accepted: {}\n", v.verb, v.message);
    if v.rules_added.is_empty() && v.rules_changed.is_empty() && v.rules_removed.is_empty() && v.sets.is_empty() {
        o.push_str("rules: no change\n");
    }
    for r in &v.rules_added {
        o.push_str(&format!("  + {}  ({})\n", r.rule, fields(&r.fields)));
    }
    for r in &v.rules_changed {
        o.push_str(&format!("  ~ {}  {}\n", r.rule, r.changes.iter().map(field).collect::<Vec<_>>().join(", ")));
    }
    for r in &v.rules_removed {
        o.push_str(&format!("  - {}  (was {})\n", r.rule, fields(&r.fields)));
    }
    for s in &v.sets {
        o.push_str(&format!(
            "  set '{}' {}: {} → {} entries, {} in, {} out\n",
            s.set, s.change, s.entries_before, s.entries_after, s.entries_in, s.entries_out
        ));
        if !s.rule_changes.is_empty() {
            o.push_str(&format!("    rule: {}\n", s.rule_changes.iter().map(field).collect::<Vec<_>>().join(", ")));
        }
        let more = |shown: usize, n: u64| {
            if n > shown as u64 { format!(", and {} more", n - shown as u64) } else { String::new() }
        };
        if !s.sample_in.is_empty() {
            o.push_str(&format!("    in:  {}{}\n", s.sample_in.join(", "), more(s.sample_in.len(), s.entries_in)));
        }
        if !s.sample_out.is_empty() {
            o.push_str(&format!("    out: {}{}\n", s.sample_out.join(", "), more(s.sample_out.len(), s.entries_out)));
        }
    }
    let l = &v.live;
    if let Some(e) = &l.error {
        o.push_str(&format!("live sources: not judged: {e}\n"));
        return o;
    }
    let idle = if l.idle > 0 { format!(" ({} of them sent nothing while watched)", l.idle) } else { String::new() };
    o.push_str(&format!(
        "live sources: {} in the table, {} judged{idle} (rates over {} ms); {} would go pass → drop, {} drop → pass\n",
        l.sources, l.judged, l.window_ms, l.pass_to_drop, l.drop_to_pass
    ));
    for a in &l.aggregates {
        o.push_str(&aggregate(a));
    }
    for (what, n, top) in
        [("pass → drop", l.pass_to_drop, &l.pass_to_drop_top), ("drop → pass", l.drop_to_pass, &l.drop_to_pass_top)]
    {
        if n == 0 {
            continue;
        }
        let shown = if n > top.len() as u64 { format!(" (the {} fastest)", top.len()) } else { String::new() };
        o.push_str(&format!("  {what}{shown}:\n"));
        for s in top {
            o.push_str(&source(s));
        }
    }
    o
}
