//! What a running policer program holds in the kernel, read by program id
//! from outside any daemon (programs and maps are global, not per network
//! namespace): its rules, new-source limiters, counters and layout stamp.
//! Tests compare two readings to prove a failed start changed nothing.

use std::collections::BTreeMap;

use aya::{
    maps::{Array, LpmTrie, Map, MapData, MapInfo, PerCpuArray},
    programs::loaded_programs,
};
use policer_common::{
    Counters, MAP_COUNTERS, MAP_LAYOUT, MAP_NEW_SOURCES, MAP_RULE_COUNTERS, MAP_RULES_V4, MAP_RULES_V6, NewSources,
    Rule, RuleCounters,
    class::Total,
    syn::{MAP_SYN_CONF, MAP_SYN_TOTALS, SynConf},
};

/// The state of one program's maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// Rule trie entries: "prefix/len" -> rule.
    pub rules: BTreeMap<String, Rule>,
    /// Every new-source limiter slot.
    pub new_sources: Vec<NewSources>,
    /// Every rule counter slot, summed over CPUs.
    pub rule_counters: Vec<RuleCounters>,
    /// Interface counters, summed over CPUs and interfaces.
    pub counters: Counters,
    /// The layout stamp, if the program has one.
    pub layout: Option<u32>,
    /// Every rule slot's SYN cookies' settings and SYN budget (empty for a
    /// program without them).
    pub syn: Vec<(SynConf, Total)>,
}

impl State {
    /// What differs from `other`, briefly (None: nothing).
    pub fn diff(&self, other: &State) -> Option<String> {
        let mut d = Vec::new();
        for (k, r) in &self.rules {
            match other.rules.get(k) {
                None => d.push(format!("rule {k} only before")),
                Some(o) if o != r => d.push(format!("rule {k}: {r:?} -> {o:?}")),
                _ => {}
            }
        }
        for k in other.rules.keys().filter(|k| !self.rules.contains_key(*k)) {
            d.push(format!("rule {k} only after"));
        }
        for (i, (a, b)) in self.new_sources.iter().zip(&other.new_sources).enumerate() {
            if a != b {
                d.push(format!("limiter slot {i}: {a:?} -> {b:?}"));
            }
        }
        for (i, (a, b)) in self.rule_counters.iter().zip(&other.rule_counters).enumerate() {
            if a != b {
                d.push(format!("counter slot {i}: {a:?} -> {b:?}"));
            }
        }
        for (i, (a, b)) in self.syn.iter().zip(&other.syn).enumerate() {
            if a != b {
                d.push(format!("SYN slot {i}: {a:?} -> {b:?}"));
            }
        }
        if self.counters != other.counters {
            d.push(format!("counters: {:?} -> {:?}", self.counters, other.counters));
        }
        if self.layout != other.layout {
            d.push(format!("layout: {:?} -> {:?}", self.layout, other.layout));
        }
        if d.is_empty() { None } else { Some(d.join("\n")) }
    }
}

/// The program's maps by name.
fn maps_of(prog_id: u32) -> BTreeMap<String, u32> {
    let info = loaded_programs()
        .filter_map(|p| p.ok())
        .find(|p| p.id() == prog_id)
        .unwrap_or_else(|| panic!("no program {prog_id}"));
    let mut out = BTreeMap::new();
    for id in info.map_ids().unwrap().unwrap_or_default() {
        if let Ok(m) = MapInfo::from_id(id)
            && let Some(n) = m.name_as_str()
        {
            out.insert(n.to_string(), id);
        }
    }
    out
}

fn open(maps: &BTreeMap<String, u32>, name: &str) -> MapData {
    MapData::from_id(*maps.get(name).unwrap_or_else(|| panic!("no map {name}"))).unwrap()
}

/// Reads the state of program `prog_id` (as `ip link` shows it attached).
pub fn read(prog_id: u32) -> State {
    let maps = maps_of(prog_id);
    let mut rules = BTreeMap::new();
    let v4: LpmTrie<MapData, [u8; 4], Rule> = LpmTrie::try_from(Map::LpmTrie(open(&maps, MAP_RULES_V4))).unwrap();
    for item in v4.iter() {
        let (k, r) = item.unwrap();
        rules.insert(format!("{}/{}", std::net::Ipv4Addr::from(k.data()), k.prefix_len()), r);
    }
    let v6: LpmTrie<MapData, [u8; 16], Rule> = LpmTrie::try_from(Map::LpmTrie(open(&maps, MAP_RULES_V6))).unwrap();
    for item in v6.iter() {
        let (k, r) = item.unwrap();
        rules.insert(format!("{}/{}", std::net::Ipv6Addr::from(k.data()), k.prefix_len()), r);
    }
    let ns: Array<MapData, NewSources> = Array::try_from(Map::Array(open(&maps, MAP_NEW_SOURCES))).unwrap();
    let new_sources = ns.iter().map(|r| r.unwrap()).collect();
    let rc: PerCpuArray<MapData, RuleCounters> =
        PerCpuArray::try_from(Map::PerCpuArray(open(&maps, MAP_RULE_COUNTERS))).unwrap();
    let rule_counters = rc
        .iter()
        .map(|v| {
            let mut sum = RuleCounters::default();
            for c in v.unwrap().iter() {
                sum.add(c);
            }
            sum
        })
        .collect();
    let c: PerCpuArray<MapData, Counters> = PerCpuArray::try_from(Map::PerCpuArray(open(&maps, MAP_COUNTERS))).unwrap();
    let mut counters = Counters::default();
    for v in c.iter() {
        for one in v.unwrap().iter() {
            counters.add(one);
        }
    }
    let layout = maps.get(MAP_LAYOUT).map(|&id| {
        let m: Array<MapData, u32> = Array::try_from(Map::Array(MapData::from_id(id).unwrap())).unwrap();
        m.get(&0, 0).unwrap()
    });
    let syn = match (maps.get(MAP_SYN_CONF), maps.get(MAP_SYN_TOTALS)) {
        (Some(_), Some(_)) => {
            let conf: Array<MapData, SynConf> = Array::try_from(Map::Array(open(&maps, MAP_SYN_CONF))).unwrap();
            let totals: Array<MapData, Total> = Array::try_from(Map::Array(open(&maps, MAP_SYN_TOTALS))).unwrap();
            conf.iter().zip(totals.iter()).map(|(c, t)| (c.unwrap(), t.unwrap())).collect()
        }
        _ => Vec::new(),
    };
    State { rules, new_sources, rule_counters, counters, layout, syn }
}

/// The capacity (`max_entries`) of the map `name` of program `prog_id`.
pub fn max_entries(prog_id: u32, name: &str) -> u32 {
    let id = *maps_of(prog_id).get(name).unwrap_or_else(|| panic!("no map {name}"));
    MapInfo::from_id(id).unwrap().max_entries()
}
