//! NIfTI-1 and NIfTI-2 volumes (`.nii`, `.nii.gz`) as [`Decoded`] arrays `[1, D, H, W]`.
//!
//! Files are recognised by content, not by name: the NIfTI-1 magic `n+1\0` at byte 344, the
//! NIfTI-2 magic `n+2\0` at byte 4, gzip-compressed or not. NIfTI-1 headers are parsed by the
//! `nifti` crate; NIfTI-2 headers (540 bytes, 64-bit dimensions, which that crate does not read)
//! by the small reader here. Both byte orders are read.
//!
//! The voxels keep the file's order, `i` fastest: `W = dim[1]`, `H = dim[2]`, `D = dim[3]`. No
//! reorientation is done (the qform/sform are not applied), so `D` runs along whatever axis the
//! scanner or converter put third, not necessarily inferior to superior.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use flate2::bufread::MultiGzDecoder;
use nifti::{Endianness, NiftiHeader};

use super::Decoded;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const NIFTI1_HEADER_BYTES: usize = 348;
const NIFTI2_HEADER_BYTES: usize = 540;
const NIFTI1_MAGIC_AT: usize = 344;
const NIFTI2_MAGIC_AT: usize = 4;

/// Whether the file at `path` holds a NIfTI-1 or NIfTI-2 header, judged by its content: the
/// magic `n+1\0` or `ni1\0` at byte 344, or `n+2\0` or `ni2\0` at byte 4. A gzip file is
/// inflated for its first 348 bytes only. An unreadable or too short file gives `false`.
///
/// `ni1`/`ni2` (the header of a `.hdr`/`.img` pair) count as NIfTI so that [`read_nifti`] can
/// say how to convert them.
pub fn is_nifti(path: &Path) -> bool {
    let Ok((reader, _)) = open_inflated(path) else {
        return false;
    };
    let mut head = Vec::with_capacity(NIFTI1_HEADER_BYTES);
    // A read error (a cut-short gzip) keeps the bytes read before it, which may hold the magic.
    let _ = reader
        .take(NIFTI1_HEADER_BYTES as u64)
        .read_to_end(&mut head);
    let magic_at = |at: usize| head.get(at..at + 4);
    matches!(magic_at(NIFTI2_MAGIC_AT), Some(b"n+2\0" | b"ni2\0"))
        || matches!(magic_at(NIFTI1_MAGIC_AT), Some(b"n+1\0" | b"ni1\0"))
}

