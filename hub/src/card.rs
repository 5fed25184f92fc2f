//! The model card `ssl push` publishes: a `README.md` with the Hub's YAML front matter (library,
//! tags, licence, data set, metrics), the run's evaluation table with its seeds and test-set size,
//! the offline evaluation (`eval.json`, as `ssl eval` writes it), how to load the weights in Rust
//! and in Python (complete programs, checked: the Rust ones compile as this module's doctests,
//! the Python ones run in `tools/card_snippet.py`), the weights' layout and the recipe
//! with its local paths removed.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::Tensor;

use ssl_data::DataSource;
use ssl_experiments::offline::Report;
use ssl_train::config::RunConfig;
use ssl_train::results::{table_metrics, Results};

/// What the card reports of the run's `split.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Split {
    /// The seed that drew the split and subsets.
    pub seed: u64,
    /// Positions of the training and test images.
    pub train: Vec<usize>,
    pub test: Vec<usize>,
}

/// The Hub's id of MedMNIST v2 (all 18 subsets, CC BY 4.0; its card points to medmnist.com).
pub const MEDMNIST_HUB_DATASET: &str = "albertvillanova/medmnist-v2";

/// The licence ids the Hub accepts in a model card's `license:` field
/// (huggingface.co/docs/hub/repositories-licenses).
pub const HUB_LICENSES: &[&str] = &[
    "apache-2.0",
    "mit",
    "openrail",
    "bigscience-openrail-m",
    "creativeml-openrail-m",
    "bigscience-bloom-rail-1.0",
    "bigcode-openrail-m",
    "afl-3.0",
    "artistic-2.0",
    "bsl-1.0",
    "bsd",
    "bsd-2-clause",
    "bsd-3-clause",
    "bsd-3-clause-clear",
    "c-uda",
    "cc",
    "cc0-1.0",
    "cc-by-2.0",
    "cc-by-2.5",
    "cc-by-3.0",
    "cc-by-4.0",
    "cc-by-sa-3.0",
    "cc-by-sa-4.0",
    "cc-by-nc-2.0",
    "cc-by-nc-3.0",
    "cc-by-nc-4.0",
    "cc-by-nd-4.0",
    "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0",
    "cc-by-nc-sa-2.0",
    "cc-by-nc-sa-3.0",
    "cc-by-nc-sa-4.0",
    "cdla-sharing-1.0",
    "cdla-permissive-1.0",
    "cdla-permissive-2.0",
    "wtfpl",
    "ecl-2.0",
    "epl-1.0",
    "epl-2.0",
    "etalab-2.0",
    "eupl-1.1",
    "eupl-1.2",
    "agpl-3.0",
    "gfdl",
    "gpl",
    "gpl-2.0",
    "gpl-3.0",
    "lgpl",
    "lgpl-2.1",
    "lgpl-3.0",
    "isc",
    "lppl-1.3c",
    "ms-pl",
    "mpl-2.0",
    "odc-by",
    "odbl",
    "osl-3.0",
    "postgresql",
    "ofl-1.1",
    "ncsa",
    "unlicense",
    "zlib",
    "pddl",
    "unknown",
    "other",
];

/// The terms of a data set the weights were trained on: its licence as a Hub id, and where it
/// comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataLicense {
    pub id: &'static str,
    pub terms: &'static str,
}

/// The licence of a built-in data set; `None` for data the run cannot vouch for (an image
/// folder).
pub fn data_license(data: DataSource) -> Option<DataLicense> {
    match data {
        DataSource::Digits => Some(DataLicense {
            id: "cc-by-4.0",
            terms: "the UCI ML Repository's Optical Recognition of Handwritten Digits (Alpaydin & \
                    Kaynak 1998, doi:10.24432/C50P49), as scikit-learn ships it: CC BY 4.0",
        }),
        DataSource::GaussianMixture => Some(DataLicense {
            id: "apache-2.0",
            terms: "a synthetic Gaussian mixture drawn by candle-ssl (no third-party data); the \
                    weights default to Apache-2.0, one of candle-ssl's licences",
        }),
        DataSource::MedMnist(info) if info.flag == "dermamnist" => Some(DataLicense {
            id: "cc-by-nc-4.0",
            terms: "MedMNIST v2 (Yang et al. 2023, medmnist.com): DermaMNIST is CC BY-NC 4.0 \
                    (from HAM10000), the other subsets CC BY 4.0",
        }),
        DataSource::MedMnist(_) => Some(DataLicense {
            id: "cc-by-4.0",
            terms: "MedMNIST v2 (Yang et al. 2023, medmnist.com): CC BY 4.0 (DermaMNIST: CC BY-NC \
                    4.0)",
        }),
        _ => None,
    }
}

