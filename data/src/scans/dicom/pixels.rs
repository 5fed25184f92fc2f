//! Decoded samples to values in the modality's units: the photometric interpretation
//! ([`Colour`]), the stored bits ([`Stored`]), the Modality LUT ([`Modality`]) and the plan that
//! applies them to a file's frames ([`Plan`]); see the parent module's docs, **Values**.

use super::*;

/// What the decoded samples are and what becomes of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Colour {
    /// `MONOCHROME2`.
    Grey,
    /// `MONOCHROME1`: inverted after the Modality LUT.
    InvertedGrey,
    /// RGB as decoded.
    Rgb,
    /// `YBR_FULL`/`YBR_FULL_422` samples, converted to RGB here.
    Ybr,
}

impl Colour {
    pub(super) fn of(header: &DicomHeader, codec: Codec, path: &Path) -> Result<Self> {
        Ok(
            match (header.photometric.as_str(), header.samples_per_pixel) {
                ("MONOCHROME2", 1) => Colour::Grey,
                ("MONOCHROME1", 1) => Colour::InvertedGrey,
                ("YBR_FULL" | "YBR_FULL_422", 3) if codec != Codec::Jpeg => Colour::Ybr,
                ("RGB" | "YBR_FULL" | "YBR_FULL_422" | "YBR_ICT" | "YBR_RCT", 3) => Colour::Rgb,
                (photometric, samples) => bail!(
                    "{}: Photometric Interpretation {photometric} with {samples} sample(s) per \
                 pixel is not read here (only MONOCHROME1, MONOCHROME2, RGB and YBR_* are); \
                 convert it to RGB or greyscale first (for PALETTE COLOR, e.g. with pydicom's \
                 `apply_color_lut`)",
                    path.display(),
                ),
            },
        )
    }

    pub(super) fn channels(self) -> usize {
        match self {
            Colour::Grey | Colour::InvertedGrey => 1,
            Colour::Rgb | Colour::Ybr => 3,
        }
    }
}

/// How stored samples are read from the decoded bytes (native byte order).
#[derive(Debug, Clone, Copy)]
pub(super) struct Stored {
    /// Bytes per sample: 1, 2 or 4.
    pub(super) bytes: usize,
    /// Bits Stored.
    pub(super) bits: u32,
    /// How far the stored bits sit above bit 0: High Bit + 1 − Bits Stored.
    pub(super) shift: u32,
    pub(super) signed: bool,
}

impl Stored {
    /// Sample `index` of `raw`, which must hold it.
    pub(super) fn get(&self, raw: &[u8], index: usize) -> i64 {
        let at = index * self.bytes;
        let word = match self.bytes {
            1 => u32::from(raw[at]),
            2 => u32::from(u16::from_ne_bytes([raw[at], raw[at + 1]])),
            _ => u32::from_ne_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]),
        };
        let value = (word >> self.shift) & (u32::MAX >> (32 - self.bits));
        match self.signed && value >> (self.bits - 1) == 1 {
            true => i64::from(value) - (1i64 << self.bits),
            false => i64::from(value),
        }
    }

    /// The smallest and largest stored values.
    pub(super) fn range(&self) -> (i64, i64) {
        match self.signed {
            true => (-(1i64 << (self.bits - 1)), (1i64 << (self.bits - 1)) - 1),
            false => (0, (1i64 << self.bits) - 1),
        }
    }
}

/// Where sample `c` of pixel `p` lies in a frame's samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Layout {
    /// `p × C + c`.
    Interleaved,
    /// Planar Configuration 1: `c × pixels + p`.
    Planar,
    /// Native `YBR_FULL_422`: `Y₀ Y₁ Cb Cr` for each horizontal pair of pixels.
    PairedYbr,
}

/// The Modality LUT of a grey image.
#[derive(Debug, Clone)]
pub(super) enum Modality {
    /// Rescale `(slope, intercept)`, one for all frames or one per frame.
    Rescale(Vec<(f64, f64)>),
    /// Modality LUT Sequence: the stored value mapped to table entry `value − first`.
    Table {
        first: i64,
        entries: Vec<f64>,
        bits: u32,
    },
}

