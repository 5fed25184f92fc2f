//! The run's PNG figures (feature `plots`), each drawn from a CSV the run writes whether or not
//! the feature is on: `spectrum.png` from `spectrum.csv`, one panel per view with the
//! trace-normalised eigenvalue trajectories on a log scale, and `embedding.png` from
//! `embedding.csv` for an encoder with a 2-D output.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};
use ssl_report::plot::{self, LineAxes, Panel, ScatterPanel, Series};

use crate::diagnostics::SPECTRUM_CSV;
use crate::evaluate::read_embedding;

/// File names in the run directory.
pub const SPECTRUM_PNG: &str = "spectrum.png";
/// The unit-circle plot of a 2-D encoder's test embeddings, beside `embedding.csv`.
pub const EMBEDDING_PNG: &str = "embedding.png";

/// Draws `spectrum.png` from the `spectrum.csv` in `dir` (nothing if there is no log).
pub fn spectrum(dir: &Path) -> Result<()> {
    let csv = dir.join(SPECTRUM_CSV);
    if !csv.exists() {
        return Ok(());
    }
    // view → rank → (step, normalised eigenvalue)
    let mut lines: BTreeMap<usize, BTreeMap<usize, Vec<(f64, f64)>>> = BTreeMap::new();
    for (k, line) in BufReader::new(File::open(&csv)?)
        .lines()
        .enumerate()
        .skip(1)
    {
        let line = line?;
        let fields: Vec<&str> = line.split(',').collect();
        let parse = |i: usize| -> Result<f64> {
            fields.get(i).and_then(|f| f.parse().ok()).with_context(|| {
                format!("{} line {}: malformed row `{line}`", csv.display(), k + 1)
            })
        };
        let (step, view, rank, normalized) = (parse(0)?, parse(1)?, parse(2)?, parse(4)?);
        lines
            .entry(view as usize)
            .or_default()
            .entry(rank as usize)
            .or_default()
            .push((step, normalized));
    }
    let panels: Vec<Panel> = lines
        .into_iter()
        .map(|(view, ranks)| Panel {
            title: format!(
                "view {view}: λ_k / tr C, k = 1 (red) … {} (violet)",
                ranks.len()
            ),
            series: ranks
                .into_iter()
                .map(|(rank, points)| Series {
                    label: format!("λ{rank}"),
                    points,
                })
                .collect(),
        })
        .collect();
    plot::line_panels(
        &dir.join(SPECTRUM_PNG),
        &panels,
        &LineAxes {
            x_label: "step",
            y_label: "λ_k / tr C",
            log_y: true,
        },
    )
}

/// Draws `embedding.png` from the `embedding.csv` in `dir`, titled `title`.
pub fn embedding(dir: &Path, title: String) -> Result<()> {
    plot::scatter_panels(
        &dir.join(EMBEDDING_PNG),
        &[ScatterPanel {
            title,
            points: read_embedding(&dir.join("embedding.csv"))?,
        }],
    )
}