/// Reads a single-file NIfTI-1 or NIfTI-2 volume, `.nii` or `.nii.gz` (gzip is recognised by
/// content), as `[1, D, H, W]` in the file's voxel order (see the module docs: no reorientation).
///
/// - Values: the stored voxels, times `scl_slope` plus `scl_inter` when the slope is finite and
///   non-zero (a non-finite intercept counts as 0) and the pair is not the identity `(1, 0)`.
/// - `spacing`: `[pixdim[3], pixdim[2], pixdim[1]]` in millimetres, converted from metres or
///   micrometres when `xyzt_units` says so (unknown units are taken as millimetres); `None` when
///   any of the three is not a positive finite number.
/// - `type_range`: the stored integer type's range when no scaling was applied; `None` for
///   floats and scaled values.
/// - `format`: e.g. `NIfTI-1, int16, scaled` or `NIfTI-2, float32`.
///
/// A 2-D file (`dim[0] = 2`) reads as a volume of one slice (`D = 1`). Voxel types: `uint8`,
/// `int8`, `int16`, `uint16`, `int32`, `uint32`, `int64`, `uint64` (above 2^24 not exactly
/// representable in `f32`), `float32`, `float64`.
///
/// # Errors
/// Each names the file, what is wrong and what to do: more than one volume (`dim[4..] > 1`),
/// NaN or infinite voxels (with their count), a header of a `.hdr`/`.img` pair, an unsupported
/// voxel type (complex, RGB, float128), a corrupt header, and a file cut short (gzip stream,
/// header or voxel data shorter than `dim` implies).
pub fn read_nifti(path: &Path) -> Result<Decoded> {
    let shown = path.display();
    let (mut reader, gzipped) =
        open_inflated(path).map_err(|e| anyhow!("cannot open NIfTI file {shown}: {e}"))?;
    let read_failed = |e: io::Error| {
        if gzipped {
            anyhow!(
                "{shown}: the gzip stream is corrupt or cut short ({e}); copy or download the \
                 file again"
            )
        } else {
            anyhow!("cannot read {shown}: {e}")
        }
    };

    let mut head = Vec::with_capacity(NIFTI2_HEADER_BYTES);
    read_up_to(&mut reader, NIFTI1_HEADER_BYTES, &mut head).map_err(read_failed)?;
    let header = match head.get(NIFTI2_MAGIC_AT..NIFTI2_MAGIC_AT + 4) {
        Some(b"n+2\0") => {
            read_up_to(&mut reader, NIFTI2_HEADER_BYTES, &mut head).map_err(read_failed)?;
            header_too_short(&head, NIFTI2_HEADER_BYTES, "NIfTI-2", path)?;
            VolumeHeader::from_nifti2(&head, path)?
        }
        Some(b"ni2\0") => bail!(pair_header(path, "NIfTI-2")),
        _ => match head.get(NIFTI1_MAGIC_AT..NIFTI1_MAGIC_AT + 4) {
            Some(b"n+1\0") => VolumeHeader::from_nifti1(&head, path)?,
            Some(b"ni1\0") => bail!(pair_header(path, "NIfTI-1")),
            _ => {
                header_too_short(&head, NIFTI1_HEADER_BYTES, "NIfTI-1", path)?;
                bail!(
                    "{shown} is not a NIfTI file: neither the NIfTI-1 magic `n+1` at byte 344 nor \
                     the NIfTI-2 magic `n+2` at byte 4 is there"
                )
            }
        },
    };

    let (depth, height, width) = header.volume_shape(path)?;
    let voxel = header.voxel_type(path)?;
    let voxels = depth
        .checked_mul(height)
        .and_then(|n| n.checked_mul(width))
        .ok_or_else(|| anyhow!("{shown}: corrupt header: dim = {:?} overflows", header.dim))?;
    let data_bytes = voxels
        .checked_mul(voxel.bytes())
        .ok_or_else(|| anyhow!("{shown}: corrupt header: dim = {:?} overflows", header.dim))?;

    let skip = header.vox_offset.saturating_sub(head.len() as u64);
    let skipped =
        io::copy(&mut reader.by_ref().take(skip), &mut io::sink()).map_err(read_failed)?;
    let mut raw = Vec::new();
    raw.try_reserve_exact(data_bytes).map_err(|_| {
        anyhow!(
            "{shown}: {width} × {height} × {depth} {} voxels ({data_bytes} bytes) do not fit in \
             memory",
            voxel.name()
        )
    })?;
    reader
        .take(data_bytes as u64)
        .read_to_end(&mut raw)
        .map_err(read_failed)?;
    if skipped < skip || raw.len() < data_bytes {
        bail!(
            "{shown} is truncated: its header promises {data_bytes} bytes of voxel data \
             ({width} × {height} × {depth} {}) from byte {}, but the file ends {} bytes short; \
             copy or download it again",
            voxel.name(),
            header.vox_offset,
            (skip - skipped) as usize + data_bytes - raw.len()
        );
    }

    let scaling = header.scaling();
    let values = decode_voxels(&raw, voxel, header.big_endian, scaling);
    let non_finite = values.iter().filter(|v| !v.is_finite()).count();
    if non_finite > 0 {
        bail!(
            "{shown}: {non_finite} of {voxels} voxels are NaN or infinite; replace them with \
             finite values first (e.g. `fslmaths {shown} -nan OUT` sets NaN voxels to 0)"
        );
    }

    let mut format = format!("NIfTI-{}, {}", header.version, voxel.name());
    if scaling.is_some() {
        format.push_str(", scaled");
    }
    Ok(Decoded {
        values,
        shape: vec![1, depth, height, width],
        spacing: header.spacing_mm(),
        type_range: match scaling {
            Some(_) => None,
            None => voxel.range(),
        },
        format,
    })
}

