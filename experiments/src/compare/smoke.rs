//! The smoke run of a grid (`ssl compare --smoke`): one cheap cell per entry and view count,
//! on stand-in data written in the recipe's format.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ssl_data::{ArchiveInfo, DataSource, MedMnistInfo};

use super::grid::{entry_map, entry_set, Cell, Grid, ObjectiveEntry};

/// Largest batch a smoke run trains with (`ssl compare --smoke`).
pub const SMOKE_BATCH: usize = 4;
/// Instances a smoke run pretrains on (a stratified subset of any data set).
pub const SMOKE_TRAIN_SIZE: usize = 16;
/// Side a smoke run shrinks an image folder's images to (a multiple of a ViT's 16-px patches).
pub const SMOKE_SIZE: usize = 32;
/// Classes a smoke run keeps of each half of a halves grid (the first listed): the protocol's
/// training, pairs and trees run on 4 classes (6 pairs) as on 50. Each half pretrains on
/// [`SMOKE_HALF_TRAIN_SIZE`] images and embeds 2 test images a class, so a ViT-B cell's steps
/// and evaluation, most of its smoke run, are half what the [`SMOKE_TRAIN_SIZE`] would cost.
pub const SMOKE_HALF_CLASSES: usize = 4;
/// Instances each half of a halves grid's smoke run pretrains on: the synthesised archives
/// hold 2 training images a class.
pub const SMOKE_HALF_TRAIN_SIZE: usize = 2 * SMOKE_HALF_CLASSES;
/// Widest projector layer a smoke run keeps: the papers' 8192-wide expanders (about 150 M
/// parameters behind a ResNet-50) are most of a smoke run's time and none of what it checks.
pub const SMOKE_WIDTH: usize = 256;

impl Grid {
    /// Turns the grid into its smoke test (`ssl compare --smoke`): every objective entry and view
    /// count at one batch size (the smallest listed, at most [`SMOKE_BATCH`], at least the
    /// objective's smallest, on as many images where that is more), the first seed
    /// only, one epoch (the last partial batch kept; all warm-up where the recipe warms up), no
    /// accumulation, on the CPU, on data synthesised under `OUT/data` in the exact format of the
    /// recipe's data set — MedMNIST `.npz` of digits, CIFAR/STL-10/Tiny ImageNet archives in
    /// their official layouts, Caltech-256's extracted tree, or an ImageNet-style JPEG folder
    /// with the recipe's class directories — so that every cell's configuration, data path,
    /// encoder and objective is exercised in seconds. Pretraining sees a stratified subset of
    /// [`SMOKE_TRAIN_SIZE`] images (a halves grid's halves [`SMOKE_HALF_TRAIN_SIZE`] each);
    /// where the reader takes any size, images are shrunk to
    /// [`SMOKE_SIZE`] px (MedMNIST 2D: its 64-px files; volumes keep theirs); projector layers
    /// wider than [`SMOKE_WIDTH`] are cut to it; each half of a halves grid keeps its first
    /// [`SMOKE_HALF_CLASSES`] classes; the encoder, the projector's depth and the
    /// objective stay the recipe's. These overrides go after every entry's own `set`. `OUT`
    /// defaults to `runs/smoke/NAME`. Every cell must then finish.
    pub fn smoke(&mut self, out: Option<&Path>) -> Result<()> {
        self.smoke = true;
        // The one epoch is the warm-up where the recipe has one (its first steps then run at a
        // small learning rate, as the real run's do), else none.
        let recipe_cells = self.cells()?;
        let warmup = recipe_cells
            .iter()
            .any(|c| c.config.train.warmup_epochs > 0);
        self.out = match out {
            Some(out) => out.to_path_buf(),
            None => PathBuf::from("runs/smoke").join(self.stem()),
        };
        self.seeds.truncate(1);
        if let Some(halves) = &mut self.halves {
            for half in halves {
                half.truncate(SMOKE_HALF_CLASSES);
            }
        }
        // One batch size per entry and view count: the smallest it lists, capped (so that
        // IConE's B = 1 path runs).
        let cap = |list: &mut Vec<usize>| {
            if let Some(&b) = list.iter().min() {
                *list = vec![b.min(SMOKE_BATCH)];
            }
        };
        match self.batch_sizes.is_empty() {
            true => self.batch_sizes = vec![SMOKE_BATCH],
            false => cap(&mut self.batch_sizes),
        }
        for entry in &mut self.objectives {
            if let Some(serde_yaml::Value::Sequence(list)) = entry.get_mut("batch_sizes") {
                let mut sizes: Vec<usize> = list
                    .iter()
                    .map(|v| v.as_u64().map(|v| v as usize))
                    .collect::<Option<_>>()
                    .context("an objective's `batch_sizes` must be a list of integers")?;
                cap(&mut sizes);
                *list = sizes.into_iter().map(|b| (b as u64).into()).collect();
            }
        }
        // Everything from here on is the smoke run's: it also goes after each entry's own `set`
        // (below), which would otherwise win (an entry's `train.epochs=400`).
        let first = self.set.len();
        self.set.extend(
            [
                "train.epochs=1",
                if warmup {
                    "train.warmup_epochs=1"
                } else {
                    "train.warmup_epochs=0"
                },
                "train.accumulate=1",
                "train.drop_last=false",
                "train.device=cpu",
                "train.checkpoint_every=1",
                "train.stop_after_epochs=0",
                "eval.spectrum_every=0",
            ]
            .map(String::from),
        );
        let cells = match &self.halves {
            None => self.cells()?,
            // A halves grid (`ssl generalise`) trains each half on its own classes.
            Some(halves) => {
                let mut cells = Vec::new();
                for h in 0..2 {
                    cells.extend(self.half(halves, h).cells()?);
                }
                cells
            }
        };
        let root = self.write_stand_in(&cells)?;
        // Every data set pretrains on the subset, the built-in ones too: their 1,437 or so
        // instances would leave a last batch of one, which a batch-normed projector refuses.
        // (The probe learns the classes the subset has; the others score 0, which a smoke run
        // does not look at.)
        let train_size = match self.halves {
            Some(_) => SMOKE_HALF_TRAIN_SIZE,
            None => SMOKE_TRAIN_SIZE,
        };
        self.set.push(format!("data.train_size={train_size}"));
        self.set.push(format!("data.root='{}'", root.display()));
        self.cap_projectors(&cells)?;
        let forced = self.set[first..].to_vec();
        for entry in &mut self.objectives {
            if let Some(serde_yaml::Value::Sequence(list)) = entry.get_mut("set") {
                list.extend(forced.iter().map(|s| s.as_str().into()));
            }
        }
        self.raise_small_batches(&cells, &recipe_cells, train_size)
    }

