//! `ssl generalise RECIPE`: the generalisation protocol of SAG-VICReg (Simai, Talmon & Shaham;
//! spec objectives §1.5, data §5.4, metrics §10). For every objective and seed, encoder A trains
//! on one class half and encoder B on the other (each an `ssl compare` cell, reused when
//! finished); both embed the held-out images of half A in eval mode, and the two embeddings'
//! Ward trees are compared: LCA similarity (Pearson, Spearman, Kendall τ-b of the LCA path
//! lengths) and cophenetic similarity (D1→P2: A's cophenetic distances against B's cosine
//! distances; D2→P1 the other way). Higher means B, which never saw these classes, organises
//! them as A does. The table (mean ± std over seeds) goes to `OUT/generalise.md` and `.csv`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::compare::{self, Cell, Grid, Outcome};
use ssl_core::{atomic, progress};
use ssl_train::evaluate::{clean_inputs, to_features};
use ssl_train::setup::CleanSamples;
use ssl_train::{checkpoint, export, model, setup};

/// A generalisation recipe (`configs/generalise-*.yaml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Recipe every run starts from (default: the main job's settings).
    #[serde(default)]
    pub base: Option<PathBuf>,
    /// `KEY=VALUE` overrides applied to every run.
    #[serde(default)]
    pub set: Vec<String>,
    /// Objectives, as in a compare grid (names or `{name, label, params, set}` entries).
    pub objectives: Vec<serde_yaml::Value>,
    /// Seeds (default `[0, 1, 2]`).
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    /// The two disjoint class sets: encoder A trains on the first, B on the second; both embed
    /// the test images of the first.
    pub halves: [Vec<u32>; 2],
    /// Output directory (default `runs/generalise`).
    #[serde(default = "default_out")]
    pub out: PathBuf,
}

fn default_seeds() -> Vec<u64> {
    vec![0, 1, 2]
}

fn default_out() -> PathBuf {
    PathBuf::from("runs/generalise")
}

/// The similarity columns, in table order.
const COLUMNS: [&str; 5] = [
    "LCA Pearson",
    "LCA Spearman",
    "LCA Kendall τ-b",
    "cophenetic D1→P2",
    "cophenetic D2→P1",
];

impl Recipe {
    /// Reads a recipe file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = ssl_train::config::read_config_text(path)?;
        let recipe: Self = serde_yaml::from_str(&text)
            .with_context(|| format!("invalid generalisation recipe {}", path.display()))?;
        recipe.validate()?;
        Ok(recipe)
    }

    fn validate(&self) -> Result<()> {
        check_halves(&self.halves)
    }

    /// The recipe as a compare grid with `halves` (what `ssl compare` runs for such a grid).
    pub fn to_grid(&self) -> Grid {
        Grid {
            base: self.base.clone(),
            set: self.set.clone(),
            objectives: self.objectives.clone(),
            views: vec![2],
            batch_sizes: Vec::new(),
            seeds: self.seeds.clone(),
            out: self.out.clone(),
            metrics: compare::default_metrics(),
            reference: BTreeMap::new(),
            name: "generalise".to_string(),
            halves: Some(self.halves.clone()),
            smoke: false,
        }
    }

    /// The compare grid training every objective and seed on half `h` (0 = A, 1 = B).
    #[cfg(test)]
    fn grid(&self, h: usize) -> Grid {
        self.to_grid().half(&self.halves, h)
    }
}

/// Both halves have two classes or more, and none in common.
pub fn check_halves(halves: &[Vec<u32>; 2]) -> Result<()> {
    let [a, b] = halves;
    if let Some(half) = [a, b].into_iter().find(|h| h.len() < 2) {
        bail!(
            "both `halves` need at least two classes (each run's linear probe tells classes \
             apart), got {half:?}; e.g. halves: [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]"
        );
    }
    if let Some(c) = a.iter().find(|c| b.contains(c)) {
        bail!("the halves must be disjoint, but class {c} is in both");
    }
    Ok(())
}

