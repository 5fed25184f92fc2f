//! The run directory: which one a run writes, what may already be in it, and how a resumed
//! run's configuration is held against the one it recorded.
//!
//! Without `--out` every run gets a directory of its own, `runs/<objective>-<time>`, and
//! `runs/latest` links to the newest. An explicit `--out` that holds another run is refused
//! unless the user says `--overwrite` (its files are removed first) or `--resume`. A resume
//! whose configuration differs from the recorded one in a key that changes the result is
//! refused with the keys named, unless each is allowed by `--allow-changed`; the allowed
//! changes are recorded in `config.yaml` under `history`.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::config::{ConfigChange, RunConfig};

/// Where runs go when `--out` is not given.
pub const RUNS: &str = "runs";
/// The link in [`RUNS`] to the newest run.
pub const LATEST: &str = "latest";

/// The files and directories a run writes; `--overwrite` removes exactly these.
pub const ARTEFACTS: &[&str] = &[
    "config.yaml",
    "split.json",
    "metrics.jsonl",
    "spectrum.csv",
    "spectrum.png",
    "embedding.csv",
    "embedding.png",
    "results.json",
    "checkpoint",
    "checkpoint.new",
    "checkpoint.old",
    crate::runlog::BOARD,
    "eval",
    "export",
    "hub",
];

/// The files that describe a finished run's end; a resume removes them first, so they never
/// sit beside weights they were not computed from.
const OUTCOMES: &[&str] = &[
    "results.json",
    "embedding.csv",
    "embedding.png",
    "spectrum.png",
    "eval",
    "export",
    "hub",
];

/// Keys that a resume may change freely: they decide where and how fast a run goes, not what
/// it computes.
const FREE_KEYS: &[&str] = &[
    "out",
    "history",
    "train.threads",
    "train.collective_timeout",
    "train.stop_after_epochs",
    "train.checkpoint_every",
    "train.log_every",
];

/// How `ssl run` treats its run directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// A new run: a fresh directory, or an explicit `--out` that holds no run.
    #[default]
    Fresh,
    /// A new run in `--out`, whose previous run's files are removed first.
    Overwrite,
    /// Continue the run in `--out` from its last checkpoint.
    Resume,
}

/// Whether `dir` holds (part of) a run: its config, a checkpoint or a metrics log.
pub fn holds_run(dir: &Path) -> bool {
    [
        "config.yaml",
        "checkpoint",
        "checkpoint.old",
        "metrics.jsonl",
    ]
    .iter()
    .any(|name| dir.join(name).exists())
}

/// The directory `cfg` trains into, made ready for `start`: a new `runs/<objective>-<time>`
/// when `cfg.out` is empty (then linked from `runs/latest`), else `cfg.out`, refused when it
/// holds another run and `start` is [`Start::Fresh`], emptied of the old run's files for
/// [`Start::Overwrite`], and cleared of the old outcome (results, evaluation, export) for
/// [`Start::Resume`].
pub fn prepare(cfg: &RunConfig, start: Start) -> Result<PathBuf> {
    if cfg.out.as_os_str().is_empty() {
        if start == Start::Resume {
            bail!("--resume needs the run: give --out DIR (or resume the newest with runs/latest)");
        }
        let dir = claim_new(Path::new(RUNS), &cfg.objective.name)?;
        link_latest(Path::new(RUNS), &dir);
        return Ok(dir);
    }
    let dir = cfg.out.clone();
    match start {
        Start::Fresh if holds_run(&dir) => bail!(
            "{} already holds a run; continue it with --resume, replace it with --overwrite, or \
             choose another --out (without --out every run gets its own directory under {RUNS}/)",
            dir.display()
        ),
        Start::Fresh => {}
        Start::Overwrite => remove(&dir, ARTEFACTS)?,
        Start::Resume => remove(&dir, OUTCOMES)?,
    }
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create run directory {}", dir.display()))?;
    Ok(dir)
}

/// Removes the entries `names` of `dir` that exist.
fn remove(dir: &Path, names: &[&str]) -> Result<()> {
    for name in names {
        let path = dir.join(name);
        let removed = match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(_) => continue,
        };
        removed.with_context(|| format!("cannot remove {}", path.display()))?;
    }
    Ok(())
}

/// Creates `runs/<objective>-<YYYYmmdd-HHMMSS>` (UTC), with `-2`, `-3`, … when runs start within
/// the same second; creating the directory claims the name.
fn claim_new(runs: &Path, objective: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(runs).with_context(|| format!("cannot create {}", runs.display()))?;
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let stem = format!("{objective}-{}", utc_stamp(secs));
    for k in 1.. {
        let name = match k {
            1 => stem.clone(),
            k => format!("{stem}-{k}"),
        };
        let dir = runs.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
        }
    }
    unreachable!("the loop returns or errors")
}