/// The licence the card declares: `given` (`--license`, a Hub id, any case), else the data
/// set's.
pub fn license(data: DataSource, given: Option<&str>) -> Result<String> {
    if let Some(given) = given {
        let id = given.trim().to_ascii_lowercase();
        if !HUB_LICENSES.contains(&id.as_str()) {
            bail!(
                "--license `{given}` is not a licence id the Hub knows; use one of {} (or \
                 `other`, naming the terms in the card)",
                HUB_LICENSES.join(", ")
            );
        }
        return Ok(id);
    }
    match data_license(data) {
        Some(l) => Ok(l.id.to_string()),
        None => bail!(
            "cannot tell the licence of `{data}` data from the run: pass --license with the Hub \
             licence id that the images' terms allow for the weights (e.g. cc-by-4.0, mit, or \
             other)"
        ),
    }
}

/// The Hub data set the card's `datasets:` names: MedMNIST's for its subsets, else none.
pub fn hub_dataset(data: DataSource) -> Option<&'static str> {
    matches!(data, DataSource::MedMnist(_)).then_some(MEDMNIST_HUB_DATASET)
}

/// The recipe as published: `out`, `data.root` and a file `model.init` (local paths) replaced
/// by neutral forms, also in the resume `history`; with one line per change for the card.
pub fn published_config(cfg: &RunConfig) -> (RunConfig, Vec<String>) {
    let mut published = cfg.clone();
    let mut notes = Vec::new();
    if !published.out.as_os_str().is_empty() {
        published.out = PathBuf::new();
        notes.push(
            "`out` (the run directory) is left empty: `ssl run` picks a new `runs/…` directory"
                .to_string(),
        );
    }
    if published.data.root.take().is_some() {
        notes.push(match cfg.data.name {
            DataSource::Folder => "`data.root` (the local image folder) is removed: give yours \
                                   with `--root DIR`"
                .to_string(),
            name => {
                let home = match name {
                    DataSource::MedMnist(_) => "~/.medmnist",
                    _ => "~/.cache/candle-ssl/data",
                };
                format!(
                    "`data.root` (a local directory) is removed: the files are looked up in \
                     {home} (`ssl data download {name}`), or give `--root DIR`"
                )
            }
        });
    }
    if let Some(init) = &cfg.model.init {
        let neutral = neutral_init(init);
        if &neutral != init {
            notes.push(format!(
                "`model.init` (a local file) is reduced to its name, `{neutral}`: put that file \
                 beside the recipe or give `--init PATH`"
            ));
            published.model.init = Some(neutral);
        }
    }
    for change in &mut published.history {
        if ["out", "data.root", "model.init"].contains(&change.key.as_str()) {
            for value in [&mut change.from, &mut change.to] {
                if let serde_yaml::Value::String(text) = value {
                    *text = match change.key.as_str() {
                        "model.init" => neutral_init(text),
                        _ => "(local path)".to_string(),
                    };
                }
            }
        }
    }
    (published, notes)
}

/// `FRAMEWORK:NAME` unchanged; a file path reduced to its file name.
fn neutral_init(init: &str) -> String {
    let path = Path::new(init);
    let framework_name = init.split_once(':').is_some_and(|(framework, name)| {
        !path.is_absolute() && !framework.contains(['/', '\\']) && !name.contains(['/', '\\'])
    });
    match framework_name {
        true => init.to_string(),
        false => path
            .file_name()
            .map_or_else(|| init.to_string(), |n| n.to_string_lossy().into_owned()),
    }
}