/// The reference keys of a halves grid, in `COLUMNS` order.
pub const REFERENCE_KEYS: [&str; 5] = [
    "lca_pearson",
    "lca_spearman",
    "lca_kendall",
    "cophenetic_d1_p2",
    "cophenetic_d2_p1",
];

/// Trains (or reuses) both halves' runs, compares every A/B pair and writes the table.
/// Returns the Markdown table.
pub fn run(recipe: &Recipe, command_line: &str) -> Result<String> {
    run_grid(&recipe.to_grid(), &recipe.halves, command_line)
}

/// [`run`] for a compare grid with `halves`: its cells trained on each half (under
/// `OUT/half-a`, `OUT/half-b`), the table in `OUT/NAME.md` and `.csv`, published values from the
/// grid's `reference` (keys [`REFERENCE_KEYS`]) under their rows. A failed run is an error.
pub fn run_grid(grid: &Grid, halves: &[Vec<u32>; 2], command_line: &str) -> Result<String> {
    check_halves(halves)?;
    if let Some((label, key)) = grid.reference.iter().find_map(|(label, values)| {
        values
            .keys()
            .find(|k| !REFERENCE_KEYS.contains(&k.as_str()))
            .map(|k| (label, k))
    }) {
        bail!(
            "reference `{label}` names `{key}`, which a halves grid does not measure (known: {})",
            REFERENCE_KEYS.join(", ")
        );
    }
    let (grid_a, grid_b) = (grid.half(halves, 0), grid.half(halves, 1));
    let (cells_a, cells_b) = (grid_a.cells()?, grid_b.cells()?);
    std::fs::create_dir_all(&grid.out)
        .with_context(|| format!("cannot create {}", grid.out.display()))?;
    let bar = progress::bar(
        2 * cells_a.len() as u64,
        "{spinner} halves [{bar:30}] {pos}/{len} runs {msg} (elapsed {elapsed})",
    );
    let mut rows: BTreeMap<String, Vec<[f64; 5]>> = BTreeMap::new();
    let mut order = Vec::new();
    for (a, b) in cells_a.iter().zip(&cells_b) {
        for (half, cell) in [("A", a), ("B", b)] {
            bar.set_message(format!("{} seed {} half {half}", cell.label, cell.seed));
            if let Outcome::Failed(why) = compare::run_cell(cell)? {
                bail!(
                    "{} V={} B={} seed {} on half {half} failed: {why}",
                    cell.label,
                    cell.views,
                    cell.batch_size,
                    cell.seed
                );
            }
            bar.inc(1);
        }
        if !order.contains(&a.label) {
            order.push(a.label.clone());
        }
        rows.entry(a.label.clone())
            .or_default()
            .push(similarities(a, b)?);
    }
    bar.finish_and_clear();
    let markdown = markdown(grid, halves, &order, &rows, command_line);
    let file = |ext: &str| grid.out.join(format!("{}.{ext}", grid.stem()));
    atomic::write(&file("md"), markdown.as_bytes())?;
    atomic::write(&file("csv"), csv(&order, &rows).as_bytes())?;
    Ok(markdown)
}

/// Eval-mode backbone features of `images` under the encoder trained in `cell`.
fn embed(cell: &Cell, images: &CleanSamples) -> Result<ssl_eval::Features> {
    let device = images.device();
    let model = model::build_model(&cell.config, &setup::data(&cell.config)?, device)?;
    let weights =
        checkpoint::load_tensors(&cell.config.out.join("checkpoint").join(checkpoint::MODEL))?;
    export::load_encoder(&model.store, &weights)?;
    to_features(&model.embed(images)?)
}