/// `YYYYmmdd-HHMMSS` of `secs` since the Unix epoch, in UTC (Hinnant's civil-from-days).
fn utc_stamp(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Points `runs/latest` at `dir` (a relative symlink, swapped in atomically). A `latest` that is
/// not a link (a directory of an older version's default run) is left alone, with a warning.
fn link_latest(runs: &Path, dir: &Path) {
    let latest = runs.join(LATEST);
    let is_link = std::fs::symlink_metadata(&latest).map_or(true, |m| m.file_type().is_symlink());
    if !is_link {
        eprintln!(
            "warning: {} is not a link (an older run's directory?); it is left as it is and \
             does not point at {}",
            latest.display(),
            dir.display()
        );
        return;
    }
    #[cfg(unix)]
    {
        let Some(name) = dir.file_name() else { return };
        let tmp = runs.join(format!(".{LATEST}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let linked =
            std::os::unix::fs::symlink(name, &tmp).and_then(|()| std::fs::rename(&tmp, &latest));
        if let Err(e) = linked {
            eprintln!(
                "warning: cannot point {} at {}: {e}",
                latest.display(),
                dir.display()
            );
        }
    }
}

/// The run `--resume` continues: `--out`, else the run `runs/latest` points at.
pub fn resume_target(out: Option<&Path>) -> Result<PathBuf> {
    let dir = match out {
        Some(dir) => dir.to_path_buf(),
        None => {
            let latest = Path::new(RUNS).join(LATEST);
            std::fs::canonicalize(&latest).with_context(|| {
                format!(
                    "--resume without --out continues {}, which does not exist; give the run's \
                     directory with --out",
                    latest.display()
                )
            })?
        }
    };
    if !dir.join("config.yaml").exists() {
        bail!(
            "{} holds no run to resume (no config.yaml); start one without --resume",
            dir.display()
        );
    }
    Ok(dir)
}

/// Holds the configuration a resume asks for against the one the run recorded, at `step` (the
/// checkpoint's). Keys in `FREE_KEYS` may differ; every other difference must be allowed by
/// an `allowed` entry (the key, or a section above it such as `objective.params`), else the
/// resume is refused with the differing keys named. Returns `requested` with the allowed
/// changes appended to the recorded `history`.
pub fn check_resume(
    recorded: &RunConfig,
    requested: &RunConfig,
    allowed: &[String],
    step: usize,
) -> Result<RunConfig> {
    let before = flatten(&serde_yaml::to_value(recorded)?);
    let after = flatten(&serde_yaml::to_value(requested)?);
    let free = |key: &str| FREE_KEYS.iter().any(|f| covers(f, key));
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    let null = serde_yaml::Value::Null;
    let changed: Vec<ConfigChange> = keys
        .into_iter()
        .filter(|k| !free(k) && before.get(*k) != after.get(*k))
        .map(|k| ConfigChange {
            key: k.clone(),
            from: before.get(k).unwrap_or(&null).clone(),
            to: after.get(k).unwrap_or(&null).clone(),
            step,
        })
        .collect();
    for a in allowed {
        if !changed.iter().any(|c| covers(a, &c.key)) {
            bail!(
                "--allow-changed {a}: the resumed configuration does not change {a}{}",
                match changed.is_empty() {
                    true => String::new(),
                    false => format!(
                        " (it changes {})",
                        changed
                            .iter()
                            .map(|c| c.key.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            );
        }
    }
    let refused: Vec<&ConfigChange> = changed
        .iter()
        .filter(|c| !allowed.iter().any(|a| covers(a, &c.key)))
        .collect();
    if !refused.is_empty() {
        let lines: Vec<String> = refused
            .iter()
            .map(|c| format!("  {}: {} → {}", c.key, show(&c.from), show(&c.to)))
            .collect();
        let keys: Vec<&str> = refused.iter().map(|c| c.key.as_str()).collect();
        bail!(
            "--resume would continue {} with a different configuration:\n{}\nthese change the \
             result, so the run would be neither the old one nor a new one. Resume with the \
             run's own configuration (drop the flags above), start a new run (drop --resume), or \
             accept the change from step {step} on with --allow-changed {}",
            recorded.out.display(),
            lines.join("\n"),
            keys.join(",")
        );
    }
    let mut resumed = requested.clone();
    resumed.history = recorded.history.clone();
    resumed.history.extend(changed);
    Ok(resumed)
}

/// Whether the allowance or free key `rule` covers `key`: the key itself or a section above it.
fn covers(rule: &str, key: &str) -> bool {
    key == rule
        || key
            .strip_prefix(rule)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// A value as one line of YAML.
fn show(value: &serde_yaml::Value) -> String {
    match value {
        serde_yaml::Value::Null => "(absent)".into(),
        v => serde_yaml::to_string(v)
            .map(|s| s.trim().replace('\n', " "))
            .unwrap_or_default(),
    }
}

/// Every leaf of a YAML tree by its dotted key (sequences are leaves).
fn flatten(value: &serde_yaml::Value) -> std::collections::BTreeMap<String, serde_yaml::Value> {
    fn walk(
        prefix: &str,
        value: &serde_yaml::Value,
        out: &mut std::collections::BTreeMap<String, serde_yaml::Value>,
    ) {
        match value {
            serde_yaml::Value::Mapping(map) => {
                for (k, v) in map {
                    let k = match k {
                        serde_yaml::Value::String(s) => s.clone(),
                        other => show(other),
                    };
                    let key = match prefix {
                        "" => k,
                        p => format!("{p}.{k}"),
                    };
                    walk(&key, v, out);
                }
            }
            leaf => {
                out.insert(prefix.to_string(), leaf.clone());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk("", value, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sets: &[&str]) -> RunConfig {
        let mut root = serde_yaml::Value::Mapping(Default::default());
        for s in sets {
            crate::config::apply_set(&mut root, s).unwrap();
        }
        RunConfig::from_yaml_value(root).unwrap()
    }

    #[test]
    fn utc_stamps_match_known_dates() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        // 2000-02-29 (a leap day in a century leap year) 12:34:56.
        assert_eq!(utc_stamp(951_827_696), "20000229-123456");
        assert_eq!(utc_stamp(1_795_000_000), "20261118-110640");
    }

    #[test]
    fn a_resume_that_changes_the_result_is_refused_with_the_keys_named() {
        let recorded = config(&["out=r", "train.lr=0.001"]);
        let same = config(&["out=r", "train.lr=0.001", "train.threads=1"]);
        assert_eq!(
            check_resume(&recorded, &same, &[], 40).unwrap().history,
            vec![]
        );

        let changed = config(&["out=r", "train.lr=0.01", "objective.params.mu=10"]);
        let e = check_resume(&recorded, &changed, &[], 40)
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.lr: 0.001 → 0.01"), "{e}");
        assert!(e.contains("objective.params.mu: 25.0 → 10"), "{e}");
        assert!(
            e.contains("--allow-changed objective.params.mu,train.lr"),
            "{e}"
        );
        // One allowed, one not: still refused, naming only the other.
        let e = check_resume(&recorded, &changed, &["train.lr".into()], 40)
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("train.lr:") && e.contains("objective.params.mu"),
            "{e}"
        );
        // A section allows every key under it; the changes are recorded with their step.
        let allowed = ["train".to_string(), "objective.params".to_string()];
        let resumed = check_resume(&recorded, &changed, &allowed, 40).unwrap();
        let keys: Vec<_> = resumed
            .history
            .iter()
            .map(|c| (c.key.as_str(), c.step))
            .collect();
        assert_eq!(keys, [("objective.params.mu", 40), ("train.lr", 40)]);
        // A named allowance that changes nothing is a mistake worth hearing about.
        let e = check_resume(&recorded, &same, &["train.epochs".into()], 40)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not change train.epochs"), "{e}");
        // A key that is not a prefix at a dot boundary does not cover another.
        assert!(!covers("train.lr", "train.lr_scale") && covers("train", "train.lr"));
    }

    #[test]
    fn an_explicit_out_holding_a_run_needs_resume_or_overwrite() -> Result<()> {
        let root = tempfile::tempdir()?;
        let dir = root.path().join("run");
        let cfg = config(&[&format!("out='{}'", dir.display())]);
        assert_eq!(prepare(&cfg, Start::Fresh)?, dir);
        std::fs::write(dir.join("config.yaml"), "old")?;
        std::fs::create_dir_all(dir.join("eval"))?;
        std::fs::write(dir.join("notes.txt"), "mine")?;
        let e = prepare(&cfg, Start::Fresh).unwrap_err().to_string();
        assert!(
            e.contains("already holds a run") && e.contains("--overwrite"),
            "{e}"
        );
        // A resume keeps the run but drops its old outcome.
        prepare(&cfg, Start::Resume)?;
        assert!(dir.join("config.yaml").exists() && !dir.join("eval").exists());
        // Overwrite removes the run's files and nothing else.
        prepare(&cfg, Start::Overwrite)?;
        assert!(!dir.join("config.yaml").exists() && dir.join("notes.txt").exists());
        Ok(())
    }
}
