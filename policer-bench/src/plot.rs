//! PNG plots (plotters, bitmap backend, fonts through ab_glyph from the
//! DejaVu font Debian ships: no system libraries).

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use plotters::{prelude::*, style::FontStyle};

use super::{accuracy::AccuracyResults, kernel::KernelResults, veth::VethResults};

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const PALETTE: [RGBColor; 7] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(150, 150, 150),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
];

/// Registers the font once; an error says what to install.
pub fn init_font() -> Result<()> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    let bytes = std::fs::read(FONT).with_context(|| format!("{FONT} (Debian package fonts-dejavu-core)"))?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| anyhow!("bad font {FONT}"))?;
    let _ = DONE.set(true);
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plot: {e:?}")
}

/// Short names for the x axis.
fn short(key: &str) -> &'static str {
    match key {
        "xdp_drop" => "xdp_drop floor",
        "policer_drop" => "policer dropping",
        "policer_admit" => "policer admit all",
        "xdp_pass" => "xdp_pass to stack",
        "nft_dynset" => "nft dynset",
        "iptables_legacy_hashlimit" => "iptables-legacy",
        "iptables_nft_hashlimit" => "iptables-nft",
        _ => "?",
    }
}

/// Bars of CPU ns per received packet, whiskers min–max.
pub fn veth_cost(v: &VethResults, path: &Path) -> Result<()> {
    init_font()?;
    let root = BitMapBackend::new(path, (1100, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    // The IPv4 rows (the IPv6 ones have their own table in the report).
    let rows: Vec<&super::veth::VethRow> = v.rows.iter().filter(|r| r.family == super::peers::Family::V4).collect();
    let n = rows.len();
    let ymax = rows.iter().map(|r| r.cpu_ns.max).fold(0.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("CPU ns per received packet: 64 B UDP from {} sources over veth, one CPU", v.sources),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax)
        .map_err(err)?;
    let keys: Vec<String> = rows.iter().map(|r| r.key.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < keys.len() {
                short(&keys[i as usize]).into()
            } else {
                String::new()
            }
        })
        .y_desc("CPU ns / packet (median; whiskers min–max)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    for (i, r) in rows.iter().enumerate() {
        let x = i as f64;
        let c = PALETTE[i % PALETTE.len()];
        chart.draw_series([Rectangle::new([(x - 0.35, 0.0), (x + 0.35, r.cpu_ns.median)], c.filled())]).map_err(err)?;
        chart
            .draw_series([
                PathElement::new(vec![(x, r.cpu_ns.min), (x, r.cpu_ns.max)], BLACK.stroke_width(2)),
                PathElement::new(vec![(x - 0.1, r.cpu_ns.min), (x + 0.1, r.cpu_ns.min)], BLACK.stroke_width(2)),
                PathElement::new(vec![(x - 0.1, r.cpu_ns.max), (x + 0.1, r.cpu_ns.max)], BLACK.stroke_width(2)),
            ])
            .map_err(err)?;
        let label = format!("{:.0} ns  {:.2}×", r.cpu_ns.median, r.vs_floor.median);
        chart
            .draw_series([Text::new(
                label,
                (x - 0.33, r.cpu_ns.max + ymax * 0.03),
                ("sans-serif", 15).into_font().color(&BLACK),
            )])
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Grouped bars: kernel ns per packet by PROG_TEST_RUN at each source count.
pub fn kernel_cost(k: &KernelResults, path: &Path) -> Result<()> {
    init_font()?;
    let root = BitMapBackend::new(path, (1100, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    // Groups: (sources, table) pairs in row order.
    let mut groups: Vec<(u32, u32)> = vec![];
    for r in &k.rows {
        if r.sources > 0 && !groups.contains(&(r.sources, r.table)) {
            groups.push((r.sources, r.table));
        }
    }
    let series = [
        ("parse_lookup", "parse + one LRU lookup (reference)"),
        ("policer_drop", "policer, dropping (1 pps per source)"),
        ("policer_admit", "policer, all admitted"),
    ];
    let ymax = k.rows.iter().map(|r| r.kernel_ns.max).fold(0.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("Kernel ns per packet (BPF_PROG_TEST_RUN, one CPU)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(groups.len() as f64 - 0.5), 0f64..ymax)
        .map_err(err)?;
    let names: Vec<String> = groups
        .iter()
        .map(|&(s, t)| if t < s { format!("{s} sources, {}k table", t / 1024) } else { format!("{s} sources") })
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len())
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("ns / packet (kernel-reported, median)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    let w = 0.25;
    for (si, (key, label)) in series.iter().enumerate() {
        let c = PALETTE[[3, 1, 2][si]];
        let mut bars = vec![];
        let mut texts = vec![];
        for (gi, g) in groups.iter().enumerate() {
            if let Some(r) = k.rows.iter().find(|r| r.key == *key && (r.sources, r.table) == *g) {
                let x = gi as f64 + (si as f64 - 1.0) * w;
                bars.push(Rectangle::new(
                    [(x - w / 2.0 + 0.01, 0.0), (x + w / 2.0 - 0.01, r.kernel_ns.median)],
                    c.filled(),
                ));
                texts.push(Text::new(
                    format!("{:.0}", r.kernel_ns.median),
                    (x - w / 2.0 + 0.02, r.kernel_ns.median + ymax * 0.02),
                    ("sans-serif", 14).into_font().color(&BLACK),
                ));
            }
        }
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(*label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
        chart.draw_series(texts).map_err(err)?;
    }
    if let Some(p) = k.rows.iter().find(|r| r.key == "xdp_pass") {
        let v = p.kernel_ns.median;
        chart
            .draw_series([PathElement::new(vec![(-0.5, v), (groups.len() as f64 - 0.5, v)], BLACK.stroke_width(1))])
            .map_err(err)?
            .label(format!("xdp_pass (empty program) = {v:.0} ns"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Admitted rate of the heavy hitter against its limit: one panel per
/// system (they coincide on one chart).
pub fn accuracy(a: &AccuracyResults, path: &Path) -> Result<()> {
    init_font()?;
    let root = BitMapBackend::new(path, (1100, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            &format!(
                "A heavy hitter offered {:.0} pps against a {} pps limit (burst {}): admitted rate in {} ms bins",
                a.offered_pps, a.limit_pps, a.burst, a.bin_ms
            ),
            ("sans-serif", 20),
        )
        .map_err(err)?;
    let tmax = a.rows.iter().flat_map(|r| r.timeline.last().map(|x| x.0)).fold(a.seconds, f64::max);
    let ymax = a.limit_pps as f64 * 1.3;
    let colors = [PALETTE[1], PALETTE[4], PALETTE[5], PALETTE[6]];
    let cols = 2;
    let rows = a.rows.len().div_ceil(cols).max(1);
    let panels = root.split_evenly((rows, cols));
    for (i, (r, area)) in a.rows.iter().zip(panels.iter()).enumerate() {
        let c = colors[i % colors.len()];
        let adm: u64 = r.admitted.last().copied().unwrap_or(0);
        let exact: u64 = r.exact.last().copied().unwrap_or(0);
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{} (all {} heavy sources: {adm} admitted, {exact} by an exact bucket)",
                    r.label, a.heavy_flows
                ),
                ("sans-serif", 14),
            )
            .margin(8)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..tmax + a.bin_ms as f64 / 1e3, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("s since its first admitted packet")
            .y_desc("admitted pps")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        let lim = a.limit_pps as f64;
        chart
            .draw_series(DashedLineSeries::new(vec![(0.0, lim), (tmax, lim)], 8, 6, BLACK.stroke_width(1)))
            .map_err(err)?;
        chart.draw_series(LineSeries::new(r.timeline.iter().copied(), c.stroke_width(2))).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