/// Opens `path`, inflating it when its content starts with the gzip magic; the flag says which.
fn open_inflated(path: &Path) -> io::Result<(Box<dyn Read>, bool)> {
    let mut file = BufReader::new(File::open(path)?);
    let gzipped = file.fill_buf()?.starts_with(&GZIP_MAGIC);
    Ok(match gzipped {
        true => (Box::new(MultiGzDecoder::new(file)), true),
        false => (Box::new(file), false),
    })
}

/// Reads from `reader` until `buffer` holds `len` bytes or the input ends.
fn read_up_to(reader: &mut dyn Read, len: usize, buffer: &mut Vec<u8>) -> io::Result<()> {
    let missing = len.saturating_sub(buffer.len()) as u64;
    reader.take(missing).read_to_end(buffer).map(|_| ())
}

fn header_too_short(head: &[u8], needed: usize, version: &str, path: &Path) -> Result<()> {
    if head.len() < needed {
        bail!(
            "{} is truncated: {} bytes, shorter than a {version} header ({needed} bytes); copy or \
             download it again",
            path.display(),
            head.len()
        );
    }
    Ok(())
}

fn pair_header(path: &Path, version: &str) -> String {
    format!(
        "{} is the header of a {version} .hdr/.img pair; only single-file .nii/.nii.gz is read: \
         convert it first, e.g. `fslchfiletype NIFTI_GZ {}`",
        path.display(),
        path.display()
    )
}

/// The header fields the reader needs, from either NIfTI version.
#[derive(Debug)]
struct VolumeHeader {
    version: u8,
    big_endian: bool,
    datatype: i16,
    /// `dim[0]` is the number of dimensions, `dim[1..=dim[0]]` their sizes (i, j, k, t, …).
    dim: [i64; 8],
    pixdim: [f64; 8],
    /// Byte offset of the voxel data from the start of the (inflated) file.
    vox_offset: u64,
    scl_slope: f64,
    scl_inter: f64,
    xyzt_units: i32,
}

impl VolumeHeader {
    /// `head` holds the first 348 bytes, magic `n+1` checked.
    fn from_nifti1(head: &[u8], path: &Path) -> Result<Self> {
        let header = NiftiHeader::from_reader(head).map_err(|e| {
            anyhow!(
                "{}: corrupt NIfTI-1 header ({e}); copy or convert it again",
                path.display()
            )
        })?;
        Ok(Self {
            version: 1,
            big_endian: header.endianness == Endianness::Big,
            datatype: header.datatype,
            // The `nifti` crate reads the C `short` dims as `u16`.
            dim: header.dim.map(|d| i64::from(d as i16)),
            pixdim: header.pixdim.map(f64::from),
            vox_offset: vox_offset(f64::from(header.vox_offset), NIFTI1_HEADER_BYTES, path)?,
            scl_slope: f64::from(header.scl_slope),
            scl_inter: f64::from(header.scl_inter),
            xyzt_units: i32::from(header.xyzt_units),
        })
    }

    /// `head` holds the 540-byte header, magic `n+2` checked. Layout of `nifti2.h`: sizeof_hdr
    /// i32 @0, datatype i16 @12, dim i64[8] @16, pixdim f64[8] @104, vox_offset i64 @168,
    /// scl_slope f64 @176, scl_inter f64 @184, xyzt_units i32 @500.
    fn from_nifti2(head: &[u8], path: &Path) -> Result<Self> {
        let sizeof_hdr: [u8; 4] = field(head, 0);
        let big_endian = match (
            i32::from_le_bytes(sizeof_hdr),
            i32::from_be_bytes(sizeof_hdr),
        ) {
            (540, _) => false,
            (_, 540) => true,
            (little, _) => bail!(
                "{}: corrupt NIfTI-2 header: sizeof_hdr is {little}, not 540; copy or convert it \
                 again",
                path.display()
            ),
        };
        let i64_at = |at: usize| match big_endian {
            true => i64::from_be_bytes(field(head, at)),
            false => i64::from_le_bytes(field(head, at)),
        };
        let f64_at = |at: usize| match big_endian {
            true => f64::from_be_bytes(field(head, at)),
            false => f64::from_le_bytes(field(head, at)),
        };
        let (datatype, xyzt_units) = match big_endian {
            true => (
                i16::from_be_bytes(field(head, 12)),
                i32::from_be_bytes(field(head, 500)),
            ),
            false => (
                i16::from_le_bytes(field(head, 12)),
                i32::from_le_bytes(field(head, 500)),
            ),
        };
        Ok(Self {
            version: 2,
            big_endian,
            datatype,
            dim: std::array::from_fn(|i| i64_at(16 + 8 * i)),
            pixdim: std::array::from_fn(|i| f64_at(104 + 8 * i)),
            vox_offset: vox_offset(i64_at(168) as f64, NIFTI2_HEADER_BYTES, path)?,
            scl_slope: f64_at(176),
            scl_inter: f64_at(184),
            xyzt_units,
        })
    }

