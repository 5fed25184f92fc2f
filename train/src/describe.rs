//! `ssl describe NAME` and Python's `candle_ssl.describe(name)`: an objective's summary, keys
//! with their defaults, and limits, as text.

use anyhow::Result;

use crate::config::inline_yaml;

/// An objective's summary, paper, aliases, keys with their defaults, and limits, as `ssl
/// describe` prints them.
pub fn objective(name: &str) -> Result<String> {
    let r = ssl_core::find(name)?;
    let mut text = format!("{} — {}\n{}\n\n", r.name, r.summary, r.paper);
    if !r.aliases.is_empty() {
        text += &format!("aliases: {}\n\n", r.aliases.join(", "));
    }
    let defaults = (r.default_config)();
    if r.keys.is_empty() {
        text += "keys: none (nothing to set under objective.params)\n";
    } else {
        text += "keys (objective.params.KEY):\n";
        let values: Vec<String> = r
            .keys
            .iter()
            .map(|k| inline_yaml(&defaults[k.name]))
            .collect();
        let key_width = r.keys.iter().map(|k| k.name.len()).max().unwrap_or(0);
        let value_width = values.iter().map(|v| v.chars().count()).max().unwrap_or(0);
        for (k, value) in r.keys.iter().zip(&values) {
            text += &format!(
                "  {:<key_width$}  {value:<value_width$}  {}\n",
                k.name, k.doc
            );
        }
    }
    text += &format!("\n{}", requirements(r)?);
    Ok(text)
}

/// The objective's limits, read from an instance built with its defaults at the main job's
/// batch size.
fn requirements(r: &ssl_core::Registration) -> Result<String> {
    let req = r.requirements(
        &serde_yaml::Value::Null,
        crate::config::TrainConfig::default().batch_size,
    )?;
    let max = req.max_views.map_or("any".to_string(), |m| m.to_string());
    let groups: String = req
        .param_groups
        .iter()
        .map(|g| format!("\nparameter group {}", g.summary()))
        .collect();
    Ok(format!(
        "limits: views {}..{max}, batch size ≥ {}{}{}{}{}",
        req.min_views,
        req.min_batch,
        if req.min_batch_reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", req.min_batch_reason)
        },
        if req.labels { ", needs labels" } else { "" },
        if req.teacher.is_some() {
            ", EMA teacher"
        } else {
            ""
        },
        if req.pixels {
            ", encodes the views itself (a ViT's patch tokens)"
        } else {
            ""
        },
    ) + &groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// List and map defaults print on one line, as `--set` takes them, not as YAML blocks.
    #[test]
    fn describe_prints_list_defaults_inline() -> Result<()> {
        let ijepa = (ssl_core::find("ijepa")?.default_config)();
        assert_eq!(inline_yaml(&ijepa["target_scale"]), "[0.15, 0.2]");
        assert_eq!(inline_yaml(&ijepa["targets"]), "4");
        let map: serde_yaml::Value = serde_yaml::from_str("{a: [1, 2], b: x}")?;
        assert_eq!(inline_yaml(&map), "{a: [1, 2], b: x}");
        Ok(())
    }

    /// `ssl describe` lists the parameter groups an objective declares, one line each.
    #[test]
    fn describe_lists_the_objectives_parameter_groups() -> Result<()> {
        let dino = requirements(ssl_core::find("dino")?)?;
        assert!(
            dino.contains("parameter group encoder. objective.head.: gradient norm clipped to 3 per parameter"),
            "{dino}"
        );
        assert!(
            dino.contains("parameter group objective.head.last_layer.: frozen for 1 epoch(s)"),
            "{dino}"
        );
        let simsiam = requirements(ssl_core::find("simsiam")?)?;
        assert!(
            simsiam.ends_with("parameter group objective.predictor.: constant schedule"),
            "{simsiam}"
        );
        let vicreg = requirements(ssl_core::find("vicreg")?)?;
        assert!(!vicreg.contains("parameter group"), "{vicreg}");
        Ok(())
    }
}
