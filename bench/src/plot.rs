//! Charts for the bench reports, drawn with plotters as SVG: panels side by side, the
//! cluster sizes measured along x, one line per runtime and one for the machine's floor.

use std::path::Path;

use plotters::prelude::*;

/// One line of a panel.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// The machine's floor (or a target) rather than a runtime: drawn dashed, in grey.
    pub reference: bool,
}

/// One panel: a titled quantity against cluster size.
pub struct Panel {
    pub title: String,
    pub unit: String,
    pub series: Vec<Series>,
}

const W: u32 = 420;
const H: u32 = 320;
const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

/// Draws `panels` into the SVG file `path`, with `title` above and `foot` (where and when it
/// was measured) below.
pub fn chart(path: &Path, title: &str, foot: &str, panels: &[Panel]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let width = W * panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (width, H + 50)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (head, rest) = root.split_vertically(28);
    let (body, feet) = rest.split_vertically(H);
    head.titled(title, ("sans-serif", 16))
        .map_err(|e| err(&e))?;
    feet.draw_text(foot, &("sans-serif", 11).into_text_style(&feet), (8, 6))
        .map_err(|e| err(&e))?;
    let areas = body.split_evenly((1, panels.len().max(1)));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    // The sizes measured, equally spaced (they grow by a factor, as a log axis would show
    // them), each labelled with its own value.
    let mut sizes: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    let at = |x: f64| SegmentValue::CenterOf(sizes.iter().position(|&s| s == x).unwrap_or(0));
    let y_hi = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let y_hi = if y_hi > 0.0 { y_hi * 1.25 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 13))
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(48)
        .build_cartesian_2d((0..sizes.len().max(1) - 1).into_segmented(), 0.0..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc(&panel.unit)
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => sizes.get(*i).map_or(String::new(), |s| format!("{s}")),
            _ => String::new(),
        })
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let mut color = 0;
    for s in &panel.series {
        let style = if s.reference {
            ShapeStyle::from(&RGBColor(120, 120, 120)).stroke_width(1)
        } else {
            color += 1;
            ShapeStyle::from(&COLORS[(color - 1) % COLORS.len()]).stroke_width(2)
        };
        let pts: Vec<(SegmentValue<usize>, f64)> =
            s.points.iter().map(|&(x, y)| (at(x), y)).collect();
        let drawn = if s.reference {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style))?
        };
        drawn
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, style.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_labels_every_size_measured_and_names_every_line() {
        let path = std::env::temp_dir().join(format!("dvmlab-plot-{}.svg", std::process::id()));
        let line = |name: &str, reference, ys: [f64; 3]| Series {
            name: name.into(),
            points: [8.0, 32.0, 128.0].into_iter().zip(ys).collect(),
            reference,
        };
        let panels = vec![Panel {
            title: "job".into(),
            unit: "ms".into(),
            series: vec![
                line("runtime A", false, [10.0, 20.0, 40.0]),
                line("machine floor", true, [5.0, 9.0, 30.0]),
            ],
        }];
        chart(&path, "a title", "measured here", &panels).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        // plotters writes each text on a line of its own.
        for text in [
            "a title",
            "measured here",
            "runtime A",
            "machine floor",
            "\n8\n",
            "\n32\n",
            "\n128\n",
        ] {
            assert!(svg.contains(text), "{text:?} not in the chart");
        }
    }
}
