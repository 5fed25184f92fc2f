//! The YAML layering: `--set key=value` into a document, documents merged, and serde's errors
//! rewritten to name the key.

use anyhow::{bail, ensure, Context, Result};

use super::*;

/// The error of deserialising `value` as a [`RunConfig`], with the dotted key it concerns and
/// serde's wording made plain: `train.lr: expected a number, got "abc"`. (Deserialising from a
/// `Value` loses the path; parsing its text keeps it.)
pub(super) fn keyed_error(value: &serde_yaml::Value, error: serde_yaml::Error) -> String {
    let keyed = serde_yaml::to_string(value)
        .ok()
        .and_then(|text| serde_yaml::from_str::<RunConfig>(&text).err());
    let Some(keyed) = keyed else {
        return with_nearest_field(plain_serde_message(&error.to_string()));
    };
    let mut text = keyed.to_string();
    // The line and column are those of the re-serialised text, not of anything the user wrote.
    if let Some(at) = keyed.location() {
        let suffix = format!(" at line {} column {}", at.line(), at.column());
        if let Some(stripped) = text.strip_suffix(&suffix) {
            text = stripped.to_string();
        }
    }
    with_nearest_field(plain_serde_message(&text))
}

/// serde's `unknown field `epoch`, expected one of `epochs`, …` with the nearest known name
/// named after the unknown one, when one is near enough to be a typo.
fn with_nearest_field(message: String) -> String {
    const UNKNOWN: &str = "unknown field `";
    let Some(at) = message.find(UNKNOWN) else {
        return message;
    };
    let start = at + UNKNOWN.len();
    let Some((field, known)) = message[start..].split_once('`') else {
        return message;
    };
    let distance = |name: &&str| strsim::levenshtein(name, field);
    let nearest = (known.split('`').skip(1).step_by(2))
        .min_by_key(distance)
        .filter(|name| distance(name) <= name.len().max(field.len()) / 3 + 1);
    match nearest {
        Some(name) => {
            let end = start + field.len() + 1;
            format!(
                "{} (did you mean `{name}`?){}",
                &message[..end],
                &message[end..]
            )
        }
        None => message,
    }
}

/// serde's `invalid type: string "abc", expected f64` as `expected a number, got "abc"` (a
/// leading `key: ` kept).
fn plain_serde_message(message: &str) -> String {
    let (key, rest) = match message.split_once(": invalid ") {
        Some((key, rest)) => (format!("{key}: "), format!("invalid {rest}")),
        None => (String::new(), message.to_string()),
    };
    let Some((got, expected)) = rest
        .strip_prefix("invalid type: ")
        .or_else(|| rest.strip_prefix("invalid value: "))
        .and_then(|r| r.split_once(", expected "))
    else {
        return message.to_string();
    };
    let expected = match expected {
        "f64" | "f32" => "a number",
        "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number ≥ 0",
        "i64" | "i32" => "a whole number",
        other => other,
    };
    let got = ["string ", "integer ", "floating point ", "boolean "]
        .iter()
        .find_map(|kind| got.strip_prefix(kind))
        .map_or(got, |v| v.trim_matches('`'))
        .replace("unit value", "null");
    format!("{key}expected {expected}, got {got}")
}

/// Applies `key.path=value` (value parsed as YAML) onto a YAML mapping. A mapping value merges
/// into a mapping already there, key by key (so `--set train={epochs: 3}` keeps an earlier
/// `--set train.lr=0.1`); `~` (null) resets a key; anything else replaces the value. Setting a
/// key under a value that is not a mapping, or a non-mapping over a mapping, is an error naming
/// both.
pub fn apply_set(root: &mut serde_yaml::Value, assignment: &str) -> Result<()> {
    let Some((key, raw)) = assignment.split_once('=') else {
        bail!("--set expects key=value (e.g. train.lr=0.01), got `{assignment}`");
    };
    ensure!(
        !key.is_empty() && key.split('.').all(|part| !part.is_empty()),
        "--set {assignment}: `{key}` is not a dotted key (e.g. train.lr)"
    );
    let value: serde_yaml::Value = serde_yaml::from_str(raw)
        .with_context(|| format!("--set {key}: `{raw}` is not a YAML value"))?;
    set_key(root, key, value, assignment)
}

/// Sets dotted `key` of `root` to `value` (merging mappings key by key), as `--set` does;
/// `assignment` is how the caller spelled it, for errors. The value is taken as it is, never
/// parsed: a command-line flag's path or name needs no quoting.
pub fn set_key(
    root: &mut serde_yaml::Value,
    key: &str,
    value: serde_yaml::Value,
    assignment: &str,
) -> Result<()> {
    let mut node = root;
    let mut path = String::new();
    for part in key.split('.') {
        if node.is_null() {
            *node = serde_yaml::Value::Mapping(Default::default());
        }
        let shown = (!node.is_mapping()).then(|| inline_yaml(node));
        let Some(map) = node.as_mapping_mut() else {
            bail!(
                "--set {assignment}: `{}` is `{}` (given earlier), not a mapping with keys",
                match path.is_empty() {
                    true => "the configuration",
                    false => &path,
                },
                shown.unwrap_or_default()
            );
        };
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(part);
        node = map
            .entry(serde_yaml::Value::String(part.to_string()))
            .or_insert(serde_yaml::Value::Null);
    }
    merge(node, value, &path, assignment)
}

/// Sets `node` (at dotted `path`) to `value`, merging mappings key by key.
fn merge(
    node: &mut serde_yaml::Value,
    value: serde_yaml::Value,
    path: &str,
    assignment: &str,
) -> Result<()> {
    if node.is_mapping() && !value.is_mapping() && !value.is_null() {
        bail!(
            "--set {assignment}: `{path}` holds the keys `{}` (given earlier), which `{}` would \
             replace; set them one by one ({path}.KEY=VALUE), or `{path}=~` first to reset them",
            inline_yaml(node),
            inline_yaml(&value)
        );
    }
    match (node, value) {
        (serde_yaml::Value::Mapping(map), serde_yaml::Value::Mapping(given)) => {
            for (key, value) in given {
                let name = key.as_str().map_or_else(|| inline_yaml(&key), String::from);
                let slot = map.entry(key).or_insert(serde_yaml::Value::Null);
                merge(slot, value, &format!("{path}.{name}"), assignment)?;
            }
        }
        (node, value) => *node = value,
    }
    Ok(())
}

/// A value on one line, as it is written after `--set KEY=`: YAML's flow style for lists and
/// maps (`[0.85, 1.0]`, `{lr: 0.1}`), for error messages and `ssl describe`'s table, whose
/// rows block style would break.
pub fn inline_yaml(value: &serde_yaml::Value) -> String {
    use serde_yaml::Value;
    match value {
        Value::Sequence(items) => {
            let items: Vec<String> = items.iter().map(inline_yaml).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Mapping(map) => {
            let entries: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", inline_yaml(k), inline_yaml(v)))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        scalar => serde_yaml::to_string(scalar)
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}