/// Everything the card is made of.
pub struct Card<'a> {
    /// `user/name`.
    pub repo: &'a str,
    /// The recipe as published ([`published_config`]).
    pub cfg: &'a RunConfig,
    /// What [`published_config`] changed.
    pub recipe_notes: &'a [String],
    /// The licence id ([`license`]).
    pub license: &'a str,
    pub results: &'a Results,
    pub split: &'a Split,
    /// The offline evaluation, as uploaded in `eval.json`.
    pub eval: &'a Report,
    /// The exported tensors: name → tensor.
    pub weights: &'a HashMap<String, Tensor>,
}

/// `README.md` for the repository.
pub fn model_card(card: &Card) -> Result<String> {
    let cfg = card.cfg;
    let repo = card.repo;
    let objective = &cfg.objective.name;
    let paper = ssl_core::registry::find(objective)
        .map(|r| r.paper.to_string())
        .unwrap_or_default();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "---\nlibrary_name: candle-ssl\nlicense: {}",
        card.license
    );
    let _ = writeln!(text, "pipeline_tag: image-feature-extraction\ntags:");
    for tag in [
        "self-supervised-learning",
        "candle",
        "safetensors",
        objective,
        cfg.data.name.as_str(),
    ] {
        let _ = writeln!(text, "- {tag}");
    }
    if let Some(dataset) = hub_dataset(cfg.data.name) {
        let _ = writeln!(text, "datasets:\n- {dataset}");
    }
    let _ = writeln!(text, "metrics:\n- balanced_accuracy\n- accuracy\n---\n");
    let _ = writeln!(text, "# {repo}\n");
    let split_seed = card.split.seed;
    let _ = writeln!(
        text,
        "A `{}` encoder pretrained with **{objective}** ({paper}) on `{}` by candle-ssl \
         (`ssl run`): {} epochs, batch {} × {} views, model seed {}, split seed {split_seed}. \
         The weights are the encoder alone (no projector, objective state or optimiser), with \
         PyTorch state-dict keys.\n",
        cfg.model.encoder,
        cfg.data.name,
        cfg.train.epochs,
        cfg.train.batch_size,
        cfg.train.views,
        cfg.train.seed,
    );
    let _ = writeln!(text, "## Evaluation\n");
    let (train_n, test_n) = (card.split.train.len(), card.split.test.len());
    let _ = writeln!(
        text,
        "Frozen features of the {test_n} held-out test images (batch norm in eval mode; probe \
         and k-NN fitted on the {train_n} training images), next to the raw inputs and the \
         randomly initialised encoder (`results.json` of the run):\n"
    );
    let _ = write!(text, "| encoder | model seed | split seed | test images |");
    for metric in table_metrics() {
        let _ = write!(text, " {} |", metric.title);
    }
    let _ = writeln!(
        text,
        "\n|---|---|---|---|{}",
        "---|".repeat(table_metrics().len())
    );
    for row in &card.results.rows {
        // The raw inputs involve no model, so no model seed.
        let model_seed = match row.encoder.as_str() {
            "raw inputs" => "–".to_string(),
            _ => cfg.train.seed.to_string(),
        };
        let _ = write!(
            text,
            "| {} | {model_seed} | {split_seed} | {test_n} |",
            row.encoder
        );
        for metric in table_metrics() {
            let cell = (row.metrics.get(metric.key)).map_or("–".into(), |v| metric.show(*v));
            let _ = write!(text, " {cell} |");
        }
        let _ = writeln!(text);
    }
    let _ = writeln!(
        text,
        "\nThe full offline suite (`ssl eval`; `eval.json`, `knn.csv` and `pca.png` in this \
         repository, same test images):\n\n{}\n",
        ssl_experiments::offline::table(card.eval)
    );
    let arch = Arch::of(cfg, card.weights)?;
    let _ = writeln!(
        text,
        "## Load the weights\n\nInputs are `{:?}` tensors normalised as the recipe's \
         `data.normalize` says (`{}`); the features are `[N, {}]`.\n\nRust (Candle), with \
         `anyhow`, `candle-core` and `candle-nn` {} and the `ssl-models` crate of candle-ssl \
         (`models/`):\n\n```rust\n{}```\n",
        arch.input,
        serde_yaml::to_string(&cfg.data.normalization())
            .unwrap_or_default()
            .trim(),
        arch.dim,
        candle_core_version(),
        arch.rust(repo)?
    );
    let _ = writeln!(
        text,
        "Python (PyTorch; `pip install torch {}safetensors huggingface_hub`):\n\n```python\n{}```\n",
        arch.python_packages(),
        arch.python(repo)
    );
    let _ = writeln!(text, "## Layout\n\n| tensor | shape |\n|---|---|");
    let mut names: Vec<&String> = card.weights.keys().collect();
    names.sort();
    for name in names {
        let _ = writeln!(text, "| `{name}` | {:?} |", card.weights[name].dims());
    }
    let recipe = serde_yaml::to_string(cfg).context("cannot write the recipe as YAML")?;
    let _ = writeln!(
        text,
        "\n## Recipe\n\n`config.yaml` in this repository; `ssl run --config config.yaml` \
         retrains it."
    );
    if !card.recipe_notes.is_empty() {
        let _ = writeln!(text, "Local paths of the run were taken out:\n");
        for note in card.recipe_notes {
            let _ = writeln!(text, "- {note}");
        }
    }
    let _ = writeln!(text, "\n```yaml\n{recipe}```\n\n## Licence\n");
    let _ = writeln!(
        text,
        "The weights: `{}`. Training data: {}.",
        card.license,
        data_license(cfg.data.name).map_or("see its source", |l| l.terms)
    );
    Ok(text)
}

