//! The grid's charts: bars (or lines over batch sizes) of the summary, and the 2-D test
//! embeddings.

use std::path::Path;

use anyhow::Result;
use ssl_report::plot::{self, Bar, BarPanel, LineAxes, Panel, ScatterPanel, Series};

use super::grid::Cell;
use super::summary::{heading, mean_std, Summary};

impl Summary {
    /// Bars of the first two metrics; when the grid varies the batch size, lines of them
    /// against log₂ B instead (one line per objective and view count).
    pub(super) fn chart(&self, path: &Path) -> Result<()> {
        let shown = self.metrics.len().min(2);
        let batch_sizes: std::collections::BTreeSet<_> =
            self.rows.iter().filter_map(|r| r.batch_size).collect();
        if batch_sizes.len() > 1 {
            let panels: Vec<Panel> = (0..shown).map(|k| self.batch_panel(k)).collect();
            return plot::line_panels(
                path,
                &panels,
                &LineAxes {
                    x_label: "log₂ batch size",
                    y_label: "mean over seeds",
                    log_y: false,
                },
            );
        }
        let panel = |k: usize| {
            let m = self.metrics[k];
            BarPanel {
                title: heading(&m),
                x_label: heading(&m),
                bars: self
                    .rows
                    .iter()
                    .filter(|r| !r.values[k].is_empty())
                    .map(|r| {
                        let scaled: Vec<f64> = r.values[k].iter().map(|v| v * m.scale).collect();
                        let (mean, std) = mean_std(&scaled);
                        Bar {
                            label: format!(
                                "{} V={} B={}",
                                r.label,
                                r.views.unwrap_or(0),
                                r.batch_size.unwrap_or(0)
                            ),
                            mean,
                            std,
                        }
                    })
                    .collect(),
                references: self
                    .baselines
                    .iter()
                    .filter(|r| !r.values[k].is_empty())
                    .map(|r| (r.label.clone(), mean_std(&r.values[k]).0 * m.scale))
                    .collect(),
            }
        };
        let panels: Vec<BarPanel> = (0..shown).map(panel).collect();
        plot::bar_panels(path, &panels)
    }

    /// Metric `k` against log₂ B: one series per (label, V).
    fn batch_panel(&self, k: usize) -> Panel {
        let m = self.metrics[k];
        let mut series: Vec<Series> = Vec::new();
        for row in self.rows.iter().filter(|r| !r.values[k].is_empty()) {
            let name = format!("{} V={}", row.label, row.views.unwrap_or(0));
            let b = row.batch_size.unwrap_or(1) as f64;
            let scaled: Vec<f64> = row.values[k].iter().map(|v| v * m.scale).collect();
            let point = (b.log2(), mean_std(&scaled).0);
            match series.iter_mut().find(|s| s.label == name) {
                Some(s) => s.points.push(point),
                None => series.push(Series {
                    label: name,
                    points: vec![point],
                }),
            }
        }
        Panel {
            title: heading(&m),
            series,
        }
    }
}

/// The unit-circle test embeddings (`embedding.csv`, written by runs whose encoder outputs 2
/// dimensions) of the first seed of each label, one panel per label. Returns whether any run
/// had one.
pub(super) fn embeddings_figure(cells: &[Cell], path: &Path) -> Result<bool> {
    let mut panels: Vec<ScatterPanel> = Vec::new();
    for cell in cells {
        if panels
            .iter()
            .any(|p| p.title.starts_with(&format!("{} ", cell.label)))
        {
            continue;
        }
        let file = cell.config.out.join("embedding.csv");
        if !file.exists() {
            continue;
        }
        let points = ssl_train::evaluate::read_embedding(&file)?;
        panels.push(ScatterPanel {
            title: format!("{} (seed {})", cell.label, cell.seed),
            points,
        });
    }
    if panels.is_empty() {
        return Ok(false);
    }
    plot::scatter_panels(path, &panels)?;
    Ok(true)
}