    /// `(D, H, W)`, refusing more than one volume.
    fn volume_shape(&self, path: &Path) -> Result<(usize, usize, usize)> {
        let rank = self.dim[0];
        if !(1..=7).contains(&rank) {
            bail!(
                "{}: corrupt header: dim[0] = {rank}, not a number of dimensions from 1 to 7; \
                 copy or convert it again",
                path.display()
            );
        }
        let sizes = &self.dim[1..=rank as usize];
        if let Some(bad) = sizes.iter().position(|&n| n < 1) {
            bail!(
                "{}: corrupt header: dim[{}] = {}, a size must be at least 1; copy or convert it \
                 again",
                path.display(),
                bad + 1,
                sizes[bad]
            );
        }
        if let Some(extra) = sizes.iter().skip(3).position(|&n| n > 1) {
            bail!(
                "{} holds a {rank}-D image of shape {sizes:?} (dim[{}] = {} > 1), not one 3-D \
                 volume; split it into 3-D volumes first, e.g. `fslsplit {}`",
                path.display(),
                extra + 4,
                sizes[extra + 3],
                path.display()
            );
        }
        let size = |axis: usize| -> Result<usize> {
            let n = sizes.get(axis).copied().unwrap_or(1);
            usize::try_from(n).map_err(|_| {
                anyhow!(
                    "{}: corrupt header: dim[{}] = {n} is too large",
                    path.display(),
                    axis + 1
                )
            })
        };
        Ok((size(2)?, size(1)?, size(0)?))
    }

    fn voxel_type(&self, path: &Path) -> Result<VoxelType> {
        VoxelType::from_code(self.datatype).map_err(|unsupported| {
            anyhow!(
                "{}: voxels of type {unsupported} (NIfTI datatype {}) are not supported; convert \
                 it to one real number per voxel first (e.g. the magnitude of complex data, or \
                 one file per RGB channel), as an integer or float type",
                path.display(),
                self.datatype
            )
        })
    }

    /// `(slope, intercept)` when the header asks for a non-identity scaling.
    fn scaling(&self) -> Option<(f64, f64)> {
        let slope = self.scl_slope;
        let inter = if self.scl_inter.is_finite() {
            self.scl_inter
        } else {
            0.0
        };
        let scaled = slope.is_finite() && slope != 0.0 && (slope, inter) != (1.0, 0.0);
        scaled.then_some((slope, inter))
    }

    /// `[slice, row, column]` spacing in millimetres.
    fn spacing_mm(&self) -> Option<Vec<f64>> {
        let to_mm: fn(f64) -> f64 = match self.xyzt_units & 0x07 {
            1 => |metres| metres * 1000.0,
            3 => |micrometres| micrometres / 1000.0,
            _ => |millimetres| millimetres,
        };
        let spacing = [self.pixdim[3], self.pixdim[2], self.pixdim[1]];
        spacing
            .iter()
            .all(|d| d.is_finite() && *d > 0.0)
            .then(|| spacing.iter().map(|&d| to_mm(d)).collect())
    }
}

/// The `N` bytes of `head` at `at` (the header was read to its full length before).
fn field<const N: usize>(head: &[u8], at: usize) -> [u8; N] {
    let mut bytes = [0; N];
    bytes.copy_from_slice(&head[at..at + N]);
    bytes
}

fn vox_offset(offset: f64, header_bytes: usize, path: &Path) -> Result<u64> {
    if !(offset >= header_bytes as f64 && offset < u64::MAX as f64) {
        bail!(
            "{}: corrupt header: vox_offset = {offset}, the voxel data cannot start inside the \
             {header_bytes}-byte header; copy or convert it again",
            path.display()
        );
    }
    Ok(offset as u64)
}

