//! NumPy `.npy` arrays and `.npz` archives of them (`docs/spec/data.md` §1.2).
//!
//! An `.npy` is the magic `\x93NUMPY`, a version, a little-endian header length (`u16` in
//! v1.0, `u32` in v2.0/v3.0), an ASCII dict literal such as
//! `{'descr': '|u1', 'fortran_order': False, 'shape': (89996, 28, 28, 3), }` and the raw C-order
//! bytes. An `.npz` is a ZIP (ZIP64 for members over 4 GiB) of `.npy` members, stored or
//! DEFLATE-compressed; the `zip` crate finds them through the central directory and inflates
//! them as a stream, and every member read is checked against its CRC-32 there.

use std::fs::File;
use std::io::{BufReader, Read, Seek, Write};
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

/// Element types found in MedMNIST files (labels may be wider than images), and `f32` arrays
/// (golden test data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    U8,
    I32,
    I64,
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 => 8,
        }
    }

    fn parse(descr: &str) -> Result<Self> {
        Ok(match descr {
            "|u1" | "<u1" | "u1" => Dtype::U8,
            "<i4" => Dtype::I32,
            "<i8" => Dtype::I64,
            "<f4" => Dtype::F32,
            other => bail!("unsupported dtype `{other}` (expected |u1, <i4, <i8 or <f4)"),
        })
    }

    fn descr(self) -> &'static str {
        match self {
            Dtype::U8 => "|u1",
            Dtype::I32 => "<i4",
            Dtype::I64 => "<i8",
            Dtype::F32 => "<f4",
        }
    }
}

/// An `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl NpyHeader {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the array data.
    pub fn data_bytes(&self) -> usize {
        self.len() * self.dtype.size()
    }
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Reads an `.npy` header, leaving `r` at the first data byte.
pub fn read_header(r: &mut impl Read) -> Result<NpyHeader> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)
        .context("truncated .npy: no header")?;
    ensure!(
        &magic[..6] == MAGIC,
        "not a .npy array (the magic bytes \\x93NUMPY are missing)"
    );
    let header_len = match magic[6] {
        1 => {
            let mut len = [0u8; 2];
            r.read_exact(&mut len)?;
            u16::from_le_bytes(len) as usize
        }
        2 | 3 => {
            let mut len = [0u8; 4];
            r.read_exact(&mut len)?;
            u32::from_le_bytes(len) as usize
        }
        v => bail!(".npy format version {v} is not supported (1, 2 or 3)"),
    };
    let mut text = vec![0u8; header_len];
    r.read_exact(&mut text)
        .context("truncated .npy: the header ends early")?;
    let text = String::from_utf8(text).context(".npy header is not UTF-8")?;
    parse_dict(&text)
}

