//! The mapping of a scan's values, in its own units, to `[0, 1]` before the views
//! (`data.intensity`).
//!
//! | mapping | YAML | per | what |
//! |---|---|---|---|
//! | [`Intensity::Range`] | `range` | file | `v / (2^bits − 1)` over the stored integer type's range: 8-bit images read as before, 16-bit ones keep their 65,536 levels |
//! | [`Intensity::Window`] | `{window: [lo, hi]}` | run | a fixed window in the modality's units, e.g. CT lung `[-1000, 400]` HU |
//! | [`Intensity::Percentile`] | `{percentile: [0.5, 99.5]}` | channel of each image | clip to the image's own percentiles, then scale (the nnU-Net habit for MR and microscopy) |
//! | [`Intensity::MinMax`] | `minmax` | channel of each image | the image's own minimum to 0, its maximum to 1 |
//!
//! Values outside the window or percentiles are clipped to it, so every mapped value lies in
//! `[0, 1]`. A channel whose window is empty (a constant image) maps to 0. Percentiles
//! interpolate linearly between the two nearest order statistics, as NumPy's default does.

use anyhow::{bail, ensure, Result};
use serde::{Deserialize, Serialize};

use super::Decoded;

/// How a scan's values become `[0, 1]`; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Spelling", into = "Spelling")]
pub enum Intensity {
    /// The stored integer type's full range.
    Range,
    /// A fixed window `[lo, hi]` in the modality's units.
    Window([f64; 2]),
    /// Each channel of each image clipped to its own `[lo, hi]` percentiles (in percent).
    Percentile([f64; 2]),
    /// Each channel of each image from its own minimum to its maximum.
    MinMax,
}

/// How configs write an [`Intensity`]: a name, or a one-key mapping to its bounds.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Spelling {
    Name(String),
    Window(WindowKey),
    Percentile(PercentileKey),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowKey {
    window: [f64; 2],
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PercentileKey {
    percentile: [f64; 2],
}

impl TryFrom<Spelling> for Intensity {
    type Error = String;

    fn try_from(spelling: Spelling) -> Result<Self, String> {
        match spelling {
            Spelling::Name(name) => match name.as_str() {
                "range" => Ok(Self::Range),
                "minmax" => Ok(Self::MinMax),
                other => Err(format!(
                    "unknown intensity mapping `{other}`; use range, minmax, {{window: [lo, hi]}} \
                     or {{percentile: [lo, hi]}}"
                )),
            },
            Spelling::Window(WindowKey { window }) => Ok(Self::Window(window)),
            Spelling::Percentile(PercentileKey { percentile }) => Ok(Self::Percentile(percentile)),
        }
    }
}

impl From<Intensity> for Spelling {
    fn from(intensity: Intensity) -> Self {
        match intensity {
            Intensity::Range => Self::Name("range".into()),
            Intensity::MinMax => Self::Name("minmax".into()),
            Intensity::Window(window) => Self::Window(WindowKey { window }),
            Intensity::Percentile(percentile) => Self::Percentile(PercentileKey { percentile }),
        }
    }
}

impl Intensity {
    /// The nnU-Net habit for scans in arbitrary units (DICOM, NIfTI, float TIFF): 0.5–99.5.
    pub const PERCENTILE: Intensity = Intensity::Percentile([0.5, 99.5]);

    /// What the mapping says in a listing: e.g. `window [-1000, 400]`.
    pub fn describe(&self) -> String {
        match self {
            Self::Range => "range of the stored type".into(),
            Self::Window([lo, hi]) => format!("window [{lo}, {hi}]"),
            Self::Percentile([lo, hi]) => format!("percentile [{lo}, {hi}] per channel"),
            Self::MinMax => "min-max per channel".into(),
        }
    }

    /// Refuses windows and percentiles that are empty, reversed or out of range.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Self::Window([lo, hi]) => ensure!(
                lo.is_finite() && hi.is_finite() && lo < hi,
                "data.intensity: window [{lo}, {hi}] must have lo < hi, e.g. {{window: [-1000, \
                 400]}} for CT lung in HU"
            ),
            Self::Percentile([lo, hi]) => ensure!(
                (0.0..=100.0).contains(&lo) && (0.0..=100.0).contains(&hi) && lo < hi,
                "data.intensity: percentile [{lo}, {hi}] must satisfy 0 <= lo < hi <= 100, e.g. \
                 {{percentile: [0.5, 99.5]}}"
            ),
            Self::Range | Self::MinMax => {}
        }
        Ok(())
    }

    /// `scan`'s values mapped to `[0, 1]` in place; `what` names the file in errors.
    pub fn apply(&self, scan: &mut Decoded, what: &str) -> Result<()> {
        let channels = scan.shape.first().copied().unwrap_or(1).max(1);
        let plane = scan.values.len() / channels;
        if let Some(i) = scan.values.iter().position(|v| !v.is_finite()) {
            bail!(
                "{what} holds a non-finite value ({}) at position {i} of {} values; replace \
                 NaN and inf (e.g. with the background value) before training",
                scan.values[i],
                scan.values.len()
            );
        }
        for channel in scan.values.chunks_mut(plane.max(1)) {
            let (lo, hi) = match *self {
                Self::Range => match scan.type_range {
                    Some(range) => range,
                    None => bail!(
                        "{what} holds {} (not the stored integers), which have no type range; \
                         set data.intensity to {{window: [lo, hi]}}, {{percentile: [0.5, 99.5]}} \
                         or minmax",
                        scan.format
                    ),
                },
                Self::Window([lo, hi]) => (lo, hi),
                Self::Percentile([lo, hi]) => percentiles(channel, lo, hi),
                Self::MinMax => channel
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                        (lo.min(v as f64), hi.max(v as f64))
                    }),
            };
            scale(channel, lo, hi);
        }
        Ok(())
    }
}