    /// Adds to each entry's `set` its smoke cells' projector with every layer wider than
    /// [`SMOKE_WIDTH`] cut to it.
    fn cap_projectors(&mut self, cells: &[Cell]) -> Result<()> {
        for value in &mut self.objectives {
            let label = ObjectiveEntry::parse(value)?.label().to_string();
            let Some(cell) = cells.iter().find(|c| c.label == label) else {
                continue;
            };
            let widths = &cell.config.model.projector;
            if widths.iter().any(|&w| w > SMOKE_WIDTH) {
                let capped: Vec<String> = widths
                    .iter()
                    .map(|&w| w.min(SMOKE_WIDTH).to_string())
                    .collect();
                let set = format!("model.projector=[{}]", capped.join(","));
                entry_set(value)?.push(set.into());
            }
        }
        Ok(())
    }

    /// Has an entry that needs a larger batch than the smoke's (W-MSE whitens sub-batches of
    /// `w_size`; a batch-normed projector needs 2 where IConE's grids go down to 1) train one
    /// batch of its smallest, on as many images (at least the smoke's `train_size`): the
    /// built-in sets hold them; a synthesised file holds fewer, and the run says so. The limit
    /// is read from the recipe's largest batch of the entry (`recipe_cells`), as the real run
    /// builds it.
    fn raise_small_batches(
        &mut self,
        cells: &[Cell],
        recipe_cells: &[Cell],
        train_size: usize,
    ) -> Result<()> {
        for value in &mut self.objectives {
            let label = ObjectiveEntry::parse(value)?.label().to_string();
            let smoke = cells.iter().find(|c| c.label == label);
            let recipe = recipe_cells
                .iter()
                .filter(|c| c.label == label)
                .max_by_key(|c| c.batch_size);
            let (Some(smoke), Some(recipe)) = (smoke, recipe) else {
                continue;
            };
            let need = ssl_train::model::smallest_batch(&recipe.config)
                .with_context(|| format!("objective entry `{label}`"))?;
            if need > smoke.batch_size {
                entry_map(value)?.insert("batch_sizes".into(), vec![need as u64].into());
                let set = format!("data.train_size={}", need.max(train_size));
                entry_set(value)?.push(set.into());
            }
        }
        Ok(())
    }

    /// Smoke runs at `size` px instead of the recipe's: multi-crop's local views at half of it,
    /// a folder's kept side (`data.keep_side`) in the same proportion (rounded up).
    fn shrink(&mut self, cells: &[Cell], size: usize) {
        self.set.push(format!("data.size={size}"));
        if cells.iter().any(|c| c.config.train.local_views > 0) {
            self.set.push(format!("train.local_size={}", size / 2));
        }
        if let Some(data) = cells
            .iter()
            .map(|c| &c.config.data)
            .find(|d| d.keep_side > 0)
        {
            let side = (data.keep_side * size).div_ceil(data.size);
            self.set.push(format!("data.keep_side={side}"));
        }
    }