/// The `descr`, `fortran_order` and `shape` entries of the header's dict literal.
fn parse_dict(text: &str) -> Result<NpyHeader> {
    let value_of = |key: &str| -> Result<&str> {
        let quoted = [format!("'{key}'"), format!("\"{key}\"")];
        let at = quoted
            .iter()
            .find_map(|q| text.find(q.as_str()).map(|i| i + q.len()))
            .with_context(|| format!(".npy header lacks `{key}`: {text:?}"))?;
        let rest = text[at..].trim_start();
        rest.strip_prefix(':')
            .map(str::trim_start)
            .with_context(|| format!(".npy header: no value for `{key}`"))
    };
    let descr = value_of("descr")?;
    let descr = descr
        .strip_prefix(['\'', '"'])
        .and_then(|d| d.split(['\'', '"']).next())
        .context(".npy header: `descr` is not a string")?;
    ensure!(
        !value_of("fortran_order")?.starts_with("True"),
        "Fortran-ordered .npy arrays are not supported (MedMNIST writes C order)"
    );
    let shape = value_of("shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .context(".npy header: `shape` is not a tuple")?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .with_context(|| format!(".npy header: bad shape ({inner})"))?;
    Ok(NpyHeader {
        dtype: Dtype::parse(descr)?,
        shape,
    })
}

/// The data bytes of one array of [`write_npz`] (`header.data_bytes()` little-endian bytes):
/// held in memory, or written in order by a function, so that an array larger than memory
/// allows need never be held whole.
pub enum NpyData<'a> {
    Bytes(std::borrow::Cow<'a, [u8]>),
    Writer(WriteBytes<'a>),
}

/// A function that writes an array's data bytes, in order, into the writer it is given.
pub type WriteBytes<'a> = Box<dyn FnMut(&mut dyn Write) -> Result<()> + 'a>;

/// A writer that counts the bytes through it.
pub(crate) struct Counted<W> {
    pub(crate) inner: W,
    pub(crate) bytes: usize,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a v1.0 `.npy` of `data`, the header padded so the data starts at a multiple of 64
/// bytes, as NumPy does; `what` names the array in errors.
fn write_npy(w: &mut impl Write, what: &str, header: &NpyHeader, data: NpyData) -> Result<()> {
    let shape = match header.shape.as_slice() {
        [one] => format!("({one},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        header.dtype.descr()
    );
    let unpadded = MAGIC.len() + 2 + 2 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    w.write_all(MAGIC)?;
    w.write_all(&[1, 0])?;
    w.write_all(&(dict.len() as u16).to_le_bytes())?;
    w.write_all(dict.as_bytes())?;
    let mut counted = Counted { inner: w, bytes: 0 };
    match data {
        NpyData::Bytes(bytes) => counted.write_all(&bytes)?,
        NpyData::Writer(mut write) => write(&mut counted)?,
    }
    ensure!(
        counted.bytes == header.data_bytes(),
        "{what}: {} data bytes for shape {:?} of {:?}, which needs {}",
        counted.bytes,
        header.shape,
        header.dtype,
        header.data_bytes()
    );
    Ok(())
}

/// An open `.npz` archive.
pub struct Npz {
    archive: zip::ZipArchive<BufReader<File>>,
    path: std::path::PathBuf,
    /// The file's length in bytes.
    len: u64,
    /// What to do about a corrupt file, ending every error that finds one.
    fix: String,
}

impl Npz {
    /// Opens `path`, reading the ZIP central directory; `fix` says what to do when the file
    /// turns out to be truncated or corrupt, now or when a member is read (e.g. the command
    /// that downloads it again).
    pub fn open(path: &Path, fix: &str) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        let archive = zip::ZipArchive::new(BufReader::new(file)).with_context(|| {
            format!(
                "{} is not a valid .npz (ZIP) archive: the file is truncated or corrupt; {fix}",
                path.display()
            )
        })?;
        Ok(Self {
            archive,
            path: path.to_path_buf(),
            len,
            fix: fix.to_string(),
        })
    }

    /// The array names (member names without `.npy`), sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .archive
            .file_names()
            .filter_map(|n| n.ok())
            .map(|n| n.strip_suffix(".npy").unwrap_or(&n).to_string())
            .collect();
        names.sort();
        names
    }

    /// A text naming the archive's content, from its central directory alone (nothing is
    /// inflated): the file's length and each member's name, CRC-32, stored and inflated size.
    /// Replacing any member changes its CRC-32 or sizes (barring a contrived CRC collision), so
    /// a cache made from the members is keyed by this; bytes damaged on disk leave the directory
    /// as it was and fail the CRC check of [`Npz::stream`] instead.
    pub fn content_key(&self) -> String {
        let mut key = format!("{} bytes\n", self.len);
        for entry in (0..self.archive.len()).filter_map(|i| self.archive.by_index_data(i).ok()) {
            key.push_str(&format!(
                "{} crc32 {:08x}, {} bytes stored, {} inflated\n",
                String::from_utf8_lossy(entry.name_raw()),
                entry.crc32(),
                entry.compressed_size(),
                entry.size()
            ));
        }
        key
    }

    /// Streams array `name` (inflating it when compressed): its header, then `sink` is called
    /// with consecutive chunks of its data bytes, `data_bytes()` in all. The member is read to
    /// its end and its CRC-32 checked against the central directory's, so a corrupt member is
    /// an error naming the file, the member and the fix; as that is known only at the end,
    /// whatever `sink` made of the chunks must then be thrown away.
    pub fn stream(
        &mut self,
        name: &str,
        mut sink: impl FnMut(&NpyHeader, &[u8]) -> Result<()>,
    ) -> Result<NpyHeader> {
        let member = format!("{name}.npy");
        let path = self.path.display().to_string();
        let names = self.names().join(", ");
        let fix = self.fix.as_str();
        let file = self
            .archive
            .by_name(&member)
            .with_context(|| format!("{path} has no array `{name}` (it holds: {names})"))?;
        let (stored, size) = (file.crc32(), file.size());
        let mut file = Checked {
            inner: file,
            crc: flate2::Crc::new(),
            read: 0,
        };
        let corrupt = |what: String| format!("{path}: member {member} {what}; {fix}");
        // A header that does not parse is most likely damage, which the CRC check names.
        let header = match read_header(&mut file) {
            Ok(header) => header,
            Err(e) => {
                check_to_end(&mut file, stored, size, &corrupt)?;
                return Err(e.context(format!("{path}: array `{name}`")));
            }
        };
        let mut left = header.data_bytes();
        let mut buffer = vec![0u8; 1 << 20];
        while left > 0 {
            let want = left.min(buffer.len());
            file.read_exact(&mut buffer[..want]).with_context(|| {
                corrupt(format!(
                    "cannot be read to the end of its data ({left} of {} bytes left, shape \
                     {:?}): the file is truncated or corrupt",
                    header.data_bytes(),
                    header.shape
                ))
            })?;
            sink(&header, &buffer[..want])?;
            left -= want;
        }
        check_to_end(&mut file, stored, size, &corrupt)?;
        Ok(header)
    }

    /// The header of array `name` alone (its data is not read, so its CRC-32 is not checked
    /// here: [`Npz::stream`] checks it when the data is read).
    pub fn header(&mut self, name: &str) -> Result<NpyHeader> {
        let member = format!("{name}.npy");
        let names = self.names().join(", ");
        let path = self.path.display().to_string();
        let mut file = self
            .archive
            .by_name(&member)
            .with_context(|| format!("{path} has no array `{name}` (it holds: {names})"))?;
        read_header(&mut file).with_context(|| {
            format!(
                "{path}: the header of array `{name}` does not parse; {}",
                self.fix
            )
        })
    }

    /// Array `name` read whole: its header and data bytes.
    pub fn read(&mut self, name: &str) -> Result<(NpyHeader, Vec<u8>)> {
        let mut data = Vec::new();
        let header = self.stream(name, |h, chunk| {
            if data.is_empty() {
                data.reserve_exact(h.data_bytes());
            }
            data.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok((header, data))
    }
}

/// A reader that keeps the CRC-32 and the count of the bytes read through it.
struct Checked<R> {
    inner: R,
    crc: flate2::Crc,
    read: u64,
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// Reads the rest of a member to its end through `file` and, once its declared `size` was read,
/// checks the CRC-32 of every byte against `stored`, the central directory's (the `zip` crate
/// checks it too at the end, with an error that names neither file nor member); `corrupt`
/// words the error.
fn check_to_end<R: Read>(
    file: &mut Checked<R>,
    stored: u32,
    size: u64,
    corrupt: &dyn Fn(String) -> String,
) -> Result<()> {
    let rest = std::io::copy(file, &mut std::io::sink());
    let computed = file.crc.sum();
    ensure!(
        file.read != size || computed == stored,
        corrupt(format!(
            "fails its CRC-32 check (stored {stored:08x}, computed {computed:08x}): the file is \
             corrupt"
        ))
    );
    let what = format!(
        "cannot be read to its end ({} of {size} bytes read): the file is truncated or corrupt",
        file.read
    );
    rest.with_context(|| corrupt(what.clone()))?;
    ensure!(file.read == size, corrupt(what));
    Ok(())
}

/// Writes an `.npz` of `arrays` (name, header, data), DEFLATE-compressed like
/// `np.savez_compressed` when `compress`, else stored.
pub fn write_npz(
    w: impl Write + Seek,
    arrays: Vec<(&str, NpyHeader, NpyData)>,
    compress: bool,
) -> Result<()> {
    let mut zip = zip::ZipWriter::new(w);
    let method = match compress {
        true => zip::CompressionMethod::Deflated,
        false => zip::CompressionMethod::Stored,
    };
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(method)
        .large_file(true);
    for (name, header, data) in arrays {
        zip.start_file(format!("{name}.npy"), options)?;
        write_npy(&mut zip, name, &header, data)?;
    }
    zip.finish()?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The fix the tests' archives are opened with.
    const FIX: &str = "fetch it anew";

    #[test]
    fn headers_parse_in_every_version_and_quoting() -> Result<()> {
        let dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 28, 28, 3), }";
        let mut bytes = MAGIC.to_vec();
        bytes.extend([2, 0]);
        bytes.extend((dict.len() as u32).to_le_bytes());
        bytes.extend(dict.as_bytes());
        let header = read_header(&mut bytes.as_slice())?;
        assert_eq!(header.shape, [3, 28, 28, 3]);
        assert_eq!(header.dtype, Dtype::U8);
        let h = parse_dict("{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (5,)}")?;
        assert_eq!((h.dtype, h.shape), (Dtype::I64, vec![5]));
        let scalar = parse_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (), }")?;
        assert_eq!(scalar.shape, Vec::<usize>::new());
        Ok(())
    }

    #[test]
    fn bad_headers_are_clear_errors() {
        let err = |text: &str| format!("{:#}", parse_dict(text).unwrap_err());
        assert!(err("{'descr': '<f8', 'fortran_order': False, 'shape': (2,)}").contains("<f8"));
        assert!(err("{'descr': '|u1', 'fortran_order': True, 'shape': (2,)}").contains("Fortran"));
        assert!(err("{'descr': '|u1', 'fortran_order': False}").contains("shape"));
        let e = read_header(&mut b"PK\x03\x04 not npy".as_slice()).unwrap_err();
        assert!(format!("{e:#}").contains("magic"));
    }

    #[test]
    fn npz_round_trip_stored_and_deflated() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let images: Vec<u8> = (0..2 * 4 * 4).map(|v| v as u8).collect();
        let labels: Vec<u8> = (0..8).flat_map(|v: i64| v.to_le_bytes()).collect();
        let arrays = || {
            vec![
                (
                    "x",
                    NpyHeader {
                        dtype: Dtype::U8,
                        shape: vec![2, 4, 4],
                    },
                    NpyData::Bytes(images.as_slice().into()),
                ),
                (
                    "y",
                    NpyHeader {
                        dtype: Dtype::I64,
                        shape: vec![8, 1],
                    },
                    NpyData::Writer(Box::new(|w| {
                        // In two writes: the sizes add up across calls.
                        let (first, rest) = labels.split_at(3);
                        w.write_all(first)?;
                        Ok(w.write_all(rest)?)
                    })),
                ),
            ]
        };
        for compress in [false, true] {
            let path = dir.path().join(format!("a{compress}.npz"));
            write_npz(File::create(&path)?, arrays(), compress)?;
            let mut npz = Npz::open(&path, FIX)?;
            assert_eq!(npz.names(), ["x", "y"]);
            let (h, data) = npz.read("x")?;
            assert_eq!(
                (h.shape.as_slice(), data.as_slice()),
                ([2, 4, 4].as_slice(), images.as_slice())
            );
            assert_eq!(npz.read("y")?.1, labels);
            let missing = format!("{:#}", npz.read("z").unwrap_err());
            assert!(
                missing.contains("no array `z`") && missing.contains("x, y"),
                "{missing}"
            );
        }
        Ok(())
    }

    #[test]
    fn truncated_and_foreign_files_are_clear_errors() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("a.npz");
        let data = vec![7u8; 5000];
        let header = NpyHeader {
            dtype: Dtype::U8,
            shape: vec![5000],
        };
        let x = NpyData::Bytes(data.as_slice().into());
        write_npz(File::create(&path)?, vec![("x", header.clone(), x)], false)?;
        let short = NpyData::Writer(Box::new(|w| Ok(w.write_all(&data[..10])?)));
        let e = format!(
            "{:#}",
            write_npz(tempfile::tempfile()?, vec![("x", header, short)], false).unwrap_err()
        );
        assert!(
            e.contains("x: 10 data bytes") && e.contains("needs 5000"),
            "{e}"
        );
        let bytes = std::fs::read(&path)?;
        std::fs::write(&path, &bytes[..bytes.len() / 2])?;
        let e = format!(
            "{:#}",
            Npz::open(&path, FIX).err().expect("a truncated archive")
        );
        assert!(e.contains("not a valid .npz") && e.contains(FIX), "{e}");
        std::fs::write(&path, b"hello")?;
        assert!(Npz::open(&path, FIX).is_err());
        let e = format!(
            "{:#}",
            Npz::open(&dir.path().join("missing.npz"), FIX)
                .err()
                .unwrap()
        );
        assert!(e.contains("cannot open"), "{e}");
        Ok(())
    }

    /// `n` bytes of xorshift noise (incompressible) from `seed`.
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// An archive of `x` (`data`, `u8`) then `y` (16 bytes), as bytes.
    fn archive(data: &[u8], compress: bool) -> Result<Vec<u8>> {
        let arrays = vec![
            (
                "x",
                NpyHeader {
                    dtype: Dtype::U8,
                    shape: vec![data.len()],
                },
                NpyData::Bytes(data.into()),
            ),
            (
                "y",
                NpyHeader {
                    dtype: Dtype::U8,
                    shape: vec![16],
                },
                NpyData::Bytes(vec![3u8; 16].into()),
            ),
        ];
        let mut bytes = std::io::Cursor::new(Vec::new());
        write_npz(&mut bytes, arrays, compress)?;
        Ok(bytes.into_inner())
    }

    /// Where the central-directory entry of `member` keeps its CRC-32 in the ZIP `bytes`.
    pub(crate) fn directory_crc_at(bytes: &[u8], member: &str) -> usize {
        let name = member.as_bytes();
        (0..bytes.len() - 46 - name.len())
            .find(|&i| {
                bytes[i..].starts_with(b"PK\x01\x02")
                    && bytes[i + 46..].starts_with(name)
                    && usize::from(u16::from_le_bytes([bytes[i + 28], bytes[i + 29]])) == name.len()
            })
            .unwrap_or_else(|| panic!("{member} in the central directory"))
            + 16
    }

    #[test]
    fn members_failing_their_crc_are_refused_naming_the_file_member_and_fix() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("a.npz");
        let data = noise(5000, 7);
        let good = archive(&data, false)?;
        let at = directory_crc_at(&good, "x.npy");
        let crc = u32::from_le_bytes(good[at..at + 4].try_into()?);
        let header_at = good.windows(6).position(|w| w == MAGIC).unwrap();
        let read_x = |bytes: &[u8]| -> Result<String> {
            std::fs::write(&path, bytes)?;
            let mut npz = Npz::open(&path, FIX)?;
            let e = npz.read("x").expect_err("a corrupt member");
            // The other member is intact and reads.
            assert_eq!(npz.read("y")?.1, [3u8; 16]);
            Ok(format!("{e:#}"))
        };
        let named = format!("{}: member x.npy ", path.display());
        // A flipped data byte, and a flipped magic byte (not reported as a foreign file).
        for flip in [header_at + 1000, header_at] {
            let mut bytes = good.clone();
            bytes[flip] ^= 0x20;
            let e = read_x(&bytes)?;
            let sums = format!("fails its CRC-32 check (stored {crc:08x}, computed ");
            for needle in [named.as_str(), &sums, "the file is corrupt", FIX] {
                assert!(e.contains(needle), "`{needle}` missing from: {e}");
            }
            assert!(!e.contains("magic"), "{e}");
        }
        // A wrong CRC-32 in the directory over intact bytes.
        let mut bytes = good.clone();
        bytes[at..at + 4].copy_from_slice(&(crc ^ 1).to_le_bytes());
        let e = read_x(&bytes)?;
        let sums = format!("(stored {:08x}, computed {crc:08x})", crc ^ 1);
        assert!(e.contains(&named) && e.contains(&sums), "{e}");
        // A flipped byte in a DEFLATE stream: an inflate error or a CRC mismatch, named alike.
        let text: Vec<u8> = (0..4000u32)
            .flat_map(|i| format!("{i} ").into_bytes())
            .collect();
        let mut bytes = archive(&text, true)?;
        bytes[30 + "x.npy".len() + 40] ^= 0x55;
        let e = read_x(&bytes)?;
        for needle in [named.as_str(), "corrupt", FIX] {
            assert!(e.contains(needle), "`{needle}` missing from: {e}");
        }
        // The intact archive reads.
        std::fs::write(&path, &good)?;
        assert_eq!(Npz::open(&path, FIX)?.read("x")?.1, data);
        Ok(())
    }

    #[test]
    fn the_content_key_follows_every_member_byte() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("a.npz");
        let key = |bytes: &[u8]| -> Result<String> {
            std::fs::write(&path, bytes)?;
            Ok(Npz::open(&path, FIX)?.content_key())
        };
        let first = key(&archive(&noise(100, 1), true)?)?;
        assert!(
            first.contains("x.npy crc32 ") && first.contains("y.npy crc32 "),
            "{first}"
        );
        // Rewritten with the same members: the same key.
        assert_eq!(key(&archive(&noise(100, 1), true)?)?, first);
        // One byte of one member changed (the sizes stay): another key.
        let mut changed = noise(100, 1);
        changed[50] ^= 1;
        assert_ne!(key(&archive(&changed, true)?)?, first);
        Ok(())
    }
}
