//! Ordinary image files as [`Decoded`] arrays `[C, H, W]` at their stored precision.
//!
//! The format is recognised by content, not by name. TIFF is read by the `tiff` crate: 8- to
//! 64-bit unsigned and signed integers and 16- to 64-bit floats, any number of samples per
//! pixel (a 5-channel fluorescence image gives `C = 5`), chunky or planar. PNG, JPEG, BMP, PNM
//! and WebP are read by the `image` crate: grey gives `C = 1`, colour `C = 3` (a PNG palette is
//! expanded to RGB), 8- or 16-bit as stored. 1-, 2- and 4-bit grey PNGs are expanded to 8 bits
//! (`0..=255`, type range `(0, 255)`).
//!
//! Alpha is dropped everywhere: PNG grey+alpha and RGBA, TIFF RGBA, and TIFF samples that
//! `ExtraSamples` marks as alpha. Values are the stored numbers (no gamma, colour profile or
//! TIFF `WhiteIsZero` handling beyond the crates'); `spacing` is `None`, since these formats
//! rarely carry a physical pixel size one can trust.
//!
//! A multi-page TIFF becomes one image whose channels are its pages, in page order (the
//! ImageJ/OME habit of one page per channel); the samples of each page come together
//! (`C = pages × samples`). All pages must have the same size, sample type and samples per pixel.
//! Pages after the first that `NewSubfileType` marks as reduced-resolution copies or
//! transparency masks are skipped. A z-stack saved as pages also reads as channels.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use image::codecs::{
    bmp::BmpDecoder, jpeg::JpegDecoder, png::PngDecoder, pnm::PnmDecoder, webp::WebPDecoder,
};
use image::{ColorType, ImageDecoder, ImageError, ImageFormat, ImageResult};
use tiff::decoder::{Decoder as TiffDecoder, DecodingResult, DecodingSampleType};
use tiff::tags::Tag;
use tiff::TiffError;

use super::Decoded;

/// The largest decoded image (or TIFF page) accepted, in bytes.
const MAX_DECODED_BYTES: usize = 4 << 30;
/// `NewSubfileType` bits of pages that are not channels: a reduced-resolution copy, a mask.
const REDUCED_RESOLUTION_OR_MASK: u32 = 0b101;

/// What [`read_raster_header`] tells about an image without decoding its pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct RasterHeader {
    pub width: usize,
    pub height: usize,
    /// `C` of [`read_raster`]'s `[C, H, W]`: alpha dropped, TIFF pages counted.
    pub channels: usize,
    /// Bits per sample as read: 8, 16, 32 or 64.
    pub bits: u16,
    /// Whether the samples are floating point.
    pub float: bool,
    /// The same description as [`Decoded::format`], e.g. `TIFF, uint16, 5 channels`.
    pub format: String,
}

/// Reads an image file as `[C, H, W]` with its stored values (see the module docs for the
/// formats, channels and pages). `type_range` is the integer type's full range (`(0, 65535)` for
/// a 16-bit PNG), `None` for floats; `spacing` is `None`.
///
/// # Errors
/// Naming the file, what is wrong and what to do: content that is none of the formats read, a
/// truncated or corrupt file, an unsupported sample type, colour space or compression, TIFF pages
/// that differ, an image over 4 GiB decoded.
pub fn read_raster(path: &Path) -> Result<Decoded> {
    let container = sniff(path)?;
    let (layout, values) = match container {
        Container::Tiff => read_tiff(path)?,
        _ => read_with_image(path, container)?,
    };
    Ok(Decoded {
        values,
        shape: vec![layout.channels, layout.height, layout.width],
        spacing: None,
        type_range: layout.sample.range(),
        format: layout.format(),
    })
}

/// Reads what [`read_raster`] would return about `path` but its pixels: the header of a PNG,
/// JPEG, BMP or PNM, every page directory of a TIFF. (WebP has no header-only reader in the
/// `image` crate 0.24: it is decoded.)
///
/// # Errors
/// As [`read_raster`], for what the header shows.
pub fn read_raster_header(path: &Path) -> Result<RasterHeader> {
    let container = sniff(path)?;
    let layout = match container {
        Container::Tiff => walk_tiff_pages(path, &mut open_tiff(path)?, |_, _| Ok(()))?,
        Container::Png => image_header(path, container, PngDecoder::new(open(path)?))?,
        Container::Jpeg => image_header(path, container, JpegDecoder::new(open(path)?))?,
        Container::Bmp => image_header(path, container, BmpDecoder::new(open(path)?))?,
        Container::Pnm => image_header(path, container, PnmDecoder::new(open(path)?))?,
        Container::WebP => image_header(path, container, WebPDecoder::new(open(path)?))?,
    };
    Ok(RasterHeader {
        width: layout.width,
        height: layout.height,
        channels: layout.channels,
        bits: layout.sample.bits(),
        float: layout.sample.is_float(),
        format: layout.format(),
    })
}