/// The scalar voxel types read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum VoxelType {
    U8,
    I8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

impl VoxelType {
    /// The type of a NIfTI `datatype` code, or the name of an unsupported one.
    fn from_code(code: i16) -> Result<Self, &'static str> {
        Ok(match code {
            2 => Self::U8,
            256 => Self::I8,
            4 => Self::I16,
            512 => Self::U16,
            8 => Self::I32,
            768 => Self::U32,
            1024 => Self::I64,
            1280 => Self::U64,
            16 => Self::F32,
            64 => Self::F64,
            1 => return Err("binary (1 bit)"),
            32 => return Err("complex64"),
            128 => return Err("RGB24"),
            1536 => return Err("float128"),
            1792 => return Err("complex128"),
            2048 => return Err("complex256"),
            2304 => return Err("RGBA32"),
            _ => return Err("unknown"),
        })
    }

    fn bytes(self) -> usize {
        match self {
            Self::U8 | Self::I8 => 1,
            Self::I16 | Self::U16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::U8 => "uint8",
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::U16 => "uint16",
            Self::I32 => "int32",
            Self::U32 => "uint32",
            Self::I64 => "int64",
            Self::U64 => "uint64",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }

    /// The full range of an integer type; `None` for floats.
    fn range(self) -> Option<(f64, f64)> {
        match self {
            Self::U8 => Some((0.0, u8::MAX as f64)),
            Self::I8 => Some((i8::MIN as f64, i8::MAX as f64)),
            Self::I16 => Some((i16::MIN as f64, i16::MAX as f64)),
            Self::U16 => Some((0.0, u16::MAX as f64)),
            Self::I32 => Some((i32::MIN as f64, i32::MAX as f64)),
            Self::U32 => Some((0.0, u32::MAX as f64)),
            Self::I64 => Some((i64::MIN as f64, i64::MAX as f64)),
            Self::U64 => Some((0.0, u64::MAX as f64)),
            Self::F32 | Self::F64 => None,
        }
    }

    /// The value of one voxel given as little-endian bytes, zero-padded to 8.
    fn value(self, le: [u8; 8]) -> f64 {
        let [b0, b1, b2, b3, ..] = le;
        match self {
            Self::U8 => f64::from(b0),
            Self::I8 => f64::from(b0 as i8),
            Self::I16 => f64::from(i16::from_le_bytes([b0, b1])),
            Self::U16 => f64::from(u16::from_le_bytes([b0, b1])),
            Self::I32 => f64::from(i32::from_le_bytes([b0, b1, b2, b3])),
            Self::U32 => f64::from(u32::from_le_bytes([b0, b1, b2, b3])),
            Self::I64 => i64::from_le_bytes(le) as f64,
            Self::U64 => u64::from_le_bytes(le) as f64,
            Self::F32 => f64::from(f32::from_le_bytes([b0, b1, b2, b3])),
            Self::F64 => f64::from_le_bytes(le),
        }
    }
}