/// The Candle version the snippets name.
fn candle_core_version() -> &'static str {
    "0.11.1"
}

/// What the snippets need of the encoder: its family, input shape and feature width.
struct Arch {
    encoder: String,
    /// `[1, C, …]` (the MLP: `[1, D]`, the flattened sample).
    input: Vec<usize>,
    dim: usize,
    /// Residual stages' depth of a 2D ResNet (18, 34, 50).
    depth: usize,
    cifar_stem: bool,
    mlp: Vec<usize>,
}

impl Arch {
    fn of(cfg: &RunConfig, weights: &HashMap<String, Tensor>) -> Result<Self> {
        let dims = |key: &str| -> Result<Vec<usize>> {
            weights
                .get(key)
                .map(|t| t.dims().to_vec())
                .with_context(|| {
                    format!(
                        "the exported weights lack `{key}`: they are not a `{}` encoder",
                        cfg.model.encoder
                    )
                })
        };
        let side = cfg.data.size;
        let encoder = cfg.model.encoder.clone();
        let (first, dim) = match encoder.as_str() {
            "digits_cnn" => ("conv1.weight", dims("fc.weight")?[0]),
            "mlp" => {
                let last = format!("layers.{}.weight", cfg.model.mlp.len().saturating_sub(1));
                ("layers.0.weight", dims(&last)?[0])
            }
            "resnet18_3d" => ("conv1.weight", dims("fc.weight")?[0]),
            "resnet18" | "resnet34" | "resnet50" => ("conv1.weight", {
                let stage = if encoder == "resnet50" { "bn3" } else { "bn2" };
                dims(&format!("layer4.1.{stage}.weight"))?[0]
            }),
            "vit_t16" | "vit_s16" | "vit_b16" => {
                ("patch_embed.proj.weight", dims("norm.weight")?[0])
            }
            other => bail!("no loading snippet for encoder `{other}`"),
        };
        let first = dims(first)?;
        let channels = *first.get(1).with_context(|| {
            format!("the first layer's weights have shape {first:?}: not an encoder's")
        })?;
        let input = match encoder.as_str() {
            "mlp" => vec![1, channels],
            "resnet18_3d" => vec![1, channels, side, side, side],
            _ => vec![1, channels, side, side],
        };
        Ok(Self {
            depth: encoder
                .strip_prefix("resnet")
                .and_then(|d| d.parse().ok())
                .unwrap_or(18),
            cifar_stem: cfg.model.stem == ssl_models::Stem::Cifar,
            mlp: cfg.model.mlp.clone(),
            encoder,
            input,
            dim,
        })
    }

