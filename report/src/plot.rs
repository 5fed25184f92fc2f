//! PNG figures (plotters, bitmap backend): eigenvalue trajectories and comparison bar charts.
//!
//! Text is drawn with DejaVu Sans embedded in the binary (`assets/`), so plots look the same on
//! machines without system fonts.

use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

const FONT_FAMILY: &str = "sans-serif";
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT)
            .unwrap_or_else(|_| panic!("the embedded DejaVu Sans is a valid font"));
    });
}

fn plot_error<E: std::fmt::Debug>(path: &Path) -> impl FnOnce(E) -> anyhow::Error + '_ {
    move |e| anyhow!("cannot draw {}: {e:?}", path.display())
}

/// One line of a line plot.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel of a figure: a title and its lines.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

/// `y` with three significant digits and no trailing zeros (`0.3`, `0.012`, `250`).
fn significant(y: f64) -> String {
    if y == 0.0 || !y.is_finite() {
        return format!("{y}");
    }
    let decimals = (2 - y.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{y:.decimals$}");
    match text.contains('.') {
        true => text.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => text,
    }
}

/// Axis labels and scale shared by every panel of a line figure.
pub struct LineAxes<'a> {
    /// The x axis counts something (steps): its labels print as integers.
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_y: bool,
}

/// Draws `panels` side by side (up to 4 per row) into a PNG at `path`. With `log_y`, values ≤ 0
/// are left out (a log axis cannot show them).
pub fn line_panels(path: &Path, panels: &[Panel], axes: &LineAxes<'_>) -> Result<()> {
    register_font();
    let cols = panels.len().clamp(1, 4);
    let rows = panels.len().div_ceil(cols).max(1);
    let root = BitMapBackend::new(path, (520 * cols as u32, 400 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error(path))?;
    for (area, panel) in root.split_evenly((rows, cols)).iter().zip(panels) {
        let keep = |y: f64| y.is_finite() && (!axes.log_y || y > 0.0);
        let points = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(_, y)| keep(*y));
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in points {
            (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 1e-3, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(&panel.title, (FONT_FAMILY, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        // Many lines (one per eigenvalue rank): a hue ramp, so rank order reads from colour.
        let colour = |k: usize, n: usize| match n > 10 {
            true => HSLColor(0.75 * k as f64 / n as f64, 0.85, 0.45).stroke_width(2),
            false => Palette99::pick(k % 99).stroke_width(2),
        };
        if axes.log_y {
            let mut chart = builder
                .build_cartesian_2d(x0..x1, (y0 * 0.8..y1 * 1.25).log_scale())
                .map_err(plot_error(path))?;
            chart
                .configure_mesh()
                .x_desc(axes.x_label)
                .y_desc(axes.y_label)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .y_labels(8)
                .y_label_formatter(&|y| significant(*y))
                .label_style((FONT_FAMILY, 13))
                .draw()
                .map_err(plot_error(path))?;
            for (k, s) in panel.series.iter().enumerate() {
                let line = s.points.iter().copied().filter(|(_, y)| keep(*y));
                chart
                    .draw_series(LineSeries::new(line, colour(k, panel.series.len())))
                    .map_err(plot_error(path))?;
            }
        } else {
            let pad = ((y1 - y0) * 0.05).max(1e-9);
            let mut chart = builder
                .build_cartesian_2d(x0..x1, y0 - pad..y1 + pad)
                .map_err(plot_error(path))?;
            chart
                .configure_mesh()
                .x_desc(axes.x_label)
                .y_desc(axes.y_label)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .label_style((FONT_FAMILY, 13))
                .draw()
                .map_err(plot_error(path))?;
            for (k, s) in panel.series.iter().enumerate() {
                let n = panel.series.len();
                chart
                    .draw_series(LineSeries::new(s.points.iter().copied(), colour(k, n)))
                    .map_err(plot_error(path))?
                    .label(&s.label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], Palette99::pick(k % 99))
                    });
            }
            if panel.series.len() <= 10 {
                chart
                    .configure_series_labels()
                    .label_font((FONT_FAMILY, 13))
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(plot_error(path))?;
            }
        }
    }
    root.present().map_err(plot_error(path))?;
    Ok(())
}

/// One bar with its error bar (± `std`).
pub struct Bar {
    pub label: String,
    pub mean: f64,
    pub std: f64,
}

/// One panel of horizontal bars (labels on the y axis), with optional vertical reference lines
/// (e.g. the raw-pixel and random-init baselines).
pub struct BarPanel {
    pub title: String,
    pub x_label: String,
    pub bars: Vec<Bar>,
    pub references: Vec<(String, f64)>,
}

/// Colours of a bar chart's reference lines, in order.
const REFERENCE_COLOURS: [RGBColor; 3] = [RED, BLUE, GREEN];

/// Height in pixels of one line of a bar chart's key to its reference lines.
const KEY_LINE_HEIGHT: u32 = 18;

/// Draws `panels` side by side into a PNG at `path`.
pub fn bar_panels(path: &Path, panels: &[BarPanel]) -> Result<()> {
    register_font();
    let n = panels
        .iter()
        .map(|p| p.bars.len())
        .max()
        .unwrap_or(1)
        .max(1);
    // The reference lines are named in a key under the axis, one line each: a legend box would
    // cover the bars, and names set along the axis label run into the next panel.
    let key_lines = panels.iter().map(|p| p.references.len()).max().unwrap_or(0) as u32;
    let height = (120 + 26 * n) as u32 + KEY_LINE_HEIGHT * key_lines;
    let root =
        BitMapBackend::new(path, (620 * panels.len().max(1) as u32, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error(path))?;
    for (area, panel) in root
        .split_evenly((1, panels.len().max(1)))
        .iter()
        .zip(panels)
    {
        let (area, key) = area.split_vertically(height - KEY_LINE_HEIGHT * key_lines);
        for (line, ((name, _), colour)) in panel
            .references
            .iter()
            .zip(REFERENCE_COLOURS.iter().cycle())
            .enumerate()
        {
            let y = (KEY_LINE_HEIGHT * line as u32 + KEY_LINE_HEIGHT / 2) as i32;
            key.draw(&PathElement::new(
                vec![(24, y), (48, y)],
                colour.stroke_width(2),
            ))
            .map_err(plot_error(path))?;
            key.draw(&Text::new(
                name.as_str(),
                (56, y - 7),
                (FONT_FAMILY, 13).into_font(),
            ))
            .map_err(plot_error(path))?;
        }
        let values = panel
            .bars
            .iter()
            .flat_map(|b| [b.mean - b.std, b.mean + b.std])
            .chain(panel.references.iter().map(|r| r.1))
            .filter(|v| v.is_finite());
        let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let (lo, hi) = if lo > hi { (0.0, 1.0) } else { (lo, hi) };
        let pad = ((hi - lo) * 0.08).max(1e-3);
        let labels: Vec<String> = panel.bars.iter().map(|b| b.label.clone()).collect();
        let label_width = labels.iter().map(|l| l.len()).max().unwrap_or(4) as u32 * 8 + 12;
        let mut chart = ChartBuilder::on(&area)
            .caption(&panel.title, (FONT_FAMILY, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(label_width.min(300))
            .build_cartesian_2d(
                (lo - pad).max(0.0)..hi + pad,
                -0.5..panel.bars.len() as f64 - 0.5,
            )
            .map_err(plot_error(path))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(panel.x_label.as_str())
            .y_labels(panel.bars.len().max(1))
            .y_label_formatter(&|y| {
                let k = y.round();
                if (y - k).abs() < 1e-6 && k >= 0.0 {
                    labels.get(k as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .label_style((FONT_FAMILY, 13))
            .draw()
            .map_err(plot_error(path))?;
        let base = (lo - pad).max(0.0);
        chart
            .draw_series(panel.bars.iter().enumerate().map(|(k, b)| {
                let y = k as f64;
                Rectangle::new(
                    [(base, y - 0.35), (b.mean, y + 0.35)],
                    Palette99::pick(k % 99).mix(0.75).filled(),
                )
            }))
            .map_err(plot_error(path))?;
        chart
            .draw_series(panel.bars.iter().enumerate().map(|(k, b)| {
                let y = k as f64;
                PathElement::new(
                    vec![(b.mean - b.std, y), (b.mean + b.std, y)],
                    BLACK.stroke_width(2),
                )
            }))
            .map_err(plot_error(path))?;
        for ((_, x), colour) in panel
            .references
            .iter()
            .zip(REFERENCE_COLOURS.iter().cycle())
        {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(*x, -0.5), (*x, panel.bars.len() as f64 - 0.5)],
                    colour.stroke_width(2),
                )))
                .map_err(plot_error(path))?;
        }
    }
    root.present().map_err(plot_error(path))?;
    Ok(())
}

/// One panel of a scatter plot: points `(x, y, class)`, coloured by class.
pub struct ScatterPanel {
    pub title: String,
    pub points: Vec<(f64, f64, u32)>,
}

/// Draws `panels` (unit-circle embeddings: both axes span [−1.15, 1.15], the circle drawn
/// faintly) side by side, up to 4 per row, into a PNG at `path`.
pub fn scatter_panels(path: &Path, panels: &[ScatterPanel]) -> Result<()> {
    register_font();
    let cols = panels.len().clamp(1, 4);
    let rows = panels.len().div_ceil(cols).max(1);
    let root = BitMapBackend::new(path, (420 * cols as u32, 440 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error(path))?;
    for (area, panel) in root.split_evenly((rows, cols)).iter().zip(panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, (FONT_FAMILY, 20))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(-1.15..1.15, -1.15..1.15)
            .map_err(plot_error(path))?;
        chart
            .configure_mesh()
            .disable_mesh()
            .label_style((FONT_FAMILY, 12))
            .draw()
            .map_err(plot_error(path))?;
        let circle = (0..=200).map(|k| {
            let a = std::f64::consts::TAU * k as f64 / 200.0;
            (a.cos(), a.sin())
        });
        chart
            .draw_series(LineSeries::new(circle, BLACK.mix(0.2)))
            .map_err(plot_error(path))?;
        chart
            .draw_series(panel.points.iter().map(|&(x, y, class)| {
                Circle::new((x, y), 3, Palette99::pick(class as usize).mix(0.6).filled())
            }))
            .map_err(plot_error(path))?;
    }
    root.present().map_err(plot_error(path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::significant;

    #[test]
    fn axis_labels_keep_three_significant_digits() {
        let labels: Vec<String> = [0.30000000000000004, 0.012, 0.0999, 250.0, 1.0, 0.0]
            .into_iter()
            .map(significant)
            .collect();
        assert_eq!(labels, ["0.3", "0.012", "0.0999", "250", "1", "0"]);
    }
}