impl Modality {
    pub(super) fn map(&self, frame: usize, value: i64) -> f64 {
        match self {
            Modality::Rescale(rescale) => {
                let (slope, intercept) = rescale
                    .get(frame)
                    .or(rescale.first())
                    .copied()
                    .unwrap_or((1.0, 0.0));
                slope * value as f64 + intercept
            }
            Modality::Table { first, entries, .. } => {
                let last = entries.len() as i64 - 1;
                entries[(value - first).clamp(0, last) as usize]
            }
        }
    }

    /// The range of mapped values for `stored` samples, the one `MONOCHROME1` is mirrored in.
    pub(super) fn range(&self, frame: usize, stored: &Stored) -> (f64, f64) {
        match self {
            Modality::Rescale(_) => {
                let (lo, hi) = stored.range();
                let (a, b) = (self.map(frame, lo), self.map(frame, hi));
                (a.min(b), a.max(b))
            }
            Modality::Table { bits, .. } => (0.0, ((1u64 << bits) - 1) as f64),
        }
    }

    pub(super) fn is_identity(&self) -> bool {
        match self {
            Modality::Rescale(rescale) => rescale.iter().all(|&r| r == (1.0, 0.0)),
            Modality::Table { .. } => false,
        }
    }
}

/// The Modality LUT Sequence of `object`, if any.
pub(super) fn modality_table(
    object: &InMemDicomObject,
    signed: bool,
    path: &Path,
) -> Result<Option<Modality>> {
    let Some(item) = object
        .get(tags::MODALITY_LUT_SEQUENCE)
        .and_then(|e| e.items())
        .and_then(|items| items.first())
    else {
        return Ok(None);
    };
    let invalid = |what: &str| {
        anyhow!(
            "{}: the Modality LUT Sequence is invalid ({what}); remove it or export the file \
             again",
            path.display()
        )
    };
    let descriptor: [i64; 3] = item
        .get(tags::LUT_DESCRIPTOR)
        .and_then(|e| e.to_multi_int::<i64>().ok())
        .and_then(|d| d.try_into().ok())
        .ok_or_else(|| invalid("LUT Descriptor is not 3 numbers"))?;
    let length = match descriptor[0].rem_euclid(1 << 16) {
        0 => 1 << 16,
        n => n as usize,
    };
    let first = match signed {
        true => i64::from(descriptor[1] as i16),
        false => i64::from(descriptor[1] as u16),
    };
    let bits = u32::try_from(descriptor[2])
        .ok()
        .filter(|b| (1..=16).contains(b))
        .ok_or_else(|| invalid("bits per entry are not 1 to 16"))?;
    let data = item
        .get(tags::LUT_DATA)
        .and_then(|e| e.to_multi_int::<i64>().ok())
        .ok_or_else(|| invalid("LUT Data is missing"))?;
    if data.len() < length {
        let found = data.len();
        return Err(invalid(&format!(
            "{found} entries in LUT Data, {length} described"
        )));
    }
    let mask = (1i64 << bits) - 1;
    Ok(Some(Modality::Table {
        first,
        entries: data[..length].iter().map(|&v| (v & mask) as f64).collect(),
        bits,
    }))
}

/// How one file's decoded frames become values.
pub(super) struct Plan {
    pub(super) colour: Colour,
    pub(super) layout: Layout,
    pub(super) stored: Stored,
    pub(super) modality: Modality,
    pub(super) pixels: usize,
    pub(super) samples_per_frame: usize,
}