    /// timm's name of a ViT.
    fn timm_name(&self) -> &'static str {
        match self.encoder.as_str() {
            "vit_t16" => "vit_tiny_patch16_224",
            "vit_b16" => "vit_base_patch16_224",
            _ => "vit_small_patch16_224",
        }
    }

    fn python_packages(&self) -> &'static str {
        match self.encoder.as_str() {
            "resnet18" | "resnet34" | "resnet50" => "torchvision ",
            "vit_t16" | "vit_s16" | "vit_b16" => "timm ",
            _ => "",
        }
    }

    /// The Rust program: one of the checked templates ([`RUST_DIGITS_CNN`], …) after constants
    /// that say this encoder's shapes.
    fn rust(&self, repo: &str) -> Result<String> {
        let list = |v: &[usize]| {
            v.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut consts = format!(
            "// model.safetensors of {repo}: `ssl pull {repo}`, or `hf download {repo} \
             model.safetensors`\nconst WEIGHTS: &str = \"model.safetensors\";\nconst INPUT: \
             &[usize] = &[{}];\nconst DIM: usize = {};\n",
            list(&self.input),
            self.dim
        );
        let body = match self.encoder.as_str() {
            "digits_cnn" => RUST_DIGITS_CNN,
            "mlp" => {
                let _ = writeln!(consts, "const WIDTHS: &[usize] = &[{}];", list(&self.mlp));
                RUST_MLP
            }
            "resnet18" | "resnet34" | "resnet50" => {
                let stem = if self.cifar_stem { "Cifar" } else { "Imagenet" };
                let _ = writeln!(
                    consts,
                    "const DEPTH: usize = {};\nconst STEM: Stem = Stem::{stem};",
                    self.depth
                );
                RUST_RESNET
            }
            "resnet18_3d" => RUST_RESNET_3D,
            "vit_t16" | "vit_s16" | "vit_b16" => {
                let size = match self.encoder.as_str() {
                    "vit_t16" => "tiny",
                    "vit_s16" => "small",
                    _ => "base",
                };
                let _ = writeln!(consts, "const SIZE: fn() -> VitConfig = VitConfig::{size};");
                RUST_VIT
            }
            other => bail!("no Rust snippet for encoder `{other}`"),
        };
        let (uses, main) = body
            .split_once("\nfn main")
            .context("a Rust snippet template lacks `fn main`")?;
        let main = main
            .split_once('\n')
            .map(|(_, rest)| rest)
            .context("a Rust snippet template is cut short")?;
        Ok(format!(
            "{uses}\n{consts}\nfn main() -> anyhow::Result<()> {{\n{main}"
        ))
    }

    /// The Python program: torchvision's or timm's module with our stem, or a few lines defining
    /// our own module; loads strictly and checks the features' shape.
    fn python(&self, repo: &str) -> String {
        let shape = self
            .input
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let channels = self.input[1];
        let (imports, build) = match self.encoder.as_str() {
            "resnet18" | "resnet34" | "resnet50" => {
                let mut build = format!(
                    "encoder = torchvision.models.resnet{}(weights=None)\n\
                     encoder.fc = torch.nn.Identity()  # the export has no classifier\n",
                    self.depth
                );
                if self.cifar_stem {
                    let _ = write!(
                        build,
                        "# CIFAR stem: 3x3 stride-1 conv1, no max-pool\n\
                         encoder.conv1 = torch.nn.Conv2d({channels}, 64, 3, 1, 1, bias=False)\n\
                         encoder.maxpool = torch.nn.Identity()\n"
                    );
                } else if channels != 3 {
                    let _ = writeln!(
                        build,
                        "encoder.conv1 = torch.nn.Conv2d({channels}, 64, 7, 2, 3, bias=False)  \
                         # {channels}-channel images"
                    );
                }
                ("import torchvision\n", build)
            }
            "vit_t16" | "vit_s16" | "vit_b16" => {
                let dynamic = match self.input[2] {
                    224 => "",
                    _ => ", dynamic_img_size=True",
                };
                (
                    "import timm\n",
                    format!(
                        "encoder = timm.create_model(\"{}\", num_classes=0, in_chans={channels}{dynamic})\n",
                        self.timm_name()
                    ),
                )
            }
            "mlp" => (
                "",
                format!(
                    "{PY_MLP}\n\nencoder = Mlp({channels}, [{}])\n",
                    self.mlp
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            "resnet18_3d" => (
                "",
                format!("{PY_RESNET_3D}\n\nencoder = ResNet18_3d({channels})\n"),
            ),
            _ => (
                "",
                format!("{PY_DIGITS_CNN}\n\nencoder = DigitsCnn({channels})\n"),
            ),
        };
        format!(
            "import torch\n{imports}from huggingface_hub import hf_hub_download\n\
             from safetensors.torch import load_file\n\n{build}\
             encoder.load_state_dict(load_file(hf_hub_download(\"{repo}\", \"model.safetensors\")), strict=True)\n\
             encoder.eval()  # batch norm with its running statistics\n\
             with torch.no_grad():\n    features = encoder(torch.zeros({shape}))\n\
             assert features.shape == ({}, {}), features.shape\n",
            self.input[0], self.dim
        )
    }
}

/// candle-ssl's `digits_cnn` in PyTorch.
const PY_DIGITS_CNN: &str = r#"class DigitsCnn(torch.nn.Module):
    """Three conv3x3-BN-ReLU blocks (32, 64, 128 channels, strides 1, 2, 2), mean pool, fc."""

    def __init__(self, in_channels):
        super().__init__()
        widths = [in_channels, 32, 64, 128]
        for i, stride in enumerate([1, 2, 2]):
            conv = torch.nn.Conv2d(widths[i], widths[i + 1], 3, stride, 1, bias=False)
            setattr(self, f"conv{i + 1}", conv)
            setattr(self, f"bn{i + 1}", torch.nn.BatchNorm2d(widths[i + 1]))
        self.fc = torch.nn.Linear(128, 128)

    def forward(self, x):
        for i in (1, 2, 3):
            x = torch.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
        return self.fc(x.mean((2, 3)))"#;

/// candle-ssl's `mlp` in PyTorch.
const PY_MLP: &str = r#"class Mlp(torch.nn.Module):
    """Linear layers with ReLU between them, on the flattened input."""

    def __init__(self, in_dim, widths):
        super().__init__()
        dims = [in_dim] + widths
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:])
        )

    def forward(self, x):
        x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x"#;

