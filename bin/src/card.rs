//! The model card `ssl push` publishes: a `README.md` with the Hub's YAML front matter (library,
//! tags, data set, metrics), the run's evaluation table, its recipe, the weights' layout and how
//! to load them in Rust and in Python.

use std::fmt::Write;

use candle_core::Tensor;

use crate::config::RunConfig;

/// One row of a run's `results.json`: an encoder and its metrics.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ResultRow {
    /// "raw inputs", "random init" or the trained encoder.
    pub encoder: String,
    /// Metric name → value.
    pub metrics: std::collections::BTreeMap<String, f64>,
}

/// A run's `results.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Results {
    /// The baselines and the trained encoder.
    pub rows: Vec<ResultRow>,
}

/// The columns of the card's table: (metric key, heading, percent?).
const COLUMNS: [(&str, &str, bool); 4] = [
    (
        "probe_balanced_accuracy",
        "linear probe, balanced acc.",
        true,
    ),
    ("knn_accuracy", "20-NN acc.", true),
    ("rankme", "RankMe", false),
    ("effective_rank", "effective rank", false),
];

/// `README.md` for `repo` from the run's config, results and exported encoder tensors
/// (name → tensor, sorted).
pub fn model_card(
    repo: &str,
    cfg: &RunConfig,
    results: &Results,
    weights: &[(String, Tensor)],
) -> String {
    let objective = &cfg.objective.name;
    let paper = ssl_core::registry::find(objective)
        .map(|r| r.paper.to_string())
        .unwrap_or_default();
    let mut card = String::new();
    let _ = writeln!(card, "---\nlibrary_name: candle-ssl\nlicense: apache-2.0");
    let _ = writeln!(card, "pipeline_tag: image-feature-extraction\ntags:");
    for tag in [
        "self-supervised-learning",
        "candle",
        "safetensors",
        objective,
    ] {
        let _ = writeln!(card, "- {tag}");
    }
    let _ = writeln!(card, "datasets:\n- {}", cfg.data.name);
    let _ = writeln!(card, "metrics:\n- balanced_accuracy\n- accuracy\n---\n");
    let _ = writeln!(card, "# {repo}\n");
    let _ = writeln!(
        card,
        "A `{}` encoder pretrained with **{objective}** ({paper}) on `{}` by candle-ssl \
         (`ssl run`): {} epochs, batch {} × {} views, seed {}. The weights are the encoder alone (no projector, objective state or optimiser), \
         with PyTorch state-dict keys.\n",
        cfg.model.encoder,
        cfg.data.name,
        cfg.train.epochs,
        cfg.train.batch_size,
        cfg.train.views,
        cfg.train.seed,
    );
    let _ = writeln!(card, "## Evaluation\n");
    let _ = writeln!(
        card,
        "Frozen features of the held-out split (batch norm in eval mode), next to the raw \
         inputs and the randomly initialised encoder:\n"
    );
    let _ = write!(card, "| encoder |");
    for (_, heading, _) in COLUMNS {
        let _ = write!(card, " {heading} |");
    }
    let _ = writeln!(card, "\n|---|{}", "---|".repeat(COLUMNS.len()));
    for row in &results.rows {
        let _ = write!(card, "| {} |", row.encoder);
        for (key, _, percent) in COLUMNS {
            let cell = match (row.metrics.get(key), percent) {
                (Some(v), true) => format!("{:.1} %", 100.0 * v),
                (Some(v), false) => format!("{v:.1}"),
                (None, _) => "–".into(),
            };
            let _ = write!(card, " {cell} |");
        }
        let _ = writeln!(card);
    }
    let _ = writeln!(card, "\n## Load the weights\n\nRust (Candle):\n");
    let _ = writeln!(
        card,
        "```rust\n// `path`: model.safetensors from `ssl pull {repo}` (or `hf download {repo}`)\n\
         let vb = unsafe {{ candle_nn::VarBuilder::from_mmaped_safetensors(&[path], candle_core::DType::F32, &candle_core::Device::Cpu)? }};\n\
         // the layout of candle-ssl's `{}` encoder (crate ssl-models)\n```\n",
        cfg.model.encoder
    );
    let _ = writeln!(card, "Python (PyTorch):\n");
    let _ = writeln!(
        card,
        "```python\nfrom huggingface_hub import hf_hub_download\nfrom safetensors.torch import load_file\n\n\
         state_dict = load_file(hf_hub_download(\"{repo}\", \"model.safetensors\"))\n\
         encoder.load_state_dict(state_dict)  # a torch module with the layout below\n```\n"
    );
    let _ = writeln!(card, "## Layout\n\n| tensor | shape |\n|---|---|");
    for (name, t) in weights {
        let _ = writeln!(card, "| `{name}` | {:?} |", t.dims());
    }
    let recipe = serde_yaml::to_string(cfg).unwrap_or_default();
    let _ = writeln!(
        card,
        "\n## Recipe\n\n`config.yaml` in this repository; `ssl run --config config.yaml` \
         retrains it.\n\n```yaml\n{recipe}```"
    );
    card
}
