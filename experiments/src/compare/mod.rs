//! `ssl compare`: a grid of runs — objectives × views × batch sizes × seeds — trained one after
//! another with the same protocol, summarised as mean ± std over seeds.
//!
//! Every cell is an ordinary run directory under `OUT/runs/LABEL/vV-bB-sS`. A cell whose
//! `results.json` exists and whose `config.yaml` equals the cell's resolved configuration (every
//! objective parameter included, so a changed default retrains) is reused;
//! an interrupted cell with a checkpoint of the same configuration is resumed. Cells an objective
//! refuses (e.g. a two-view method at V = 8) and runs that fail are reported in the table, not
//! fatal. Outputs: `OUT/NAME.md`, `OUT/NAME.csv`, `OUT/NAME.png`, NAME being the grid file's stem
//! (`compare` without one) — so grids sharing an output directory share their finished runs.

mod grid;
mod plots;
mod runs;
mod smoke;
mod summary;
#[cfg(test)]
mod tests;

pub use grid::{default_metrics, Cell, Grid, ObjectiveEntry};
pub use runs::{run, run_cell, Outcome};
pub use smoke::{
    SMOKE_BATCH, SMOKE_HALF_CLASSES, SMOKE_HALF_TRAIN_SIZE, SMOKE_SIZE, SMOKE_TRAIN_SIZE,
    SMOKE_WIDTH,
};
pub use summary::mean_std;