/// candle-ssl's `resnet18_3d` (IConE's 3D ResNet-18 with fc 512 → 512) in PyTorch.
const PY_RESNET_3D: &str = r#"class Block3d(torch.nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv3d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm3d(c_out)
        self.conv2 = torch.nn.Conv3d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm3d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = torch.nn.Sequential(
                torch.nn.Conv3d(c_in, c_out, 1, stride, bias=False), torch.nn.BatchNorm3d(c_out)
            )

    def forward(self, x):
        h = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(h + (x if self.downsample is None else self.downsample(x)))


class ResNet18_3d(torch.nn.Module):
    """torchvision's ResNet-18 with every layer in 3D, and fc 512 -> 512."""

    def __init__(self, in_channels):
        super().__init__()
        self.conv1 = torch.nn.Conv3d(in_channels, 64, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm3d(64)
        self.maxpool = torch.nn.MaxPool3d(3, 2, 1)
        c_in = 64
        for i, width in enumerate([64, 128, 256, 512]):
            blocks = [Block3d(c_in, width, 1 if i == 0 else 2), Block3d(width, width, 1)]
            setattr(self, f"layer{i + 1}", torch.nn.Sequential(*blocks))
            c_in = width
        self.fc = torch.nn.Linear(512, 512)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        for i in (1, 2, 3, 4):
            x = getattr(self, f"layer{i}")(x)
        return self.fc(x.mean((2, 3, 4)))"#;

/// Declares Rust snippet templates: each is the text the card shows after its constants, and a
/// doctest that compiles it with example constants (`cargo test -p ssl --doc`).
macro_rules! rust_snippets {
    ($($(#[$meta:meta])* $name:ident, $example:literal, $text:literal;)*) => {$(
        $(#[$meta])*
        #[doc = concat!("```no_run\n", $example, $text, "```")]
        const $name: &str = $text;
    )*};
}

rust_snippets! {
    /// `digits_cnn`.
    RUST_DIGITS_CNN,
    "const WEIGHTS: &str = \"model.safetensors\";\nconst INPUT: &[usize] = &[1, 1, 16, 16];\nconst DIM: usize = 128;\n",
    r#"use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use ssl_models::{DigitsCnn, Encoder};

fn main() -> anyhow::Result<()> {
    let device = Device::Cpu;
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[WEIGHTS], DType::F32, &device)? };
    let encoder = DigitsCnn::new(INPUT[1], vb)?;
    let x = Tensor::zeros(INPUT, DType::F32, &device)?;
    let features = Encoder::forward_t(&encoder, &x, false)?; // eval-mode batch norm
    assert_eq!(features.dims(), [INPUT[0], DIM]);
    Ok(())
}
"#;
    /// `mlp`.
    RUST_MLP,
    "const WEIGHTS: &str = \"model.safetensors\";\nconst INPUT: &[usize] = &[1, 2];\nconst DIM: usize = 2;\nconst WIDTHS: &[usize] = &[64, 64, 2];\n",
    r#"use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use ssl_models::{Encoder, Mlp};

fn main() -> anyhow::Result<()> {
    let device = Device::Cpu;
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[WEIGHTS], DType::F32, &device)? };
    let encoder = Mlp::new(INPUT[1..].iter().product(), WIDTHS, vb)?;
    let x = Tensor::zeros(INPUT, DType::F32, &device)?;
    let features = Encoder::forward_t(&encoder, &x, false)?; // flattens each sample
    assert_eq!(features.dims(), [INPUT[0], DIM]);
    Ok(())
}
"#;
    /// The 2D ResNets.
    RUST_RESNET,
    "const WEIGHTS: &str = \"model.safetensors\";\nconst INPUT: &[usize] = &[1, 3, 32, 32];\nconst DIM: usize = 512;\nconst DEPTH: usize = 18;\nconst STEM: Stem = Stem::Cifar;\n",
    r#"use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use ssl_models::{Encoder, ResNet, ResNetConfig, Stem};