/// The formats read, as recognised by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Container {
    Tiff,
    Png,
    Jpeg,
    Bmp,
    Pnm,
    WebP,
}

impl Container {
    fn name(self) -> &'static str {
        match self {
            Self::Tiff => "TIFF",
            Self::Png => "PNG",
            Self::Jpeg => "JPEG",
            Self::Bmp => "BMP",
            Self::Pnm => "PNM",
            Self::WebP => "WebP",
        }
    }

    fn image_format(self) -> ImageFormat {
        match self {
            Self::Tiff => ImageFormat::Tiff,
            Self::Png => ImageFormat::Png,
            Self::Jpeg => ImageFormat::Jpeg,
            Self::Bmp => ImageFormat::Bmp,
            Self::Pnm => ImageFormat::Pnm,
            Self::WebP => ImageFormat::WebP,
        }
    }
}

fn open(path: &Path) -> Result<BufReader<File>> {
    File::open(path)
        .map(BufReader::new)
        .map_err(|e| anyhow!("cannot open image {}: {e}", path.display()))
}

fn sniff(path: &Path) -> Result<Container> {
    let mut head = Vec::with_capacity(16);
    open(path)?
        .take(16)
        .read_to_end(&mut head)
        .map_err(|e| anyhow!("cannot read image {}: {e}", path.display()))?;
    let tiff_magics: [&[u8]; 4] = [b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"];
    if tiff_magics.iter().any(|magic| head.starts_with(magic)) {
        return Ok(Container::Tiff);
    }
    match image::guess_format(&head) {
        Ok(ImageFormat::Png) => Ok(Container::Png),
        Ok(ImageFormat::Jpeg) => Ok(Container::Jpeg),
        Ok(ImageFormat::Bmp) => Ok(Container::Bmp),
        Ok(ImageFormat::Pnm) => Ok(Container::Pnm),
        Ok(ImageFormat::WebP) => Ok(Container::WebP),
        Ok(other) => bail!(
            "{} is a {other:?} image, which is not read here; convert it to PNG or TIFF",
            path.display()
        ),
        Err(_) => bail!(
            "{} is not an image read here: by its content it is none of PNG, TIFF, JPEG, BMP, \
             PNM or WebP{}; convert it to PNG or TIFF",
            path.display(),
            if head.is_empty() {
                " (it is empty)"
            } else {
                ""
            }
        ),
    }
}

/// The scalar sample types read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SampleType {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
}