/// The voxels of `raw` as `f32`, scaled by `(slope, intercept)` in `f64` when given.
fn decode_voxels(
    raw: &[u8],
    voxel: VoxelType,
    big_endian: bool,
    scaling: Option<(f64, f64)>,
) -> Vec<f32> {
    let size = voxel.bytes();
    raw.chunks_exact(size)
        .map(|stored| {
            let mut le = [0; 8];
            le[..size].copy_from_slice(stored);
            if big_endian {
                le[..size].reverse();
            }
            let value = voxel.value(le);
            match scaling {
                Some((slope, inter)) => (value * slope + inter) as f32,
                None => value as f32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use ndarray::{Array, Array3, Array4};
    use nifti::writer::WriterOptions;
    use std::io::Write;
    use std::path::PathBuf;

    /// `(x, y, z) ↦ x + 10 y + 100 z` over `W = 4, H = 3, D = 2`, indexed `[x, y, z]`.
    fn ramp() -> Array3<i16> {
        Array::from_shape_fn((4, 3, 2), |(x, y, z)| (x + 10 * y + 100 * z) as i16)
    }

    /// `ramp()`'s values in `[D, H, W]` order.
    fn ramp_values() -> Vec<f32> {
        let mut values = Vec::new();
        for z in 0..2 {
            for y in 0..3 {
                for x in 0..4 {
                    values.push((x + 10 * y + 100 * z) as f32);
                }
            }
        }
        values
    }

    fn reference(pixdim: [f32; 3], xyzt_units: u8) -> NiftiHeader {
        NiftiHeader {
            pixdim: [1.0, pixdim[0], pixdim[1], pixdim[2], 1.0, 1.0, 1.0, 1.0],
            xyzt_units,
            ..NiftiHeader::default()
        }
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// Overwrites the little-endian NIfTI-1 `scl_slope` (byte 112) and `scl_inter` (116): the
    /// crate's writer always stores `(1, 0)`.
    fn set_nifti1_scaling(bytes: &mut [u8], slope: f32, inter: f32) {
        bytes[112..116].copy_from_slice(&slope.to_le_bytes());
        bytes[116..120].copy_from_slice(&inter.to_le_bytes());
    }

    /// A single-file NIfTI-2 image: 540-byte header, 4 zero extension bytes, `data` (already in
    /// the chosen byte order).
    fn nifti2_bytes(
        big_endian: bool,
        datatype: i16,
        dim: &[i64],
        pixdim: [f64; 3],
        scaling: (f64, f64),
        xyzt_units: i32,
        data: &[u8],
    ) -> Vec<u8> {
        let mut bytes = vec![0u8; 544];
        let mut put = |at: usize, value: &[u8]| {
            let mut value = value.to_vec();
            if big_endian {
                value.reverse();
            }
            bytes[at..at + value.len()].copy_from_slice(&value);
        };
        put(0, &540i32.to_le_bytes());
        put(12, &datatype.to_le_bytes());
        put(
            14,
            &(8 * VoxelType::from_code(datatype).map_or(1, |t| t.bytes()) as i16).to_le_bytes(),
        );
        put(16, &(dim.len() as i64).to_le_bytes());
        for (i, n) in dim.iter().enumerate() {
            put(24 + 8 * i, &n.to_le_bytes());
        }
        for (i, d) in pixdim.iter().enumerate() {
            put(112 + 8 * i, &d.to_le_bytes());
        }
        put(168, &544i64.to_le_bytes());
        put(176, &scaling.0.to_le_bytes());
        put(184, &scaling.1.to_le_bytes());
        put(500, &xyzt_units.to_le_bytes());
        bytes[4..12].copy_from_slice(b"n+2\0\r\n\x1a\n");
        bytes.extend_from_slice(data);
        bytes
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn message(result: Result<Decoded>) -> String {
        format!("{:#}", result.unwrap_err())
    }

    #[test]
    fn nifti1_int16_with_scaling() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ct.nii");
        let header = reference([0.5, 0.75, 2.5], 2);
        WriterOptions::new(&path)
            .reference_header(&header)
            .write_nifti(&ramp())
            .unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        set_nifti1_scaling(&mut bytes, 2.0, -1024.0);
        std::fs::write(&path, &bytes).unwrap();

        let decoded = read_nifti(&path).unwrap();
        assert_eq!(decoded.shape, vec![1, 2, 3, 4]);
        let expected: Vec<f32> = ramp_values().iter().map(|v| v * 2.0 - 1024.0).collect();
        assert_eq!(decoded.values, expected);
        assert_eq!(decoded.spacing, Some(vec![2.5, 0.75, 0.5]));
        assert_eq!(decoded.type_range, None);
        assert_eq!(decoded.format, "NIfTI-1, int16, scaled");

        // The same bytes gzipped, under a name that does not say so.
        let gz = write(&dir, "ct.bin", &gzip(&bytes));
        assert_eq!(read_nifti(&gz).unwrap(), decoded);
    }

    #[test]
    fn nifti1_gz_uint8_in_micrometres() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cells.nii.gz");
        let header = reference([250.0, 500.0, 2000.0], 3);
        let data = ramp().mapv(|v| v as u8);
        WriterOptions::new(&path)
            .reference_header(&header)
            .write_nifti(&data)
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap()[..2], GZIP_MAGIC);

        let decoded = read_nifti(&path).unwrap();
        assert_eq!(decoded.shape, vec![1, 2, 3, 4]);
        assert_eq!(decoded.values, ramp_values());
        assert_eq!(decoded.spacing, Some(vec![2.0, 0.5, 0.25]));
        assert_eq!(decoded.type_range, Some((0.0, 255.0)));
        assert_eq!(decoded.format, "NIfTI-1, uint8");
    }

    #[test]
    fn nifti1_identity_scaling_keeps_the_type_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t1.nii");
        WriterOptions::new(&path).write_nifti(&ramp()).unwrap();
        let decoded = read_nifti(&path).unwrap();
        assert_eq!(decoded.values, ramp_values());
        assert_eq!(decoded.type_range, Some((-32768.0, 32767.0)));
        assert_eq!(decoded.format, "NIfTI-1, int16");
    }

    #[test]
    fn nifti2_little_endian_uint16_gzipped() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = [0u16, 1, 300, 65535, 7, 8]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bytes = nifti2_bytes(
            false,
            512,
            &[3, 1, 2],
            [0.8, 0.9, 1.5],
            (0.0, 0.0),
            2,
            &data,
        );
        let plain = write(&dir, "pet.nii", &bytes);
        let gz = write(&dir, "pet.nii.gz", &gzip(&bytes));
        for path in [plain, gz] {
            let decoded = read_nifti(&path).unwrap();
            assert_eq!(decoded.shape, vec![1, 2, 1, 3]);
            assert_eq!(decoded.values, vec![0.0, 1.0, 300.0, 65535.0, 7.0, 8.0]);
            assert_eq!(decoded.spacing, Some(vec![1.5, 0.9, 0.8]));
            assert_eq!(decoded.type_range, Some((0.0, 65535.0)));
            assert_eq!(decoded.format, "NIfTI-2, uint16");
        }
    }

    #[test]
    fn nifti2_big_endian_float64_scaled_in_metres() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = [1.5f64, -2.0, 0.25, 4.0]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let bytes = nifti2_bytes(
            true,
            64,
            &[2, 2, 1],
            [0.001, 0.002, 0.003],
            (4.0, 1.0),
            1,
            &data,
        );
        let decoded = read_nifti(&write(&dir, "map.nii", &bytes)).unwrap();
        assert_eq!(decoded.shape, vec![1, 1, 2, 2]);
        assert_eq!(decoded.values, vec![7.0, -7.0, 2.0, 17.0]);
        assert_eq!(decoded.spacing, Some(vec![3.0, 2.0, 1.0]));
        assert_eq!(decoded.type_range, None);
        assert_eq!(decoded.format, "NIfTI-2, float64, scaled");
    }

    #[test]
    fn a_2d_file_is_a_volume_of_one_slice() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = nifti2_bytes(
            false,
            256,
            &[3, 2],
            [1.0, 1.0, 0.0],
            (0.0, 0.0),
            2,
            &[0, 1, 2, 253, 254, 255],
        );
        let decoded = read_nifti(&write(&dir, "slice.nii", &bytes)).unwrap();
        assert_eq!(decoded.shape, vec![1, 1, 2, 3]);
        assert_eq!(decoded.values, vec![0.0, 1.0, 2.0, -3.0, -2.0, -1.0]);
        assert_eq!(decoded.spacing, None);
        assert_eq!(decoded.type_range, Some((-128.0, 127.0)));
    }

    #[test]
    fn a_4d_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bold.nii.gz");
        let series = Array4::<i16>::zeros((4, 3, 2, 5));
        WriterOptions::new(&path).write_nifti(&series).unwrap();
        let shown = path.display();
        assert_eq!(
            message(read_nifti(&path)),
            format!(
                "{shown} holds a 4-D image of shape [4, 3, 2, 5] (dim[4] = 5 > 1), not one 3-D \
                 volume; split it into 3-D volumes first, e.g. `fslsplit {shown}`"
            )
        );

        // A trailing dimension of 1 is still one volume.
        let single = dir.path().join("single.nii");
        WriterOptions::new(&single)
            .write_nifti(&Array4::<i16>::zeros((4, 3, 2, 1)))
            .unwrap();
        assert_eq!(read_nifti(&single).unwrap().shape, vec![1, 2, 3, 4]);
    }

    #[test]
    fn nan_and_infinite_voxels_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.nii");
        let mut map = Array3::<f32>::zeros((2, 2, 2));
        map[[0, 0, 0]] = f32::NAN;
        map[[1, 0, 1]] = f32::NAN;
        map[[1, 1, 1]] = f32::NEG_INFINITY;
        WriterOptions::new(&path).write_nifti(&map).unwrap();
        let shown = path.display();
        assert_eq!(
            message(read_nifti(&path)),
            format!(
                "{shown}: 3 of 8 voxels are NaN or infinite; replace them with finite values first \
                 (e.g. `fslmaths {shown} -nan OUT` sets NaN voxels to 0)"
            )
        );
    }

    #[test]
    fn truncated_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("whole.nii");
        WriterOptions::new(&path).write_nifti(&ramp()).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 352 + 48);

        let cut = write(&dir, "cut.nii", &bytes[..352 + 40]);
        assert_eq!(
            message(read_nifti(&cut)),
            format!(
                "{} is truncated: its header promises 48 bytes of voxel data (4 × 3 × 2 int16) \
                 from byte 352, but the file ends 8 bytes short; copy or download it again",
                cut.display()
            )
        );

        let header_only = write(&dir, "header.nii", &bytes[..200]);
        assert_eq!(
            message(read_nifti(&header_only)),
            format!(
                "{} is truncated: 200 bytes, shorter than a NIfTI-1 header (348 bytes); copy or \
                 download it again",
                header_only.display()
            )
        );

        let gz = gzip(&bytes);
        let cut_gz = write(&dir, "cut.nii.gz", &gz[..gz.len() - 20]);
        assert_eq!(
            message(read_nifti(&cut_gz)),
            format!(
                "{}: the gzip stream is corrupt or cut short (incomplete deflate stream); copy or \
                 download the file again",
                cut_gz.display()
            )
        );
    }

    #[test]
    fn unsupported_voxel_types_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = nifti2_bytes(false, 128, &[1, 1, 1], [1.0; 3], (0.0, 0.0), 2, &[1, 2, 3]);
        let path = write(&dir, "rgb.nii", &bytes);
        assert_eq!(
            message(read_nifti(&path)),
            format!(
                "{}: voxels of type RGB24 (NIfTI datatype 128) are not supported; convert it to \
                 one real number per voxel first (e.g. the magnitude of complex data, or one file \
                 per RGB channel), as an integer or float type",
                path.display()
            )
        );
    }

    #[test]
    fn header_and_image_pairs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pair.hdr");
        WriterOptions::new(&path).write_nifti(&ramp()).unwrap();
        assert!(is_nifti(&path));
        assert_eq!(
            message(read_nifti(&path)),
            format!(
                "{} is the header of a NIfTI-1 .hdr/.img pair; only single-file .nii/.nii.gz is \
                 read: convert it first, e.g. `fslchfiletype NIFTI_GZ {}`",
                path.display(),
                path.display()
            )
        );
    }

    #[test]
    fn is_nifti_sniffs_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let nii = dir.path().join("a.nii");
        WriterOptions::new(&nii).write_nifti(&ramp()).unwrap();
        let bytes = std::fs::read(&nii).unwrap();
        let nifti2 = nifti2_bytes(false, 2, &[1, 1, 1], [1.0; 3], (0.0, 0.0), 2, &[9]);
        for (name, content) in [
            ("a.dat", bytes.clone()),
            ("a.gz", gzip(&bytes)),
            ("b.nii", nifti2.clone()),
            ("b.nii.gz", gzip(&nifti2)),
        ] {
            assert!(is_nifti(&write(&dir, name, &content)), "{name}");
        }
        let not_nifti = write(&dir, "c.nii", &[0u8; 600]);
        assert!(!is_nifti(&not_nifti));
        assert!(!is_nifti(&write(&dir, "empty.nii", &[])));
        assert!(!is_nifti(&write(
            &dir,
            "short.nii.gz",
            &gzip(&bytes[..300])
        )));
        assert!(!is_nifti(&dir.path().join("missing.nii")));
        assert_eq!(
            message(read_nifti(&not_nifti)),
            format!(
                "{} is not a NIfTI file: neither the NIfTI-1 magic `n+1` at byte 344 nor the \
                 NIfTI-2 magic `n+2` at byte 4 is there",
                not_nifti.display()
            )
        );
    }
}