fn main() -> anyhow::Result<()> {
    let device = Device::Cpu;
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[WEIGHTS], DType::F32, &device)? };
    let encoder = ResNet::new(&ResNetConfig::new(DEPTH, STEM, INPUT[1])?, vb)?;
    let x = Tensor::zeros(INPUT, DType::F32, &device)?;
    let features = Encoder::forward_t(&encoder, &x, false)?; // eval-mode batch norm
    assert_eq!(features.dims(), [INPUT[0], DIM]);
    Ok(())
}
"#;
    /// `resnet18_3d`.
    RUST_RESNET_3D,
    "const WEIGHTS: &str = \"model.safetensors\";\nconst INPUT: &[usize] = &[1, 1, 28, 28, 28];\nconst DIM: usize = 512;\n",
    r#"use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use ssl_models::{Encoder, ResNet, ResNetConfig};

fn main() -> anyhow::Result<()> {
    let device = Device::Cpu;
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[WEIGHTS], DType::F32, &device)? };
    let mut config = ResNetConfig::resnet18_3d();
    config.in_channels = INPUT[1];
    let encoder = ResNet::new(&config, vb)?;
    let x = Tensor::zeros(INPUT, DType::F32, &device)?;
    let features = Encoder::forward_t(&encoder, &x, false)?; // eval-mode batch norm
    assert_eq!(features.dims(), [INPUT[0], DIM]);
    Ok(())
}
"#;
    /// The ViTs.
    RUST_VIT,
    "const WEIGHTS: &str = \"model.safetensors\";\nconst INPUT: &[usize] = &[1, 3, 224, 224];\nconst DIM: usize = 384;\nconst SIZE: fn() -> VitConfig = VitConfig::small;\n",
    r#"use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use ssl_models::{Encoder, VisionTransformer, VitConfig};

fn main() -> anyhow::Result<()> {
    let device = Device::Cpu;
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[WEIGHTS], DType::F32, &device)? };
    let mut config = SIZE();
    config.in_channels = INPUT[1];
    let encoder = VisionTransformer::new(&config, vb)?;
    let x = Tensor::zeros(INPUT, DType::F32, &device)?;
    let features = Encoder::forward_t(&encoder, &x, false)?; // the class token
    assert_eq!(features.dims(), [INPUT[0], DIM]);
    Ok(())
}
"#;
}

#[cfg(test)]
mod tests;
