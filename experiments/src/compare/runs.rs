//! Running a grid: each cell trained, resumed, or reused from its run directory, then the
//! tables and charts written.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use ssl_core::{atomic, progress};
use ssl_train::checkpoint;
use ssl_train::config::RunConfig;
use ssl_train::results::{Results, RESULTS};
use ssl_train::Trainer;

use super::grid::{Cell, Grid};
use super::plots::embeddings_figure;
use super::summary::Summary;

/// What became of a cell.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Finished (now or earlier): metrics per encoder row, and wall time in seconds.
    Done {
        rows: BTreeMap<String, BTreeMap<String, f64>>,
        seconds: f64,
    },
    /// The objective refuses this V or B, or the run failed; the message says why.
    Failed(String),
}

/// The configuration as a cell and a stored run are compared. The online probe's learning rate
/// is left out: the probe reads detached features with optimiser slots of its own, so it moves no
/// encoder weight and no number in the table (a CLI test trains both ways and compares weights).
pub(super) fn config_text(cfg: &RunConfig) -> Result<String> {
    let mut cfg = cfg.clone();
    cfg.train.probe_lr = 0.0;
    Ok(serde_yaml::to_string(&cfg)?)
}

/// Whether `dir/config.yaml` resolves to exactly `cfg`. Stored objective parameters are
/// resolved against this build's defaults like the cell's, so a run recorded before its
/// parameters were written out in full still matches while those defaults hold.
pub(super) fn same_config(dir: &Path, cfg: &RunConfig) -> Result<bool> {
    let path = dir.join("config.yaml");
    if !path.exists() {
        return Ok(false);
    }
    // An unreadable or invalid record is not this run's: the cell retrains over it.
    let mut stored = match RunConfig::from_file(&path).and_then(RunConfig::from_yaml_value) {
        Ok(stored) => stored,
        Err(_) => return Ok(false),
    };
    // What the run fitted to its data (CARP's prototypes on a small set, say) is not a change
    // of configuration: the cell asks for the paper defaults the record names.
    stored.objective = stored.objective.as_requested();
    Ok(config_text(&stored)? == config_text(cfg)?)
}

/// Reads a finished cell's results, if its directory holds them for exactly this configuration.
fn finished(cell: &Cell) -> Result<Option<Outcome>> {
    let dir = &cell.config.out;
    if !dir.join(RESULTS).exists() || !same_config(dir, &cell.config)? {
        return Ok(None);
    }
    let results = Results::read(dir)?;
    let rows = (results.rows.into_iter())
        .map(|row| match row.encoder.ends_with("(ours)") {
            true => ("ours".to_string(), row.metrics),
            false => (row.encoder, row.metrics),
        })
        .collect();
    Ok(Some(Outcome::Done {
        rows,
        seconds: results.seconds,
    }))
}

pub fn run_cell(cell: &Cell) -> Result<Outcome> {
    if let Some(done) = finished(cell)? {
        return Ok(done);
    }
    let dir = &cell.config.out;
    let resume =
        dir.join("checkpoint").join(checkpoint::STATE).exists() && same_config(dir, &cell.config)?;
    // The cell's directory is the grid's: a run of another configuration in it is replaced.
    let start = match resume {
        true => ssl_train::rundir::Start::Resume,
        false => ssl_train::rundir::Start::Overwrite,
    };
    match Trainer::new(cell.config.clone()).start(start).fit() {
        Ok(_) => Ok(finished(cell)?
            .unwrap_or_else(|| Outcome::Failed("the run ended without results.json".to_string()))),
        Err(e) => Ok(Outcome::Failed(format!("{e:#}"))),
    }
}

/// Runs (or reuses) every cell with a progress bar over the grid, then writes the tables and
/// the chart. Returns the Markdown table. A grid with `halves` is the generalisation
/// protocol's, which [`crate::generalise::run_grid`] runs.
pub fn run(grid: &Grid, command_line: &str) -> Result<String> {
    ensure!(
        grid.halves.is_none(),
        "a grid with `halves` runs the generalisation protocol (generalise::run_grid)"
    );
    let cells = grid.cells()?;
    std::fs::create_dir_all(&grid.out)
        .with_context(|| format!("cannot create {}", grid.out.display()))?;
    let bar = progress::bar(
        cells.len() as u64,
        "{spinner} grid [{bar:30}] {pos}/{len} runs {msg} (elapsed {elapsed})",
    );
    let mut outcomes = Vec::with_capacity(cells.len());
    for cell in &cells {
        bar.set_message(format!(
            "{} V={} B={} seed {}",
            cell.label, cell.views, cell.batch_size, cell.seed
        ));
        let outcome = run_cell(cell)?;
        if let Outcome::Failed(why) = &outcome {
            progress::println(format!(
                "warning: {} V={} B={} seed {}: {why}",
                cell.label, cell.views, cell.batch_size, cell.seed
            ));
        }
        outcomes.push(outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if grid.smoke {
        let failed: Vec<String> = cells
            .iter()
            .zip(&outcomes)
            .filter_map(|(cell, outcome)| match outcome {
                Outcome::Failed(why) => Some(format!(
                    "{} V={} B={}: {why}",
                    cell.label, cell.views, cell.batch_size
                )),
                Outcome::Done { .. } => None,
            })
            .collect();
        if !failed.is_empty() {
            bail!(
                "the smoke run of {} failed in {} of {} cells (fix the recipe or the code it names):\n{}",
                grid.stem(),
                failed.len(),
                cells.len(),
                failed.join("\n")
            );
        }
    }
    let summary = Summary::new(grid, &cells, &outcomes)?;
    let markdown = summary.markdown(command_line);
    let file = |ext: &str| grid.out.join(format!("{}.{ext}", grid.stem()));
    atomic::write(&file("md"), markdown.as_bytes())?;
    atomic::write(&file("csv"), summary.csv().as_bytes())?;
    summary.chart(&file("png"))?;
    embeddings_figure(
        &cells,
        &grid.out.join(format!("{}-embeddings.png", grid.stem())),
    )?;
    Ok(markdown)
}