    /// Writes under `OUT/data` the stand-in for the one data set (and size) every cell reads,
    /// and has the cells read smaller images where the reader takes any size ([`SMOKE_SIZE`]
    /// px; MedMNIST 2D: its 64-px files); returns the `data.root` the cells then read.
    fn write_stand_in(&mut self, cells: &[Cell]) -> Result<PathBuf> {
        let mut data_sets: Vec<(&str, usize)> = cells
            .iter()
            .map(|c| (c.config.data.name.as_str(), c.config.data.size))
            .collect();
        data_sets.sort();
        data_sets.dedup();
        if data_sets.len() > 1 {
            bail!(
                "a smoke run needs every cell on one data set and size, got {}",
                data_sets
                    .iter()
                    .map(|(n, s)| format!("{n} at {s}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let (_, size) = data_sets.pop().context("the grid has no cells")?;
        let pairs = self.halves.is_some();
        let data = self.out.join("data");
        std::fs::create_dir_all(&data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        // The data root, and the side the cells read its images at.
        let (root, side) = match cells[0].config.data.name {
            DataSource::Archive(info) => {
                write_archive(&data, info, pairs)?;
                (data, size)
            }
            DataSource::Folder => (write_folder(&data, cells, pairs)?, SMOKE_SIZE),
            DataSource::Caltech256 => (write_caltech256(&data)?, SMOKE_SIZE),
            DataSource::MedMnist(info) => {
                let side = write_medmnist(&data, info, size)?;
                (data, side)
            }
            // A file of your own is the user's; the others are built in: nothing to write.
            DataSource::Npz | DataSource::Digits | DataSource::GaussianMixture => (data, size),
        };
        if side < size {
            self.shrink(cells, side);
        }
        Ok(root)
    }
}

/// Writes a benchmark's official archive under `data`: two training images per class
/// (pretraining takes a small stratified subset of them); one test image per class, two of the
/// first two (labels cycle), which the evaluation's pairs need — two of every class where
/// `pairs` (a halves grid, whose runs each evaluate on their own classes).
fn write_archive(data: &Path, info: &ArchiveInfo, pairs: bool) -> Result<()> {
    let path = data.join(info.file);
    if path.exists() {
        return Ok(());
    }
    let unlabeled = if info.splits[2] > 0 {
        2 * info.classes
    } else {
        0
    };
    let test = match pairs {
        true => 2 * info.classes,
        false => info.classes + 2,
    };
    let counts = [2 * info.classes, test, unlabeled];
    ssl_data::write_synthetic_archive(info.name, &path, counts)
}

/// Writes an image folder under `data/folder` and returns its path: the recipe's class
/// directories (`data.folder_classes`, `imagenet100`: CMC's list), else ImageNet-like synset
/// names, as many as the recipe's `data.classes` reach. Its JPEGs are not square, so that the
/// resize of the shorter side and the centre crop run as they do on ImageNet's files; it holds
/// enough training images for the subset, one of each class to evaluate on and a second of the
/// first (the evaluation's pair; two of every class where `pairs`, for a halves grid).
fn write_folder(data: &Path, cells: &[Cell], pairs: bool) -> Result<PathBuf> {
    let wanted = &cells[0].config.data.folder_classes;
    let names: Vec<String> = match wanted.as_slice() {
        [one] if one == "imagenet100" => ssl_data::IMAGENET100.map(String::from).to_vec(),
        [] => {
            let reach = cells
                .iter()
                .flat_map(|c| c.config.data.classes.iter())
                .map(|&c| c as usize + 1)
                .max()
                .unwrap_or(0);
            (0..reach.max(4)).map(|c| format!("n{c:08}")).collect()
        }
        names => names.to_vec(),
    };
    let classes = names.len();
    let root = data.join("folder");
    if !root.exists() {
        let train = SMOKE_TRAIN_SIZE.div_ceil(classes).max(2);
        let val = 1 + usize::from(pairs);
        ssl_data::write_synthetic_folder(&root, &names, [train, val], 80, 64)?;
        let first = root.join("val").join(&names[0]);
        std::fs::copy(first.join("0.JPEG"), first.join(format!("{val}.JPEG")))
            .with_context(|| format!("cannot write {}", first.display()))?;
    }
    Ok(root)
}

/// Writes Caltech-256's extracted tree under `data/caltech256` and returns its path: the 257
/// official category directories, ten JPEGs each, so that a 0.2 test fraction (the recipes')
/// holds out two of every class, the evaluation's pairs.
fn write_caltech256(data: &Path) -> Result<PathBuf> {
    let root = data.join("caltech256");
    if !root.exists() {
        ssl_data::caltech256::write_synthetic(&root, 10)?;
    }
    Ok(root)
}

/// Writes a MedMNIST `.npz` of digits under `data` and returns its side: 2D sets at their 64-px
/// size where the recipe's is larger and that size exists, else the recipe's `size`. Volumes
/// keep their size: at 28³ a 3D ResNet-18's last map is 1×1×1, and a B = 1 step (each view
/// forwarded alone) leaves its batch norm one value per channel.
fn write_medmnist(data: &Path, info: &MedMnistInfo, size: usize) -> Result<usize> {
    let small = match info.volumetric {
        true => size,
        false => 64,
    };
    let size = match size > small && info.md5_at(small).is_ok() {
        true => small,
        false => size,
    };
    let path = data.join(info.file_name(size));
    if !path.exists() {
        ssl_data::write_digits_as_medmnist(&path, info.flag, size)?;
    }
    Ok(size)
}