impl Plan {
    pub(super) fn new(
        object: &DefaultDicomObject,
        header: &DicomHeader,
        decoded: &DecodedPixelData,
        codec: Codec,
        colour: Colour,
        path: &Path,
    ) -> Result<Self> {
        let shown = path.display();
        let bytes = match decoded.bits_allocated() {
            1 | 8 => 1,
            16 => 2,
            32 => 4,
            other => bail!(
                "{shown}: Bits Allocated {other} is not read here (only 1, 8, 16 and 32); \
                 convert the file with `gdcmconv --raw IN OUT`"
            ),
        };
        let bits = u32::from(decoded.bits_stored());
        let high_bit = u32::from(decoded.high_bit());
        let bits_allocated = (8 * bytes) as u32;
        ensure!(
            (1..=bits_allocated).contains(&bits) && (bits - 1..bits_allocated).contains(&high_bit),
            "{shown}: Bits Stored {bits} and High Bit {high_bit} do not fit in {bits_allocated} \
             allocated bits; the header is corrupt, export the file again"
        );
        let shift = match codec {
            Codec::Native => high_bit + 1 - bits,
            _ => 0,
        };
        let signed = decoded.pixel_representation() == PixelRepresentation::Signed;
        let stored = Stored {
            bytes,
            bits,
            shift,
            signed,
        };
        let planar = integer(object, tags::PLANAR_CONFIGURATION) == Some(1);
        let layout = match (codec, colour, header.photometric.as_str()) {
            (Codec::Native, Colour::Ybr, "YBR_FULL_422") => Layout::PairedYbr,
            (Codec::Native, Colour::Rgb | Colour::Ybr, _) if planar => Layout::Planar,
            _ => Layout::Interleaved,
        };
        let pixels = header.rows * header.columns;
        ensure!(
            layout != Layout::PairedYbr || header.columns.is_multiple_of(2),
            "{shown}: YBR_FULL_422 pixel data with an odd number of columns ({}) is invalid; \
             export the file again",
            header.columns
        );
        let samples_per_frame = match layout {
            Layout::PairedYbr => 2 * pixels,
            _ => colour.channels() * pixels,
        };
        let rescale = decoded
            .rescale()
            .map_err(|e| {
                anyhow!(
                    "{shown}: {}; fix the Rescale Slope and Intercept",
                    causes(&e)
                )
            })?
            .iter()
            .map(|r| (r.slope, r.intercept))
            .collect();
        let modality = modality_table(object, signed, path)?.unwrap_or(Modality::Rescale(rescale));
        Ok(Plan {
            colour,
            layout,
            stored,
            modality,
            pixels,
            samples_per_frame,
        })
    }

    /// The values `[C, H·W]` of frame `frame`, whose samples are `raw`.
    pub(super) fn values(&self, raw: &[u8], frame: usize) -> Vec<f32> {
        let stored = &self.stored;
        match self.colour {
            Colour::Grey => (0..self.pixels)
                .map(|p| self.modality.map(frame, stored.get(raw, p)) as f32)
                .collect(),
            Colour::InvertedGrey => {
                let (lo, hi) = self.modality.range(frame, stored);
                (0..self.pixels)
                    .map(|p| (lo + hi - self.modality.map(frame, stored.get(raw, p))) as f32)
                    .collect()
            }
            Colour::Rgb => (0..3)
                .flat_map(|c| {
                    (0..self.pixels).map(move |p| stored.get(raw, self.index(p, c)) as f32)
                })
                .collect(),
            Colour::Ybr => {
                let mut values = vec![0.0; 3 * self.pixels];
                let max = stored.range().1 as f64;
                let half = (1i64 << (stored.bits - 1)) as f64;
                for p in 0..self.pixels {
                    let [y, cb, cr] = [0, 1, 2].map(|c| stored.get(raw, self.index(p, c)) as f64);
                    let rgb = [
                        y + 1.402 * (cr - half),
                        y - 0.344136 * (cb - half) - 0.714136 * (cr - half),
                        y + 1.772 * (cb - half),
                    ];
                    for (c, v) in rgb.into_iter().enumerate() {
                        values[c * self.pixels + p] = v.round().clamp(0.0, max) as f32;
                    }
                }
                values
            }
        }
    }

    /// The index of sample `c` of pixel `p` in a frame's samples.
    pub(super) fn index(&self, p: usize, c: usize) -> usize {
        match self.layout {
            Layout::Interleaved => p * 3 + c,
            Layout::Planar => c * self.pixels + p,
            Layout::PairedYbr => match c {
                0 => (p / 2) * 4 + p % 2,
                _ => (p / 2) * 4 + 1 + c,
            },
        }
    }

    pub(super) fn type_range(&self) -> Option<(f64, f64)> {
        let unscaled = match self.colour {
            Colour::Grey | Colour::InvertedGrey => self.modality.is_identity(),
            Colour::Rgb | Colour::Ybr => true,
        };
        (unscaled && !self.stored.signed).then(|| (0.0, self.stored.range().1 as f64))
    }
}