impl SampleType {
    fn from_tiff(sample: DecodingSampleType) -> Self {
        match sample {
            DecodingSampleType::U8 => Self::U8,
            DecodingSampleType::U16 => Self::U16,
            DecodingSampleType::U32 => Self::U32,
            DecodingSampleType::U64 => Self::U64,
            DecodingSampleType::I8 => Self::I8,
            DecodingSampleType::I16 => Self::I16,
            DecodingSampleType::I32 => Self::I32,
            DecodingSampleType::I64 => Self::I64,
            DecodingSampleType::F16 => Self::F16,
            DecodingSampleType::F32 => Self::F32,
            DecodingSampleType::F64 => Self::F64,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::U8 => "uint8",
            Self::U16 => "uint16",
            Self::U32 => "uint32",
            Self::U64 => "uint64",
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }

    fn bits(self) -> u16 {
        match self {
            Self::U8 | Self::I8 => 8,
            Self::U16 | Self::I16 | Self::F16 => 16,
            Self::U32 | Self::I32 | Self::F32 => 32,
            Self::U64 | Self::I64 | Self::F64 => 64,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Self::F16 | Self::F32 | Self::F64)
    }

    /// The full range of an integer type; `None` for floats.
    fn range(self) -> Option<(f64, f64)> {
        match self {
            Self::U8 => Some((0.0, u8::MAX as f64)),
            Self::U16 => Some((0.0, u16::MAX as f64)),
            Self::U32 => Some((0.0, u32::MAX as f64)),
            Self::U64 => Some((0.0, u64::MAX as f64)),
            Self::I8 => Some((i8::MIN as f64, i8::MAX as f64)),
            Self::I16 => Some((i16::MIN as f64, i16::MAX as f64)),
            Self::I32 => Some((i32::MIN as f64, i32::MAX as f64)),
            Self::I64 => Some((i64::MIN as f64, i64::MAX as f64)),
            Self::F16 | Self::F32 | Self::F64 => None,
        }
    }
}

/// The shape and sample type of what is read from one file.
struct Layout {
    container: Container,
    width: usize,
    height: usize,
    channels: usize,
    sample: SampleType,
    /// TIFF pages read as channels.
    pages: usize,
    alpha_dropped: bool,
}

impl Layout {
    /// E.g. `PNG, uint16, 1 channel`, `TIFF, uint16, 3 channels from 3 pages`,
    /// `PNG, uint8, 3 channels, alpha dropped`.
    fn format(&self) -> String {
        let plural = if self.channels == 1 { "" } else { "s" };
        let mut format = format!(
            "{}, {}, {} channel{plural}",
            self.container.name(),
            self.sample.name(),
            self.channels
        );
        if self.pages > 1 {
            format.push_str(&format!(" from {} pages", self.pages));
        }
        if self.alpha_dropped {
            format.push_str(", alpha dropped");
        }
        format
    }
}

fn image_header<'a, D: ImageDecoder<'a>>(
    path: &Path,
    container: Container,
    decoder: ImageResult<D>,
) -> Result<Layout> {
    let decoder = decoder.map_err(|e| image_error(path, container, e))?;
    let (width, height) = decoder.dimensions();
    image_layout(path, container, width, height, decoder.color_type())
}

fn image_layout(
    path: &Path,
    container: Container,
    width: u32,
    height: u32,
    color: ColorType,
) -> Result<Layout> {
    let sample = match color.bytes_per_pixel() / color.channel_count() {
        1 => SampleType::U8,
        2 => SampleType::U16,
        4 => SampleType::F32,
        _ => bail!(
            "{}: {color:?} {} pixels are not read here; convert it to PNG or TIFF",
            path.display(),
            container.name()
        ),
    };
    Ok(Layout {
        container,
        width: width as usize,
        height: height as usize,
        channels: if color.has_color() { 3 } else { 1 },
        sample,
        pages: 1,
        alpha_dropped: color.has_alpha(),
    })
}

fn read_with_image(path: &Path, container: Container) -> Result<(Layout, Vec<f32>)> {
    let mut reader = image::io::Reader::with_format(open(path)?, container.image_format());
    let mut limits = image::io::Limits::default();
    limits.max_alloc = Some(MAX_DECODED_BYTES as u64);
    reader.limits(limits);
    let image = reader
        .decode()
        .map_err(|e| image_error(path, container, e))?;
    let color = image.color();
    let layout = image_layout(path, container, image.width(), image.height(), color)?;
    let pixels = layout.width * layout.height;
    let kept: Vec<usize> = (0..layout.channels).collect();
    let channels = Channels {
        pixels,
        samples_per_pixel: usize::from(color.channel_count()),
        kept: &kept,
        planar: false,
    };
    let mut values = Vec::with_capacity(pixels * layout.channels);
    if let Some(flat) = image.as_flat_samples_u8() {
        channels.append(flat.samples, f32::from, &mut values);
    } else if let Some(flat) = image.as_flat_samples_u16() {
        channels.append(flat.samples, f32::from, &mut values);
    } else if let Some(flat) = image.as_flat_samples_f32() {
        channels.append(flat.samples, |v| v, &mut values);
    }
    Ok((layout, values))
}

fn image_error(path: &Path, container: Container, error: ImageError) -> anyhow::Error {
    let (shown, name) = (path.display(), container.name());
    match error {
        ImageError::Unsupported(e) => {
            anyhow!(
                "{shown}: this kind of {name} is not supported ({e}); convert it to PNG or TIFF"
            )
        }
        ImageError::Limits(e) => anyhow!(
            "{shown}: the {name} image is too large to decode ({e}; the limit is 4 GiB); split \
             it into tiles first"
        ),
        e => anyhow!(
            "{shown} is not a readable {name}: it is truncated or corrupt ({e}); export or copy \
             it again"
        ),
    }
}

fn open_tiff(path: &Path) -> Result<TiffDecoder<BufReader<File>>> {
    let mut limits = tiff::decoder::Limits::default();
    limits.decoding_buffer_size = MAX_DECODED_BYTES;
    TiffDecoder::new(open(path)?)
        .map(|decoder| decoder.with_limits(limits))
        .map_err(|e| tiff_error(path, e))
}

fn tiff_error(path: &Path, error: TiffError) -> anyhow::Error {
    let shown = path.display();
    match error {
        TiffError::UnsupportedError(e) => anyhow!(
            "{shown}: this TIFF uses something not supported here ({e}); save it uncompressed or \
             with LZW or Deflate compression, as grey, RGB or one sample per channel"
        ),
        TiffError::LimitsExceeded => anyhow!(
            "{shown}: a TIFF page is too large to decode (over 4 GiB); split it into tiles first"
        ),
        e => anyhow!(
            "{shown} is not a readable TIFF: it is truncated or corrupt ({e}); export or copy it \
             again"
        ),
    }
}

/// One TIFF page as it will be read.
struct TiffPage {
    width: usize,
    height: usize,
    sample: SampleType,
    /// The indices of the samples of a pixel that become channels (alpha left out).
    kept: Vec<usize>,
    alpha_dropped: bool,
}

impl TiffPage {
    fn describe(&self) -> String {
        let samples = self.kept.len();
        let plural = if samples == 1 { "" } else { "s" };
        format!(
            "{} × {} {} with {samples} channel{plural}",
            self.width,
            self.height,
            self.sample.name()
        )
    }
}

fn tiff_page(path: &Path, decoder: &mut TiffDecoder<BufReader<File>>) -> Result<TiffPage> {
    let shown = path.display();
    let tiff_error = |e| tiff_error(path, e);
    let (width, height) = decoder.dimensions().map_err(tiff_error)?;
    let color = decoder.colortype().map_err(tiff_error)?;
    let bits = color.bit_depth();
    if ![8, 16, 32, 64].contains(&bits) {
        bail!(
            "{shown}: {bits}-bit TIFF samples are not read here; save it with 8-, 16- or 32-bit \
             samples"
        );
    }
    let (kept, alpha_dropped): (Vec<usize>, bool) = match color {
        tiff::ColorType::Gray(_) => (vec![0], false),
        tiff::ColorType::GrayA(_) => (vec![0], true),
        tiff::ColorType::RGB(_) => ((0..3).collect(), false),
        tiff::ColorType::RGBA(_) => ((0..3).collect(), true),
        tiff::ColorType::Multiband { num_samples, .. } => {
            // `ExtraSamples` describes the last samples of a pixel; 1 and 2 are alpha.
            let extra: Vec<u16> = decoder
                .find_tag_unsigned_vec(Tag::ExtraSamples)
                .map_err(tiff_error)?
                .unwrap_or_default();
            let samples = usize::from(num_samples);
            let first_extra = samples.saturating_sub(extra.len());
            let is_alpha = |sample: usize| {
                let code = sample.checked_sub(first_extra).and_then(|i| extra.get(i));
                matches!(code, Some(1 | 2))
            };
            let kept: Vec<usize> = (0..samples).filter(|&s| !is_alpha(s)).collect();
            let alpha_dropped = kept.len() < samples;
            (kept, alpha_dropped)
        }
        other => bail!(
            "{shown}: TIFF pixels in the {other:?} colour space are not read here; save it as \
             grey, RGB or one sample per channel"
        ),
    };
    let layout = decoder.image_buffer_layout().map_err(tiff_error)?;
    let Some(sample) = layout.sample_type.map(SampleType::from_tiff) else {
        bail!(
            "{shown}: TIFF samples of format {:?} are not read here; save it with integer or \
             float samples",
            layout.sample_format
        );
    };
    Ok(TiffPage {
        width: width as usize,
        height: height as usize,
        sample,
        kept,
        alpha_dropped,
    })
}

/// Walks the pages read as channels (see the module docs), checking each against the first, and
/// calls `visit` on each with the decoder positioned on it.
fn walk_tiff_pages(
    path: &Path,
    decoder: &mut TiffDecoder<BufReader<File>>,
    mut visit: impl FnMut(&mut TiffDecoder<BufReader<File>>, &TiffPage) -> Result<()>,
) -> Result<Layout> {
    let first = tiff_page(path, decoder)?;
    visit(decoder, &first)?;
    let (mut page_number, mut pages) = (1, 1);
    while decoder.more_images() {
        decoder.next_image().map_err(|e| tiff_error(path, e))?;
        page_number += 1;
        let subfile_type: u32 = decoder
            .find_tag_unsigned(Tag::NewSubfileType)
            .map_err(|e| tiff_error(path, e))?
            .unwrap_or(0);
        if subfile_type & REDUCED_RESOLUTION_OR_MASK != 0 {
            continue;
        }
        let page = tiff_page(path, decoder)?;
        let shape = |p: &TiffPage| (p.width, p.height, p.sample, p.kept.len());
        if shape(&page) != shape(&first) {
            bail!(
                "{}: page {page_number} is {}, page 1 is {}; the pages of a TIFF are read as the \
                 channels of one image, so they must match: save the pages as separate files",
                path.display(),
                page.describe(),
                first.describe()
            );
        }
        visit(decoder, &page)?;
        pages += 1;
    }
    Ok(Layout {
        container: Container::Tiff,
        width: first.width,
        height: first.height,
        channels: first.kept.len() * pages,
        sample: first.sample,
        pages,
        alpha_dropped: first.alpha_dropped,
    })
}

fn read_tiff(path: &Path) -> Result<(Layout, Vec<f32>)> {
    let mut decoder = open_tiff(path)?;
    let mut values = Vec::new();
    let layout = walk_tiff_pages(path, &mut decoder, |decoder, page| {
        read_tiff_page(path, decoder, page, &mut values)
    })?;
    Ok((layout, values))
}

/// Appends the kept samples of the current page to `values`, channel after channel.
fn read_tiff_page(
    path: &Path,
    decoder: &mut TiffDecoder<BufReader<File>>,
    page: &TiffPage,
    values: &mut Vec<f32>,
) -> Result<()> {
    let shown = path.display();
    let mut result = DecodingResult::U8(Vec::new());
    let layout = decoder
        .read_image_to_buffer(&mut result)
        .map_err(|e| tiff_error(path, e))?;
    if result.as_buffer(0).byte_len() < layout.complete_len {
        bail!(
            "{shown}: a TIFF page is too large to decode (over 4 GiB); split it into tiles first"
        );
    }
    let pixels = page.width * page.height;
    let sample_bytes = usize::from(page.sample.bits() / 8);
    let samples_per_pixel = match pixels {
        0 => 0,
        _ => layout.complete_len / sample_bytes / pixels,
    };
    if samples_per_pixel == 0 || page.kept.iter().any(|&s| s >= samples_per_pixel) {
        bail!(
            "{shown} is not a readable TIFF: a {} page decodes to {} bytes; export or copy it \
             again",
            page.describe(),
            layout.complete_len
        );
    }
    let channels = Channels {
        pixels,
        samples_per_pixel,
        kept: &page.kept,
        planar: layout.planes > 1,
    };
    match &result {
        DecodingResult::U8(s) => channels.append(s, f32::from, values),
        DecodingResult::U16(s) => channels.append(s, f32::from, values),
        DecodingResult::U32(s) => channels.append(s, |v| v as f32, values),
        DecodingResult::U64(s) => channels.append(s, |v| v as f32, values),
        DecodingResult::I8(s) => channels.append(s, f32::from, values),
        DecodingResult::I16(s) => channels.append(s, f32::from, values),
        DecodingResult::I32(s) => channels.append(s, |v| v as f32, values),
        DecodingResult::I64(s) => channels.append(s, |v| v as f32, values),
        DecodingResult::F16(s) => channels.append(s, |v| v.to_f32(), values),
        DecodingResult::F32(s) => channels.append(s, |v| v, values),
        DecodingResult::F64(s) => channels.append(s, |v| v as f32, values),
    }
    Ok(())
}

/// Where the channels kept are in a decoded sample buffer.
struct Channels<'a> {
    pixels: usize,
    samples_per_pixel: usize,
    /// The samples of a pixel that become channels, in order.
    kept: &'a [usize],
    /// One plane per sample rather than the samples of each pixel together.
    planar: bool,
}