/// The five similarities of one A/B pair, in [`COLUMNS`] order, on half A's test images.
fn similarities(a: &Cell, b: &Cell) -> Result<[f64; 5]> {
    let device = setup::device(&a.config.train.device)?;
    let data = setup::data(&a.config)?;
    let (_, test) = clean_inputs(&data, &device);
    let t = ssl_eval::tree_similarity(&embed(a, &test.x)?, &embed(b, &test.x)?)?;
    Ok([
        t.lca_pearson,
        t.lca_spearman,
        t.lca_kendall,
        t.cophenetic_d1_p2,
        t.cophenetic_d2_p1,
    ])
}

fn markdown(
    grid: &Grid,
    halves: &[Vec<u32>; 2],
    order: &[String],
    rows: &BTreeMap<String, Vec<[f64; 5]>>,
    command_line: &str,
) -> String {
    let mut s = format!(
        "Encoder A trained on classes {:?}, encoder B on {:?}; both embed the held-out images of \
         A's classes. Mean ± std over seeds {:?}.\n\n| objective | {} |\n|---|{}\n",
        halves[0],
        halves[1],
        grid.seeds,
        COLUMNS.join(" | "),
        "---|".repeat(COLUMNS.len())
    );
    for label in order {
        let seeds = &rows[label];
        s.push_str(&format!("| {label} |"));
        for c in 0..COLUMNS.len() {
            let values: Vec<f64> = seeds.iter().map(|r| r[c]).collect();
            let (m, sd) = compare::mean_std(&values);
            s.push_str(&format!(" {m:.3} ± {sd:.3} |"));
        }
        s.push('\n');
        if let Some(published) = grid.reference.get(label) {
            s.push_str(&format!("| ↳ {label} (published) |"));
            for key in REFERENCE_KEYS {
                let v = published
                    .get(key)
                    .map_or("—".to_string(), |v| format!("{v:.3}"));
                s.push_str(&format!(" {v} |"));
            }
            s.push('\n');
        }
    }
    s.push_str(&format!("\nMade by `{command_line}`.\n"));
    s
}

fn csv(order: &[String], rows: &BTreeMap<String, Vec<[f64; 5]>>) -> String {
    let mut s = String::from("objective,seed_index");
    for c in COLUMNS {
        s.push_str(&format!(",{c}"));
    }
    s.push('\n');
    for label in order {
        for (i, r) in rows[label].iter().enumerate() {
            s.push_str(&format!("{label},{i}"));
            for v in r {
                s.push_str(&format!(",{v}"));
            }
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(text: &str) -> Result<Recipe> {
        let r: Recipe = serde_yaml::from_str(text)?;
        r.validate()?;
        Ok(r)
    }

    #[test]
    fn halves_become_two_grids_restricted_to_their_classes() -> Result<()> {
        let r = recipe(
            "objectives: [vicreg, sag-vicreg]\nseeds: [0, 1]\nhalves: [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]\nout: /tmp/g",
        )?;
        let (a, b) = (r.grid(0).cells()?, r.grid(1).cells()?);
        assert_eq!(a.len(), 4);
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.label.as_str(), x.seed), (y.label.as_str(), y.seed));
            assert_eq!(x.config.data.classes, vec![0, 1, 2, 3, 4]);
            assert_eq!(y.config.data.classes, vec![5, 6, 7, 8, 9]);
            assert_ne!(x.config.out, y.config.out);
        }
        Ok(())
    }

    #[test]
    fn overlapping_or_empty_halves_and_unknown_keys_are_errors() {
        let e = recipe("objectives: [vicreg]\nhalves: [[0, 1], [1, 2]]").unwrap_err();
        assert!(e.to_string().contains("class 1 is in both"), "{e}");
        let e = recipe("objectives: [vicreg]\nhalves: [[], [1, 2]]").unwrap_err();
        assert!(e.to_string().contains("at least two classes"), "{e}");
        let e = recipe("objectives: [vicreg]\nhalves: [[0, 1], [2]]").unwrap_err();
        assert!(e.to_string().contains("got [2]"), "{e}");
        let e = recipe("objectives: [vicreg]\nhalves: [[0], [1]]\nseed: [1]").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
