//! The `ssl` command line: `run`, `compare`, `list`, `describe`, `eval`, `export`, `push`,
//! `pull`, `data download`.
//!
//! [`main`] is the whole binary, so a crate that links extra objectives gets the full CLI from a
//! three-line `main.rs`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use ssl_experiments::compare::{self, Grid};
use ssl_experiments::generalise;
use ssl_experiments::offline::MetricSet;
use ssl_train::config::RunConfig;
use ssl_train::request::{Assignment, Flags, RunRequest};
use ssl_train::rundir::Start;
use ssl_train::{evaluate, Trainer};

/// Self-supervised pretraining of image encoders, compared fairly: joint-embedding objectives
/// (VICReg, SimCLR, Barlow Twins, FroSSL, IConE, DINO, … see `ssl list`) on CNN, ResNet and ViT
/// encoders, over the embedded digits, MedMNIST 2D/3D and image folders; every run ends in a
/// table of probe accuracy and collapse metrics beside a random-init baseline.
///
/// With no command, `ssl` runs the main job: VICReg on the embedded digits (under a minute).
#[derive(Parser, Debug)]
#[command(name = "ssl", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Pretrain an encoder, then compare it with raw inputs and a random-init encoder
    /// (with no arguments: VICReg on the embedded digits, the README's main job).
    Run(Box<RunArgs>),
    /// Train a grid of objectives × views × batch sizes × seeds and tabulate mean ± std
    /// (reuses finished runs; writes NAME.md, NAME.csv and NAME.png, NAME = the grid file's stem).
    Compare(Box<CompareArgs>),
    /// SAG-VICReg's generalisation protocol: per objective and seed, encoders trained on two
    /// disjoint class halves embed the first half's test images; their Ward trees are compared
    /// by LCA and cophenetic similarity (reuses finished runs; writes generalise.md and .csv).
    Generalise {
        /// Recipe (see `configs/generalise-digits.yaml`).
        recipe: PathBuf,
        /// CPU threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// List the available objectives.
    List,
    /// Show an objective's configuration keys, defaults and limits.
    Describe {
        /// Objective name or alias.
        name: String,
    },
    /// Evaluate frozen checkpoints on their runs' held-out split: linear probe, k-NN sweep,
    /// RankMe, effective rank, LiDAR, alignment, uniformity, silhouette, CKA between checkpoints.
    Eval(EvalArgs),
    /// Write the encoder alone (PyTorch state-dict keys, no projector, objective or optimiser
    /// state) as safetensors.
    Export {
        /// Run directory.
        run: PathBuf,
        /// Output file (default: RUN/export/model.safetensors).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Publish a run to the Hugging Face Hub: the exported encoder, its config, evaluation and
    /// a model card (token from HF_TOKEN or `hf auth login`).
    Push(PushArgs),
    /// Download a pushed model into the Hugging Face cache (then `ssl eval hf://user/name`).
    Pull {
        /// Model repository, `user/name` or `hf://user/name[@revision]`.
        repo: String,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Data sets: fetch the official files, or write the digits in a MedMNIST layout.
    #[command(subcommand)]
    Data(DataCommand),
}

#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Download a MedMNIST `.npz` or a benchmark set's official archive (CIFAR-10/100, STL-10,
    /// Tiny ImageNet, Caltech-256: then extracted to DIR/256_ObjectCategories) into the data
    /// directory, MD5-verified; a broken download resumes when run again.
    Download(DownloadArgs),
    /// Write the embedded digits in a MedMNIST file's exact layout and split sizes (upsampled,
    /// tinted for RGB, stacked for 3D), to try a pipeline without the official files.
    Sample(SampleArgs),
    /// Read every file of a folder or manifest of scans (DICOM, NIfTI, 16-bit or multi-channel
    /// images) as `ssl run --data folder --root ROOT` would, and print what a run would see:
    /// formats, classes per split, shapes, spacing, value range, the mapping chosen, and every
    /// file it would refuse with the reason. Nothing is trained or cached.
    Inspect(InspectArgs),
}

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// A folder (ROOT/<class>/…, or ROOT/train and ROOT/val) or a manifest (.csv or .tsv of
    /// path,label[,split] rows).
    pub root: PathBuf,
    /// The side the samples would be made (default 64, or 64³ for volumes).
    #[arg(long)]
    pub size: Option<usize>,
    /// A data setting as `ssl run` takes it, e.g. `--set data.intensity={window: [-1000, 400]}`
    /// or `--set data.volumes=false`.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct SampleArgs {
    /// MedMNIST flag whose layout to copy, e.g. bloodmnist.
    pub flag: String,
    /// Image size: 28, 64, 128 or 224 (3D data sets: 28 or 64).
    #[arg(long, default_value_t = 28)]
    pub size: usize,
    /// Directory to write into; train on it with `--root DIR`. Kept apart from ~/.medmnist so
    /// that a stand-in is never taken for the official file.
    #[arg(long, default_value = "medmnist-digits")]
    pub dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct DownloadArgs {
    /// Data set: a MedMNIST flag (e.g. bloodmnist), or cifar10, cifar100 (also for
    /// cifar100-coarse), stl10, tiny-imagenet, caltech256.
    pub name: String,
    /// MedMNIST image size: 28 (default), 64, 128 or 224 (3D data sets: 28 or 64); the benchmark
    /// sets have one size (Caltech-256's images are resized by `ssl run --size`).
    #[arg(long)]
    pub size: Option<usize>,
    /// Directory to download into (default ~/.medmnist for MedMNIST, ~/.cache/candle-ssl/data for
    /// the benchmark sets: where `ssl run` looks unless data.root is set).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Fetch BASE/FILE instead of the official address (for mirrors and tests, like
    /// HF_ENDPOINT for the Hub).
    #[arg(long, value_name = "BASE")]
    pub url: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Run directory, a `model.safetensors` inside one, a pulled or staged repository directory
    /// (config.yaml + model.safetensors), or `hf://user/name[@revision]`.
    pub path: PathBuf,
    /// More checkpoints to put side by side (same forms as PATH).
    #[arg(long, num_args = 1..)]
    pub compare: Vec<PathBuf>,
    /// Metrics, comma-separated: probe, knn, rankme, effective-rank, lidar, alignment,
    /// uniformity, silhouette, kmeans, hierarchy (hierarchical Rand index), and between
    /// checkpoints cka, tree (LCA and cophenetic similarity) (default: all; hierarchy when a
    /// class hierarchy is at hand).
    #[arg(long, value_delimiter = ',')]
    pub metrics: Vec<String>,
    /// Class hierarchy for `--metrics hierarchy` (YAML; digits runs default to
    /// configs/digits-hierarchy.yaml).
    #[arg(long, value_name = "FILE")]
    pub hierarchy: Option<PathBuf>,
    /// Fixed-C linear probe (`docs/spec/metrics.md` §1 uses C = 1) instead of choosing C on a
    /// validation split of the training features.
    #[arg(long)]
    pub probe_c: Option<f64>,
    /// `--probe lbfgs|sgd` and the SGD probe's settings.
    #[command(flatten)]
    pub probe: ssl_experiments::sgd_probe::ProbeArgs,
    /// LiDAR: training images used as surrogate classes.
    #[arg(long, default_value_t = 1000)]
    pub lidar_samples: usize,
    /// LiDAR: augmented views per image.
    #[arg(long, default_value_t = 50)]
    pub lidar_views: usize,
    /// Where eval.json, knn.csv and pca.png go (default: RUN/eval for a run directory, else
    /// ./ssl-eval).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The network of each run checkpoint to evaluate, instead of the one its config names
    /// (eval.encoder): `student`, or the EMA `teacher` of an objective that keeps one (which
    /// DINO's and I-JEPA's papers evaluate).
    #[arg(long, value_parser = ["student", "teacher"])]
    pub encoder: Option<String>,
}

/// Where the Hub is and which revision to use.
#[derive(clap::Args, Debug, Clone)]
pub struct HubArgs {
    /// Hub endpoint (default: HF_ENDPOINT, else <https://huggingface.co>).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Branch or commit.
    #[arg(long, default_value = "main")]
    pub revision: String,
}

#[derive(clap::Args, Debug)]
pub struct PushArgs {
    /// Run directory.
    pub run: PathBuf,
    /// Model repository to create or update, `user/name`.
    #[arg(long)]
    pub repo: String,
    /// Create the repository as private.
    #[arg(long)]
    pub private: bool,
    /// Add a commit to a repository that already holds a model.
    #[arg(long)]
    pub update: bool,
    /// Write the repository's files to RUN/hub/ without uploading them.
    #[arg(long)]
    pub dry_run: bool,
    /// Licence of the weights, as the Hub's id (e.g. cc-by-4.0, mit, other). Default: the
    /// data set's (digits and MedMNIST: cc-by-4.0, DermaMNIST: cc-by-nc-4.0, gmm: apache-2.0);
    /// required for image folders.
    #[arg(long, value_name = "ID")]
    pub license: Option<String>,
    #[command(flatten)]
    pub hub: HubArgs,
}

impl PushArgs {
    fn stage_options(&self) -> ssl_hub::publish::StageOptions {
        ssl_hub::publish::StageOptions {
            license: self.license.clone(),
            suite: None,
        }
    }
}

impl HubArgs {
    fn options(&self) -> ssl_net::hub::HubOptions {
        ssl_net::hub::HubOptions {
            endpoint: self.endpoint.clone(),
            revision: self.revision.clone(),
            ..Default::default()
        }
    }
}

#[derive(clap::Args, Debug, Default)]
pub struct RunArgs {
    /// Objective name or alias, see `ssl list` [default: vicreg]
    #[arg(long)]
    pub objective: Option<String>,
    /// YAML recipe (see `configs/`); flags and `--set` override its keys
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Override any config key, e.g. `--set train.lr=0.01 --set objective.params.mu=10`; a
    /// later mapping merges into earlier ones (`~` resets a key), and a flag below that names
    /// the same key must agree with it
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Data set: digits (embedded), gmm, a MedMNIST flag (bloodmnist, …; the files from
    /// --root or ~/.medmnist), a MedMNIST file (path/to/bloodmnist_64.npz: set and size from
    /// its name), a .npz of your own in MedMNIST's layout (path/to/mine.npz, or npz with
    /// --root FILE), a benchmark set (cifar10, cifar100, cifar100-coarse, stl10, tiny-imagenet,
    /// caltech256; fetched by `ssl data download`), or folder (an image folder at --root)
    /// [default: digits]
    #[arg(long)]
    pub data: Option<String>,
    /// Where the data live (data.root): MedMNIST files, or the image folder
    #[arg(long, value_name = "PATH")]
    pub root: Option<PathBuf>,
    /// Image side: the digits' upsampled size, the MedMNIST file's (28, 64, 128, 224), or the
    /// side folder images are resized and centre-cropped to [default: 16 for digits]
    #[arg(long, allow_negative_numbers = true, value_parser = whole_number::<usize>("data.size"))]
    pub size: Option<usize>,
    /// Training epochs [default: 50]
    #[arg(long, allow_negative_numbers = true, value_parser = whole_number::<usize>("train.epochs"))]
    pub epochs: Option<usize>,
    /// Instances per batch (per view) [default: 128]
    #[arg(long, allow_negative_numbers = true, value_parser = whole_number::<usize>("train.batch_size"))]
    pub batch_size: Option<usize>,
    /// Views per instance (global crops) [default: 2]
    #[arg(long, allow_negative_numbers = true, value_parser = whole_number::<usize>("train.views"))]
    pub views: Option<usize>,
    /// Encoder (model.encoder): digits_cnn, mlp, resnet18, resnet34, resnet50, resnet18_3d,
    /// vit_t16, vit_s16 or vit_b16 [default: digits_cnn; resnet18_3d for 3D MedMNIST]
    #[arg(long)]
    pub encoder: Option<String>,
    /// Initial encoder weights (model.init): a safetensors file with PyTorch state-dict keys,
    /// or `torchvision:resnet50`, `timm:vit_small_patch16_224`, … for a converted file in
    /// $SSL_WEIGHTS (default ~/.cache/candle-ssl/weights), e.g. torchvision/resnet50.safetensors
    /// [default: random initialisation]
    #[arg(long, value_name = "FILE|FRAMEWORK:NAME")]
    pub init: Option<String>,
    /// Multi-crop: extra low-resolution local views per instance, seen by the student only
    /// [default: 0]
    #[arg(long, allow_negative_numbers = true, value_parser = whole_number::<usize>("train.local_views"))]
    pub local_views: Option<usize>,
    /// Seed of the initialisation, the data order and the augmentations [default: 0]
    #[arg(long, allow_negative_numbers = true, value_parser = whole_number::<u64>("train.seed"))]
    pub seed: Option<u64>,
    /// Run directory [default: a new runs/OBJECTIVE-TIME, linked from runs/latest]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace the run already in --out (its files are removed first)
    #[arg(long, requires = "out", conflicts_with = "resume")]
    pub overwrite: bool,
    /// Device: cpu, `cuda[:N]` or metal [default: cpu]
    #[arg(long)]
    pub device: Option<String>,
    /// CPU threads [default: all cores]
    #[arg(long, allow_negative_numbers = true, value_parser = whole_number::<usize>("train.threads"))]
    pub threads: Option<usize>,
    /// Continue the run in --out (default: runs/latest) from its last checkpoint, with the
    /// configuration it recorded
    #[arg(long)]
    pub resume: bool,
    /// With --resume: accept these changed keys (or sections, e.g. `train.epochs,
    /// objective.params`) from the checkpoint's step on; config.yaml records them under history
    #[arg(long, value_delimiter = ',', value_name = "KEY", requires = "resume")]
    pub allow_changed: Vec<String>,
    /// Data parallelism: mpi (one process per rank, started by mpirun or srun; needs a build
    /// with `--features mpi`), nccl (one process per GPU, each on `cuda:<local rank>`; needs
    /// `--features nccl`, and mpi too for more than one process) or none [default: mpi under a
    /// launcher of several processes (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS),
    /// else none]
    #[arg(long, value_name = "mpi|nccl|none")]
    pub distributed: Option<String>,
}

#[derive(clap::Args, Debug, Default)]
pub struct CompareArgs {
    /// Grid file (see `configs/compare-*.yaml`); flags below override its entries.
    pub grid: Option<PathBuf>,
    /// Objectives, comma-separated (e.g. `vicreg,simclr,frossl`); with a grid file, its entries
    /// for these objectives (their params and overrides kept), the others with their defaults.
    #[arg(long, value_delimiter = ',')]
    pub objectives: Vec<String>,
    /// Views per instance, comma-separated (e.g. `2,4,8`).
    #[arg(long, value_delimiter = ',')]
    pub views: Vec<usize>,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub batch_sizes: Vec<usize>,
    /// Seeds, comma-separated (default 0,1,2).
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Recipe every run starts from (default: the main job's settings).
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// Override a config key in every run, e.g. `--set train.epochs=20`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Output directory (default runs/compare).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// CPU threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Check the recipe in seconds instead of running it: every objective and view count for one
    /// epoch, first seed, smallest batch (≤ 4), the first 4 classes of each half (`ssl
    /// generalise`), on data synthesised in the data set's exact format under OUT/data (OUT
    /// default runs/smoke/NAME); any failed cell is an error.
    #[arg(long)]
    pub smoke: bool,
}

impl CompareArgs {
    /// The grid file (if any) with the flags applied over it.
    pub fn grid(&self) -> Result<Grid> {
        let mut grid = match &self.grid {
            Some(path) => Grid::from_file(path)?,
            None => {
                if self.objectives.is_empty() {
                    bail!(
                        "give a grid file (e.g. configs/compare-all.yaml) or --objectives a,b,..."
                    );
                }
                serde_yaml::from_str("objectives: []")?
            }
        };
        if !self.objectives.is_empty() {
            grid.select_objectives(&self.objectives)?;
        }
        if !self.views.is_empty() {
            grid.views = self.views.clone();
        }
        if !self.batch_sizes.is_empty() {
            grid.batch_sizes = self.batch_sizes.clone();
        }
        if !self.seeds.is_empty() {
            grid.seeds = self.seeds.clone();
        }
        if self.base.is_some() {
            grid.base = self.base.clone();
        }
        grid.set.extend(self.set.iter().cloned());
        if let Some(out) = &self.out {
            grid.out = out.clone();
        }
        if self.smoke {
            grid.smoke(self.out.as_deref())?;
        }
        Ok(grid)
    }
}

/// Entry point of every `ssl` binary: parses arguments, runs, prints errors like a Rust CLI.
pub fn main() -> ExitCode {
    // A closed stdout (`ssl list | head -1`) ends the process quietly, as it does `ls` or `cat`,
    // instead of `println!` panicking on the broken pipe. (Sockets are unaffected: the standard
    // library writes to them with MSG_NOSIGNAL / SO_NOSIGPIPE.)
    #[cfg(unix)]
    // SAFETY: called before any thread is started; SIG_DFL is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    ssl_core::allocator::keep_freed_memory();
    let cli = Cli::parse();
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command.
pub fn execute(cli: Cli) -> Result<()> {
    match cli.command.unwrap_or(Command::Run(Box::default())) {
        Command::Run(args) => train(&args),
        Command::Compare(args) => compare_grid(&args),
        Command::Generalise { recipe, threads } => generalise_recipe(&recipe, threads),
        Command::List => list_objectives(),
        Command::Describe { name } => describe_objective(&name),
        Command::Eval(args) => evaluate_offline(&args),
        Command::Export { run, out } => export_run(&run, out),
        Command::Push(args) if args.dry_run => stage_push(&args),
        Command::Push(args) => push(&args),
        Command::Pull { repo, hub } => pull(&repo, &hub),
        Command::Data(DataCommand::Download(args)) => download(&args),
        Command::Data(DataCommand::Sample(args)) => sample(&args),
        Command::Data(DataCommand::Inspect(args)) => inspect_data(&args),
    }
}

/// `ssl run`: trains (as one rank of a data-parallel job under a launcher) and prints the table.
fn train(args: &RunArgs) -> Result<()> {
    let requested = args.distributed.as_deref().map(str::parse).transpose()?;
    let comm = ssl_dist::connect(requested)?;
    let outcome = run_config(args).and_then(|(cfg, start)| {
        ssl_train::config::use_threads(rank_threads(cfg.train.threads, comm.as_ref())?);
        let run = Trainer::new(cfg.clone())
            .start(start)
            .ranks(Arc::clone(&comm));
        Ok((run.fit()?, cfg))
    });
    let (outcome, cfg) = match outcome {
        // A rank that stops must not leave the others waiting in a collective.
        Err(e) if comm.world_size() > 1 => {
            eprintln!("error (rank {}): {e:#}", comm.rank());
            comm.abort(1)
        }
        outcome => outcome?,
    };
    if comm.rank() != 0 {
        return Ok(());
    }
    if outcome.evaluation.is_empty() {
        println!("stopped early; run directory {}", outcome.dir.display());
    } else {
        println!("\n{}", evaluate::table(&outcome.evaluation, &cfg));
        println!(
            "run directory {} ({:.1} s: {})",
            outcome.dir.display(),
            outcome.seconds,
            outcome.phases.summary()
        );
    }
    Ok(())
}

/// `ssl compare`: runs a grid (a halves grid by the generalisation protocol).
fn compare_grid(args: &CompareArgs) -> Result<()> {
    ssl_train::config::use_threads(args.threads.unwrap_or(0));
    let grid = args.grid()?;
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let table = match &grid.halves {
        Some(halves) => generalise::run_grid(&grid, halves, &command_line)?,
        None => compare::run(&grid, &command_line)?,
    };
    println!("{table}");
    println!("tables and chart in {}", grid.out.display());
    Ok(())
}

/// `ssl generalise`: the generalisation protocol of a recipe.
fn generalise_recipe(recipe: &Path, threads: Option<usize>) -> Result<()> {
    ssl_train::config::use_threads(threads.unwrap_or(0));
    let recipe = generalise::Recipe::from_file(recipe)?;
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let table = generalise::run(&recipe, &command_line)?;
    println!("{table}");
    println!("tables in {}", recipe.out.display());
    Ok(())
}

/// `ssl list`: every linked objective.
fn list_objectives() -> Result<()> {
    let registry = ssl_core::registry();
    let width = registry.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in registry {
        println!(
            "{:<width$}  {}\n{:<width$}  {}",
            r.name, r.summary, "", r.paper
        );
    }
    Ok(())
}

/// `ssl describe`: an objective's keys, defaults and limits.
fn describe_objective(name: &str) -> Result<()> {
    println!("{}", ssl_train::describe::objective(name)?);
    Ok(())
}

/// `ssl eval`: the offline suite on checkpoints or exported weights.
fn evaluate_offline(args: &EvalArgs) -> Result<()> {
    // The probe's flags are checked before anything loads.
    let (probe, sgd_probe) = args.probe.settings(args.probe_c)?;
    let mut sources = Vec::new();
    for path in std::iter::once(&args.path).chain(&args.compare) {
        let mut source = eval_source(path)?;
        if let Some(network) = &args.encoder {
            choose_network(&mut source, path, network)?;
        }
        sources.push(source);
    }
    let default = ssl_experiments::offline::SuiteConfig::default();
    let hierarchy = args
        .hierarchy
        .as_deref()
        .map(ssl_eval::ClassHierarchy::load)
        .transpose()?;
    let hierarchy_at_hand = hierarchy.is_some()
        || sources
            .iter()
            .all(|s| s.cfg.data.name == ssl_data::DataSource::Digits);
    let suite = ssl_experiments::offline::SuiteConfig {
        metrics: match args.metrics.is_empty() {
            true if hierarchy_at_hand => default
                .metrics
                .into_iter()
                .chain([MetricSet::Hierarchy])
                .collect(),
            true => default.metrics,
            false => (args.metrics.iter())
                .map(|name| MetricSet::parse(name))
                .collect::<Result<_>>()?,
        },
        hierarchy,
        probe_c: args.probe_c,
        probe,
        sgd_probe,
        lidar_samples: args.lidar_samples,
        lidar_views: args.lidar_views,
    };
    ssl_train::config::use_threads(sources[0].cfg.train.threads);
    // RUN/checkpoint/model.safetensors → RUN/eval; anything else → ./ssl-eval.
    let out = args.out.clone().unwrap_or_else(|| {
        let checkpoint_dir = sources[0].weights.parent();
        match checkpoint_dir
            .filter(|d| d.ends_with("checkpoint"))
            .and_then(Path::parent)
        {
            Some(run) => run.join("eval"),
            None => PathBuf::from("ssl-eval"),
        }
    });
    let report = ssl_experiments::offline::evaluate(&sources, &suite, &out)?;
    println!("{}", ssl_experiments::offline::table(&report));
    if suite.probe == ssl_experiments::sgd_probe::ProbeKind::Sgd && suite.wants(MetricSet::Probe) {
        println!(
            "\n{}",
            ssl_experiments::sgd_probe::describe(&suite.sgd_probe)
        );
    }
    println!("\neval.json, knn.csv and pca.png in {}", out.display());
    Ok(())
}

/// `ssl eval --encoder NETWORK`: evaluates that network of a run checkpoint. The run's online
/// probe learnt the student's features, so a teacher is evaluated without it.
fn choose_network(
    source: &mut ssl_experiments::offline::Source,
    path: &Path,
    network: &str,
) -> Result<()> {
    if !source
        .weights
        .parent()
        .is_some_and(|d| d.ends_with("checkpoint"))
    {
        bail!(
            "--encoder {network}: {} is an exported encoder, which holds one network (the one its \
             config.yaml's eval.encoder names); give the run directory, whose checkpoint holds \
             the student and any EMA teacher",
            path.display()
        );
    }
    use ssl_train::config::EvaluatedEncoder;
    source.cfg.eval.encoder = match network {
        "teacher" => EvaluatedEncoder::Teacher,
        _ => EvaluatedEncoder::Student,
    };
    if source.cfg.eval.encoder == EvaluatedEncoder::Teacher {
        source.cfg.train.probe_lr = 0.0;
        source.online_probe = None;
    }
    source.label = format!("{} {network}", source.label);
    Ok(())
}

/// `ssl export`: the encoder's weights alone.
fn export_run(run: &Path, out: Option<PathBuf>) -> Result<()> {
    let out = out.unwrap_or_else(|| run.join("export").join(ssl_train::export::EXPORTED));
    let exported = ssl_train::export::export_encoder(run, &out)?;
    println!(
        "wrote {} ({} tensors of the {} encoder)",
        exported.path.display(),
        exported.keys.len(),
        exported.metadata["architecture"]
    );
    Ok(())
}

/// `ssl push --dry-run`: stages the files without uploading.
fn stage_push(args: &PushArgs) -> Result<()> {
    let dir = ssl_hub::publish::stage(&args.run, &args.repo, &args.stage_options())?;
    println!("staged {} for {} (not uploaded)", dir.display(), args.repo);
    Ok(())
}

/// `ssl push`: uploads a run to the Hub.
fn push(args: &PushArgs) -> Result<()> {
    let opts = ssl_net::hub::HubOptions {
        private: args.private,
        update: args.update,
        ..args.hub.options()
    };
    let commit = ssl_hub::publish::push(&args.run, &args.repo, &args.stage_options(), &opts)?;
    println!("pushed {} to {} ({commit})", args.run.display(), args.repo);
    Ok(())
}

/// `ssl pull`: downloads a repository and prints where it is.
fn pull(repo: &str, hub: &HubArgs) -> Result<()> {
    let dir = pull_repo(repo, hub)?;
    println!("{}", dir.display());
    Ok(())
}

/// `ssl data download`: fetches a data set and checks it.
fn download(args: &DownloadArgs) -> Result<()> {
    let got = ssl_data::download::download_data_set(
        &args.name,
        args.size,
        args.dir.as_deref(),
        args.url.as_deref(),
        true,
    )?;
    println!("{}", got.summary());
    Ok(())
}

/// `ssl data sample`: writes the digits in a MedMNIST file's layout.
fn sample(args: &SampleArgs) -> Result<()> {
    let info = ssl_data::medmnist_info(&args.flag)?;
    info.md5_at(args.size)?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let path = args.dir.join(info.file_name(args.size));
    ssl_data::write_digits_as_medmnist(&path, info.flag, args.size)?;
    println!(
        "wrote {} (digits in {}'s layout); train on it with --data {} --size {} --root {}",
        path.display(),
        info.flag,
        info.flag,
        args.size,
        args.dir.display()
    );
    Ok(())
}

/// `ssl data inspect`: the collection at `args.root` read as a run would, without training.
fn inspect_data(args: &InspectArgs) -> Result<()> {
    let cfg = RunRequest {
        set: args.set.iter().cloned().map(Assignment::Text).collect(),
        flags: Flags {
            data: Some("folder".into()),
            root: Some(args.root.clone()),
            size: args.size,
            ..Flags::default()
        },
        ..RunRequest::default()
    }
    .resolve(None)?;
    let Some(options) = cfg.data.scan_options() else {
        // A missing or empty folder says so; a folder of photos is not what this command reads.
        ssl_data::scans::scan(&args.root, false)?;
        bail!(
            "{} starts with an 8-bit photo, so a run reads it as an ImageNet-style folder of RGB \
             images, not as scans; add --set data.intensity=range to read every file at full \
             precision",
            args.root.display()
        );
    };
    let volumes = cfg.data.volumes.unwrap_or(false);
    let collection = ssl_data::scans::scan(&args.root, volumes)?;
    let report = {
        let _reading = ssl_core::progress::spinner(format!(
            "reading the {} files of {}",
            collection.entries.len(),
            args.root.display()
        ));
        ssl_data::scans::inspect(&collection, &options)
    };
    println!("{}\n{report}", args.root.display());
    println!(
        "\na run would train {} on `{}` views; its config.yaml records data.intensity, \
         data.volumes and data.size",
        cfg.model.encoder,
        serde_yaml::to_value(cfg.data.recipe())?
            .as_str()
            .unwrap_or_default()
    );
    Ok(())
}

/// `user/name` or `hf://user/name[@revision]` (the suffix overrides `--revision`) pulled into
/// the Hugging Face cache.
fn pull_repo(repo: &str, hub: &HubArgs) -> Result<PathBuf> {
    let mut opts = hub.options();
    let repo = match ssl_net::hub::parse_hf_path(repo) {
        Some((repo, revision)) => {
            opts.revision = revision.unwrap_or(opts.revision);
            repo
        }
        None => repo.to_string(),
    };
    ssl_hub::publish::pull(&repo, &opts)
}

/// The checkpoint `ssl eval` reads from `path`: a run directory (its checkpoint), a checkpoint
/// file inside one, a directory holding `config.yaml` and an exported `model.safetensors` (a
/// pulled or staged repository), or `hf://user/name[@revision]`.
fn eval_source(path: &Path) -> Result<ssl_experiments::offline::Source> {
    let text = path.to_string_lossy();
    if text.starts_with("hf://") {
        let hub = HubArgs {
            endpoint: None,
            revision: "main".into(),
        };
        let mut source = eval_source(&pull_repo(&text, &hub)?)?;
        source.label = format!("{} ({text})", source.cfg.objective.name);
        return Ok(source);
    }
    let dir = run_dir(path)?;
    let cfg = RunConfig::load_run(&dir)?;
    let weights = match (path.is_file(), dir.join(ssl_train::export::EXPORTED)) {
        (true, _) => path.to_path_buf(),
        (false, _) if path.ends_with("checkpoint") => path.join(ssl_train::checkpoint::MODEL),
        (false, exported) if exported.exists() => exported,
        (false, _) => dir.join("checkpoint").join(ssl_train::checkpoint::MODEL),
    };
    let name = dir
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    Ok(ssl_experiments::offline::Source {
        label: format!("{} ({name})", cfg.objective.name),
        online_probe: ssl_experiments::offline::online_probe_accuracy(&dir),
        cfg,
        weights,
    })
}

fn run_dir(path: &Path) -> Result<PathBuf> {
    if !path.exists() {
        bail!(
            "{} does not exist; give a run directory (e.g. runs/latest) or its checkpoint file",
            path.display()
        );
    }
    // RUN/checkpoint → RUN
    if path.is_dir() && !path.join("config.yaml").exists() {
        if let Some(run) = path.parent().filter(|p| p.join("config.yaml").exists()) {
            return Ok(run.to_path_buf());
        }
    }
    if path.is_file() {
        // REPO/model.safetensors → REPO; RUN/checkpoint/model.safetensors → RUN
        let parent = path.parent().unwrap_or(Path::new("."));
        if parent.join("config.yaml").exists() {
            return Ok(parent.to_path_buf());
        }
        return Ok(parent.parent().unwrap_or(Path::new(".")).to_path_buf());
    }
    Ok(path.to_path_buf())
}

/// The CPU threads of one rank: `threads` if given (not 0), else with several ranks this
/// rank's share of its node's cores (stated in the log), so that ranks do not take each
/// other's cores; 0 (all cores) for one process.
fn rank_threads(threads: usize, comm: &dyn ssl_dist::Comm) -> Result<usize> {
    if threads != 0 || comm.world_size() == 1 {
        return Ok(threads);
    }
    let local = ssl_dist::local_ranks(|v| std::env::var(v).ok())?;
    let share = ssl_dist::CoreShare::of_this_process(local);
    if comm.rank() == 0 {
        eprintln!("{share} (--threads to change)");
    }
    Ok(share.threads)
}

/// The configuration `ssl run` trains with, and how it treats its run directory
/// ([`RunRequest::config_and_start`]).
pub fn run_config(args: &RunArgs) -> Result<(RunConfig, Start)> {
    args.request().config_and_start()
}

impl RunArgs {
    /// The run these arguments ask for.
    fn request(&self) -> RunRequest {
        RunRequest {
            config: self.config.clone(),
            set: self.set.iter().cloned().map(Assignment::Text).collect(),
            flags: Flags {
                objective: self.objective.clone(),
                data: self.data.clone(),
                root: self.root.clone(),
                size: self.size,
                epochs: self.epochs,
                batch_size: self.batch_size,
                views: self.views,
                encoder: self.encoder.clone(),
                init: self.init.clone(),
                local_views: self.local_views,
                seed: self.seed,
                out: self.out.clone(),
                device: self.device.clone(),
                threads: self.threads,
            },
            resume: self.resume,
            overwrite: self.overwrite,
            allow_changed: self.allow_changed.clone(),
        }
    }
}

/// The parser of a flag that takes a whole number: a value that is not one (`-1`, `2.5`) is
/// an error naming the configuration key the flag sets.
fn whole_number<T: std::str::FromStr>(
    key: &'static str,
) -> impl Fn(&str) -> std::result::Result<T, String> + Clone + Send + Sync + 'static {
    move |text| {
        text.parse()
            .map_err(|_| format!("{key} takes a whole number ≥ 0, got {text}"))
    }
}

/// `base` (else defaults ← recipe) ← `--set` ← flags, then validation and objective lookup
/// ([`RunRequest::resolve`]).
pub fn resolve(args: &RunArgs, base: Option<serde_yaml::Value>) -> Result<RunConfig> {
    args.request().resolve(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_args(data: &Path, more: impl FnOnce(&mut RunArgs)) -> RunArgs {
        let mut args = RunArgs {
            data: Some(data.display().to_string()),
            ..Default::default()
        };
        more(&mut args);
        args
    }

    #[test]
    fn a_medmnist_file_names_its_set_and_size() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("bloodmnist_64.npz");
        std::fs::write(&file, b"")?;
        let cfg = resolve(&data_args(&file, |_| {}), None)?;
        assert_eq!((cfg.data.name.as_str(), cfg.data.size), ("bloodmnist", 64));
        assert_eq!(cfg.data.root.as_deref(), Some(file.as_path()));
        let plain = dir.path().join("organmnist3d.npz");
        std::fs::write(&plain, b"")?;
        let cfg = resolve(&data_args(&plain, |_| {}), None)?;
        assert_eq!(
            (cfg.data.name.as_str(), cfg.data.size),
            ("organmnist3d", 28)
        );

        let error = |args: RunArgs| format!("{:#}", resolve(&args, None).unwrap_err());
        let e = error(data_args(&file, |a| a.size = Some(28)));
        assert!(
            e.contains("--size 28 disagrees") && e.contains("64-pixel"),
            "{e}"
        );
        let e = error(data_args(&file, |a| a.root = Some(dir.path().into())));
        assert!(e.contains("drop --root"), "{e}");
        let e = error(data_args(&dir.path().join("pathmnist_64.npz"), |_| {}));
        assert!(
            e.contains("no such file") && e.contains("ssl data download"),
            "{e}"
        );
        // Any other name is a file of your own, sized by its images.
        let own = dir.path().join("my_subset.npz");
        std::fs::write(&own, b"")?;
        let e = error(data_args(&own, |_| {}));
        assert!(
            e.contains("read as a file of your own") && e.contains("not a valid .npz"),
            "{e}"
        );
        let layout = ssl_data::NpzLayout {
            name: "mine".into(),
            size: 12,
            channels: 3,
            volumetric: false,
            splits: [2, 0, 2],
            classes: 2,
            multi_label: false,
        };
        let pixels = |n: usize| ssl_data::npy::NpyData::Bytes(vec![0u8; n * 12 * 12 * 3].into());
        let labels = |n: usize| ssl_data::npy::NpyData::Bytes(vec![1u8; n].into());
        ssl_data::write_medmnist_npz(&own, &layout, [2, 0, 2].map(|n| (pixels(n), labels(n))))?;
        let cfg = resolve(&data_args(&own, |_| {}), None)?;
        assert_eq!((cfg.data.name.as_str(), cfg.data.size), ("npz", 12));
        assert_eq!(cfg.data.root.as_deref(), Some(own.as_path()));
        let big = dir.path().join("organmnist3d_224.npz");
        std::fs::write(&big, b"")?;
        let e = error(data_args(&big, |_| {}));
        assert!(
            e.contains("has no 224-pixel files") && e.contains("--data npz --root FILE"),
            "{e}"
        );
        Ok(())
    }

    /// Paths and names reach the configuration as given: no quoting, no YAML reading.
    #[test]
    fn flag_paths_with_quotes_are_taken_as_given() -> Result<()> {
        let out = PathBuf::from("/tmp/it's a run: \"quoted\" #1");
        let args = RunArgs {
            out: Some(out.clone()),
            root: Some("/data/o'brien".into()),
            init: Some("weights/it's.safetensors".into()),
            ..Default::default()
        };
        let cfg = resolve(&args, None)?;
        assert_eq!(cfg.out, out);
        assert_eq!(cfg.data.root.as_deref(), Some(Path::new("/data/o'brien")));
        assert_eq!(cfg.model.init.as_deref(), Some("weights/it's.safetensors"));
        Ok(())
    }

    #[test]
    fn eval_finds_the_run_of_a_checkpoint() -> Result<()> {
        let run = tempfile::tempdir()?;
        std::fs::create_dir(run.path().join("checkpoint"))?;
        std::fs::write(run.path().join("config.yaml"), "")?;
        let checkpoint = run.path().join("checkpoint");
        assert_eq!(run_dir(&checkpoint)?, run.path());
        assert_eq!(run_dir(&checkpoint.join("model.safetensors")).ok(), None);
        std::fs::write(checkpoint.join("model.safetensors"), b"")?;
        assert_eq!(run_dir(&checkpoint.join("model.safetensors"))?, run.path());
        assert_eq!(run_dir(run.path())?, run.path());
        Ok(())
    }
}