impl Channels<'_> {
    /// Appends the kept samples of `samples` to `out` as `[C, H, W]`.
    fn append<T: Copy>(&self, samples: &[T], to_f32: impl Fn(T) -> f32, out: &mut Vec<f32>) {
        let pixels = self.pixels;
        for &sample in self.kept {
            let values = samples.iter().copied().map(&to_f32);
            match self.planar {
                true => out.extend(values.skip(sample * pixels).take(pixels)),
                false => {
                    let stride = self.samples_per_pixel.max(1);
                    out.extend(values.skip(sample).step_by(stride).take(pixels))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::Channels16;
    use super::*;
    use image::{ImageBuffer, Luma, Rgb, Rgba};
    use std::path::PathBuf;
    use tiff::encoder::colortype::{Gray16, Gray32Float, GrayI16};
    use tiff::encoder::TiffEncoder;
    use tiff::tags::ExtraSamples;

    fn message<T: std::fmt::Debug>(result: Result<T>) -> String {
        format!("{:#}", result.unwrap_err())
    }

    fn tiff_file(dir: &tempfile::TempDir, name: &str) -> (PathBuf, File) {
        let path = dir.path().join(name);
        let file = File::create(&path).unwrap();
        (path, file)
    }

    #[test]
    fn png_16_bit_grey_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        // Content decides, not the name.
        let path = dir.path().join("grey16.tif");
        let values = [0u16, 255, 256, 1000, 40000, 65535];
        ImageBuffer::<Luma<u16>, _>::from_raw(3, 2, values.to_vec())
            .unwrap()
            .save_with_format(&path, ImageFormat::Png)
            .unwrap();

        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![1, 2, 3]);
        assert_eq!(decoded.values, values.map(f32::from).to_vec());
        assert_eq!(decoded.type_range, Some((0.0, 65535.0)));
        assert_eq!(decoded.spacing, None);
        assert_eq!(decoded.format, "PNG, uint16, 1 channel");
        assert_eq!(
            read_raster_header(&path).unwrap(),
            RasterHeader {
                width: 3,
                height: 2,
                channels: 1,
                bits: 16,
                float: false,
                format: "PNG, uint16, 1 channel".into(),
            }
        );
    }

    #[test]
    fn png_16_bit_rgb_is_channels_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rgb16.png");
        // Pixel p = (r, g, b) = (p, 1000 + p, 60000 + p), 2 × 2.
        let image = ImageBuffer::from_fn(2, 2, |x, y| {
            let p = (x + 2 * y) as u16;
            Rgb([p, 1000 + p, 60000 + p])
        });
        image.save(&path).unwrap();

        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![3, 2, 2]);
        let expected = [
            0., 1., 2., 3., 1000., 1001., 1002., 1003., 60000., 60001., 60002., 60003.,
        ];
        assert_eq!(decoded.values, expected);
        assert_eq!(decoded.format, "PNG, uint16, 3 channels");
        let header = read_raster_header(&path).unwrap();
        assert_eq!((header.channels, header.bits), (3, 16));
    }

    #[test]
    fn png_alpha_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rgba.png");
        ImageBuffer::from_pixel(2, 1, Rgba([10u8, 20, 30, 128]))
            .save(&path)
            .unwrap();
        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![3, 1, 2]);
        assert_eq!(decoded.values, vec![10., 10., 20., 20., 30., 30.]);
        assert_eq!(decoded.type_range, Some((0.0, 255.0)));
        assert_eq!(decoded.format, "PNG, uint8, 3 channels, alpha dropped");
        assert_eq!(read_raster_header(&path).unwrap().channels, 3);
    }

    #[test]
    fn tiff_with_five_samples_per_pixel() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = tiff_file(&dir, "cells.tif");
        // Pixel p, sample s = 1000 s + p, 3 × 2.
        let data: Vec<u16> = (0..6u16)
            .flat_map(|p| (0..5u16).map(move |s| 1000 * s + p))
            .collect();
        let mut encoder = TiffEncoder::new(file).unwrap();
        encoder.write_image::<Channels16<5>>(3, 2, &data).unwrap();
        drop(encoder);

        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![5, 2, 3]);
        let expected: Vec<f32> = (0..5)
            .flat_map(|s| (0..6).map(move |p| (1000 * s + p) as f32))
            .collect();
        assert_eq!(decoded.values, expected);
        assert_eq!(decoded.type_range, Some((0.0, 65535.0)));
        assert_eq!(decoded.format, "TIFF, uint16, 5 channels");
        assert_eq!(
            read_raster_header(&path).unwrap(),
            RasterHeader {
                width: 3,
                height: 2,
                channels: 5,
                bits: 16,
                float: false,
                format: "TIFF, uint16, 5 channels".into(),
            }
        );
    }

    #[test]
    fn tiff_alpha_extra_sample_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = tiff_file(&dir, "masked.tif");
        let mut encoder = TiffEncoder::new(file).unwrap();
        let mut image = encoder.new_image::<Gray16>(2, 1).unwrap();
        image
            .extra_samples(&[ExtraSamples::UnassociatedAlpha])
            .unwrap();
        image.write_data(&[500, 65535, 700, 0]).unwrap();
        drop(encoder);

        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![1, 1, 2]);
        assert_eq!(decoded.values, vec![500.0, 700.0]);
        assert_eq!(decoded.format, "TIFF, uint16, 1 channel, alpha dropped");
    }

    #[test]
    fn tiff_pages_become_channels() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = tiff_file(&dir, "stack.tif");
        let mut encoder = TiffEncoder::new(file).unwrap();
        for page in 0..3u16 {
            let data: Vec<u16> = (0..4).map(|p| 20000 * page + p).collect();
            encoder.write_image::<Gray16>(2, 2, &data).unwrap();
        }
        // A reduced-resolution copy, as pyramidal writers append: skipped.
        let mut thumbnail = encoder.new_image::<Gray16>(1, 1).unwrap();
        thumbnail
            .encoder()
            .write_tag(Tag::NewSubfileType, 1u32)
            .unwrap();
        thumbnail.write_data(&[7]).unwrap();
        drop(encoder);

        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![3, 2, 2]);
        let expected: Vec<f32> = (0..3)
            .flat_map(|c| (0..4).map(move |p| (20000 * c + p) as f32))
            .collect();
        assert_eq!(decoded.values, expected);
        assert_eq!(decoded.format, "TIFF, uint16, 3 channels from 3 pages");
        let header = read_raster_header(&path).unwrap();
        assert_eq!((header.width, header.height, header.channels), (2, 2, 3));
    }

    #[test]
    fn tiff_pages_of_different_sizes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = tiff_file(&dir, "mixed.tif");
        let mut encoder = TiffEncoder::new(file).unwrap();
        encoder.write_image::<Gray16>(2, 2, &[0; 4]).unwrap();
        encoder.write_image::<Gray16>(3, 1, &[0; 3]).unwrap();
        drop(encoder);
        let expected = format!(
            "{}: page 2 is 3 × 1 uint16 with 1 channel, page 1 is 2 × 2 uint16 with 1 channel; \
             the pages of a TIFF are read as the channels of one image, so they must match: save \
             the pages as separate files",
            path.display()
        );
        assert_eq!(message(read_raster(&path)), expected);
        assert_eq!(message(read_raster_header(&path)), expected);
    }

    #[test]
    fn tiff_float32_and_int16() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = tiff_file(&dir, "phase.tiff");
        let data = [-1.5f32, 0.0, 3.25, 1e-7, 12345.678, -0.001];
        TiffEncoder::new(file)
            .unwrap()
            .write_image::<Gray32Float>(3, 2, &data)
            .unwrap();
        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![1, 2, 3]);
        assert_eq!(decoded.values, data);
        assert_eq!(decoded.type_range, None);
        assert_eq!(decoded.format, "TIFF, float32, 1 channel");
        let header = read_raster_header(&path).unwrap();
        assert_eq!((header.bits, header.float), (32, true));

        let (path, file) = tiff_file(&dir, "signed.tif");
        TiffEncoder::new(file)
            .unwrap()
            .write_image::<GrayI16>(2, 1, &[-32768, 32767])
            .unwrap();
        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.values, vec![-32768.0, 32767.0]);
        assert_eq!(decoded.type_range, Some((-32768.0, 32767.0)));
        assert_eq!(decoded.format, "TIFF, int16, 1 channel");
    }

    #[test]
    fn tiff_planar_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = tiff_file(&dir, "planar.tif");
        let mut encoder = TiffEncoder::new(file).unwrap();
        let mut directory = encoder.image_directory().unwrap();
        let planes: [&[u16]; 2] = [&[1, 2, 3, 4, 5, 6], &[601, 602, 603, 604, 605, 606]];
        let offsets: Vec<u32> = planes
            .iter()
            .map(|plane| directory.write_data(*plane).unwrap() as u32)
            .collect();
        directory.write_tag(Tag::ImageWidth, 3u32).unwrap();
        directory.write_tag(Tag::ImageLength, 2u32).unwrap();
        directory
            .write_tag(Tag::BitsPerSample, &[16u16, 16][..])
            .unwrap();
        directory.write_tag(Tag::Compression, 1u16).unwrap();
        directory
            .write_tag(Tag::PhotometricInterpretation, 1u16)
            .unwrap();
        directory
            .write_tag(Tag::StripOffsets, &offsets[..])
            .unwrap();
        directory.write_tag(Tag::SamplesPerPixel, 2u16).unwrap();
        directory.write_tag(Tag::RowsPerStrip, 2u32).unwrap();
        directory
            .write_tag(Tag::StripByteCounts, &[12u32, 12][..])
            .unwrap();
        directory.write_tag(Tag::PlanarConfiguration, 2u16).unwrap();
        directory
            .write_tag(Tag::SampleFormat, &[1u16, 1][..])
            .unwrap();
        directory.finish().unwrap();
        drop(encoder);

        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![2, 2, 3]);
        assert_eq!(
            decoded.values,
            [1., 2., 3., 4., 5., 6., 601., 602., 603., 604., 605., 606.]
        );
        assert_eq!(decoded.format, "TIFF, uint16, 2 channels");
    }

    #[test]
    fn jpeg_8_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("photo.jpg");
        // Flat 8 × 8 blocks survive JPEG's quantisation exactly.
        ImageBuffer::from_fn(16, 8, |x, _| Luma([if x < 8 { 64u8 } else { 192 }]))
            .save(&path)
            .unwrap();
        let decoded = read_raster(&path).unwrap();
        assert_eq!(decoded.shape, vec![1, 8, 16]);
        let row = [[64.0f32; 8], [192.0; 8]].concat();
        assert_eq!(decoded.values, row.repeat(8));
        assert_eq!(decoded.type_range, Some((0.0, 255.0)));
        assert_eq!(decoded.format, "JPEG, uint8, 1 channel");
        assert_eq!(
            read_raster_header(&path).unwrap(),
            RasterHeader {
                width: 16,
                height: 8,
                channels: 1,
                bits: 8,
                float: false,
                format: "JPEG, uint8, 1 channel".into(),
            }
        );
    }

    #[test]
    fn truncated_and_unknown_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("whole.png");
        ImageBuffer::from_fn(32, 32, |x, y| Luma([(x * 7 + y * 13) as u16 * 100]))
            .save(&path)
            .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.png");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        assert_eq!(
            message(read_raster(&cut)),
            format!(
                "{} is not a readable PNG: it is truncated or corrupt (unexpected end of file); \
                 export or copy it again",
                cut.display()
            )
        );

        let (tiff_path, file) = tiff_file(&dir, "whole.tif");
        TiffEncoder::new(file)
            .unwrap()
            .write_image::<Gray16>(64, 64, &[9; 4096])
            .unwrap();
        let tiff_bytes = std::fs::read(&tiff_path).unwrap();
        let cut_tiff = dir.path().join("cut.tif");
        std::fs::write(&cut_tiff, &tiff_bytes[..tiff_bytes.len() / 2]).unwrap();
        let expected = format!(
            "{} is not a readable TIFF: it is truncated or corrupt (failed to fill whole buffer); \
             export or copy it again",
            cut_tiff.display()
        );
        assert_eq!(message(read_raster(&cut_tiff)), expected);
        // The encoder writes the page directory after the pixels: gone with the second half.
        assert_eq!(message(read_raster_header(&cut_tiff)), expected);

        let notes = dir.path().join("notes.png");
        std::fs::write(&notes, "not an image at all").unwrap();
        assert_eq!(
            message(read_raster(&notes)),
            format!(
                "{} is not an image read here: by its content it is none of PNG, TIFF, JPEG, BMP, \
                 PNM or WebP; convert it to PNG or TIFF",
                notes.display()
            )
        );
    }
}
