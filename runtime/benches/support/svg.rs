//! A small SVG line-chart writer for the benchmark reports: panels side by side, a log-2 x
//! axis of cluster sizes, series as polylines with dots, and a dashed target line.

use std::fmt::Write;

/// One panel: a titled y quantity against cluster size.
pub struct Panel<'a> {
    pub title: &'a str,
    pub unit: &'a str,
    pub series: Vec<(&'a str, Vec<f64>)>,
    pub target: Option<f64>,
}

const W: f64 = 320.0;
const H: f64 = 240.0;
const M: (f64, f64, f64, f64) = (48.0, 16.0, 34.0, 40.0); // left, right, top, bottom
const COLORS: [&str; 3] = ["#1f77b4", "#d62728", "#2ca02c"];

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

/// Renders `panels` over the x values `xs` (cluster sizes).
pub fn chart(title: &str, xs: &[f64], panels: &[Panel]) -> String {
    let total_w = W * panels.len() as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{}" font-family="sans-serif" font-size="11">"#,
        H + 24.0
    );
    let _ = write!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="8" y="16" font-size="13" font-weight="bold">{title}</text>"#
    );
    let (lx0, lx1) = (
        xs.first().copied().unwrap_or(1.0).log2(),
        xs.last().copied().unwrap_or(2.0).log2(),
    );
    for (pi, p) in panels.iter().enumerate() {
        let ox = W * pi as f64;
        let oy = 24.0;
        let (x0, x1, y0, y1) = (ox + M.0, ox + W - M.1, oy + H - M.3, oy + M.2);
        let ymax = nice_max(
            p.series
                .iter()
                .flat_map(|(_, v)| v.iter().copied())
                .chain(p.target)
                .fold(0.0, f64::max)
                * 1.1,
        );
        let px = |x: f64| x0 + (x.log2() - lx0) / (lx1 - lx0).max(1e-9) * (x1 - x0);
        let py = |y: f64| y0 - y / ymax * (y0 - y1);
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" font-weight="bold">{} ({})</text>"#,
            x0,
            y1 - 10.0,
            p.title,
            p.unit
        );
        let _ = write!(
            s,
            r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>"##
        );
        for k in 0..=4 {
            let y = ymax * k as f64 / 4.0;
            let _ = write!(
                s,
                r##"<line x1="{x0}" y1="{yy}" x2="{x1}" y2="{yy}" stroke="#eee"/><text x="{tx}" y="{ty}" text-anchor="end">{y}</text>"##,
                yy = py(y),
                tx = x0 - 4.0,
                ty = py(y) + 4.0,
                y = (y * 100.0).round() / 100.0
            );
        }
        for &x in xs {
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{x}</text>"#,
                px(x),
                y0 + 14.0
            );
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">nodes</text>"#,
            (x0 + x1) / 2.0,
            y0 + 28.0
        );
        if let Some(t) = p.target {
            let _ = write!(
                s,
                r##"<line x1="{x0}" y1="{ty}" x2="{x1}" y2="{ty}" stroke="#888" stroke-dasharray="5,4"/><text x="{x1}" y="{tl}" text-anchor="end" fill="#666">target {t}</text>"##,
                ty = py(t),
                tl = py(t) - 4.0
            );
        }
        for (si, (name, ys)) in p.series.iter().enumerate() {
            let c = COLORS[si % COLORS.len()];
            let pts: Vec<String> = xs
                .iter()
                .zip(ys)
                .map(|(&x, &y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
                pts.join(" ")
            );
            for pt in &pts {
                let (cx, cy) = pt.split_once(',').unwrap_or(("0", "0"));
                let _ = write!(s, r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{c}"/>"#);
            }
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" fill="{c}">{name}</text>"#,
                x0 + 8.0,
                y1 + 12.0 + 13.0 * si as f64
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