/// `values` clipped to `[lo, hi]` and scaled to `[0, 1]`; all 0 when `hi <= lo`.
fn scale(values: &mut [f32], lo: f64, hi: f64) {
    if hi <= lo {
        values.fill(0.0);
        return;
    }
    let inv = 1.0 / (hi - lo);
    for v in values {
        *v = ((*v as f64 - lo) * inv).clamp(0.0, 1.0) as f32;
    }
}

/// The `lo` and `hi` percentiles of `values` (NumPy's linear interpolation).
fn percentiles(values: &[f32], lo: f64, hi: f64) -> (f64, f64) {
    let mut sorted = values.to_vec();
    (percentile(&mut sorted, lo), percentile(&mut sorted, hi))
}

/// The `q`-th percentile of `values` (reordered in the process), interpolating linearly
/// between the order statistics at `⌊(n − 1)·q/100⌋` and the next.
fn percentile(values: &mut [f32], q: f64) -> f64 {
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    let rank = (n - 1) as f64 * q / 100.0;
    let below = rank.floor() as usize;
    let (_, &mut low, above) = values.select_nth_unstable_by(below, f32::total_cmp);
    let next = above.iter().copied().min_by(f32::total_cmp).unwrap_or(low);
    low as f64 + (rank - below as f64) * (next as f64 - low as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(values: Vec<f32>, channels: usize, type_range: Option<(f64, f64)>) -> Decoded {
        let n = values.len() / channels;
        Decoded {
            values,
            shape: vec![channels, 1, n],
            spacing: None,
            type_range,
            format: "test values".into(),
        }
    }

    #[test]
    fn percentiles_match_numpy() {
        // numpy.percentile(np.arange(1, 11), [0.5, 25, 99.5]) = [1.045, 3.25, 9.955]
        let mut values: Vec<f32> = (1..=10).rev().map(|v| v as f32).collect();
        for (q, want) in [(0.5, 1.045), (25.0, 3.25), (99.5, 9.955), (100.0, 10.0)] {
            assert!((percentile(&mut values, q) - want).abs() < 1e-9, "{q}");
        }
    }

    #[test]
    fn each_mapping_lands_in_the_unit_interval() -> Result<()> {
        let mut window = scan(vec![-2000.0, -1000.0, -300.0, 400.0, 3000.0], 1, None);
        Intensity::Window([-1000.0, 400.0]).apply(&mut window, "ct")?;
        assert_eq!(window.values, [0.0, 0.0, 0.5, 1.0, 1.0]);

        let mut counts = scan(vec![0.0, 300.0, 65535.0], 1, Some((0.0, 65535.0)));
        Intensity::Range.apply(&mut counts, "png")?;
        assert_eq!(counts.values, [0.0, 300.0 / 65535.0, 1.0]);

        // Two channels, each scaled by its own extremes.
        let mut two = scan(vec![10.0, 20.0, 30.0, 0.0, 1.0, 4.0], 2, None);
        Intensity::MinMax.apply(&mut two, "tiff")?;
        assert_eq!(two.values, [0.0, 0.5, 1.0, 0.0, 0.25, 1.0]);

        // 0..=100 with one outlier: the 1st-99th percentiles clip it.
        let mut values: Vec<f32> = (0..=100).map(|v| v as f32).collect();
        values[100] = 1e6;
        let mut outlier = scan(values, 1, None);
        Intensity::Percentile([1.0, 99.0]).apply(&mut outlier, "mr")?;
        assert!((outlier.values[50] - 49.0 / 98.0).abs() < 1e-6);
        assert_eq!((outlier.values[0], outlier.values[100]), (0.0, 1.0));

        let mut flat = scan(vec![7.0; 4], 1, None);
        Intensity::MinMax.apply(&mut flat, "flat")?;
        assert_eq!(flat.values, [0.0; 4]);
        Ok(())
    }

    #[test]
    fn bad_values_and_settings_are_refused() {
        let mut floats = scan(vec![0.5, f32::NAN], 1, None);
        let e = Intensity::MinMax.apply(&mut floats, "a.nii").unwrap_err();
        assert!(format!("{e}").contains("a.nii holds a non-finite value (NaN) at position 1"));
        let mut hu = scan(vec![-1000.0, 0.0], 1, None);
        let e = Intensity::Range.apply(&mut hu, "ct.dcm").unwrap_err();
        assert!(format!("{e}").contains("have no type range; set data.intensity"));
        assert!(Intensity::Window([400.0, -1000.0]).validate().is_err());
        assert!(Intensity::Percentile([0.5, 101.0]).validate().is_err());
        assert!(Intensity::PERCENTILE.validate().is_ok());
    }

    #[test]
    fn yaml_spellings() -> Result<()> {
        let parse = |s: &str| serde_yaml::from_str::<Intensity>(s);
        assert_eq!(
            parse("{window: [-1000, 400]}")?,
            Intensity::Window([-1000.0, 400.0])
        );
        assert_eq!(parse("{percentile: [0.5, 99.5]}")?, Intensity::PERCENTILE);
        assert_eq!(parse("minmax")?, Intensity::MinMax);
        assert_eq!(parse("range")?, Intensity::Range);
        assert!(parse("{windows: [0, 1]}").is_err());
        assert!(parse("{window: [0, 1], percentile: [1, 2]}").is_err());
        assert!(format!("{}", parse("linear").unwrap_err()).contains("unknown intensity mapping"));
        let written = serde_yaml::to_string(&Intensity::Window([-1000.0, 400.0]))?;
        assert_eq!(parse(&written)?, Intensity::Window([-1000.0, 400.0]));
        Ok(())
    }
}
