//! TensorBoard event files: a writer for a run's scalars and PNG images, and a reader for tests.
//!
//! `tensorboard --logdir runs` reads every `events.out.tfevents.*` file below `runs`. Each file is
//! a sequence of TFRecords (TensorFlow `tensorflow/core/lib/io/record_writer.cc`):
//!
//! ```text
//! u64 LE  length of data
//! u32 LE  masked CRC-32C of the 8 length bytes
//! [u8]    data: one serialised `Event` protobuf
//! u32 LE  masked CRC-32C of data
//! ```
//!
//! with CRC-32C the Castagnoli CRC (reflected polynomial 0x82F63B78) and
//! `mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8` (`tensorflow/core/lib/hash/crc32c.h`).
//! The first record of a file is `Event { wall_time, file_version: "brain.Event:2" }`.
//!
//! The protobuf messages (`tensorflow/core/util/event.proto`,
//! `tensorflow/core/framework/summary.proto`) are encoded by hand; only these fields are written or
//! read, others are skipped on reading:
//!
//! ```text
//! Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//! Summary { repeated Value value = 1; }
//! Value   { string tag = 1; float simple_value = 2; Image image = 4; }
//! Image   { int32 height = 1; int32 width = 2; int32 colorspace = 3; bytes encoded_image_string = 4; }
//! ```
//!
//! Scalars are stored as `float` (f32), as TensorBoard's `simple_value` is. TensorBoard's loader
//! treats a step lower than the last one it saw as a restart and purges that tag's later points, so
//! write each tag's steps in increasing order (the trainer does).
//!
//! Resuming: a run killed between checkpoints has logged steps past its last checkpoint, which the
//! resumed run logs again. [`EventWriter::open`] with the checkpoint's step `s` rewrites the
//! directory's event files without the records at steps `>= s`, so every step is there once. So a
//! value logged before the checkpoint must carry a step `< s`: the trainer draws an epoch's
//! monitors (`metrics.jsonl`'s `epoch_end` records, stamped with the steps taken) at the epoch's
//! last step. A record cut short at the end of a file (the process was killed mid-write) is dropped
//! by that rewrite by design; [`read_dir`] reports it, as it reports any record whose length or CRC
//! is wrong.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};

/// What an event file's name contains (TensorBoard loads files whose name contains `tfevents`).
const EVENT_FILE_MARK: &str = "tfevents";
/// The prefix of event file names.
const EVENT_FILE_PREFIX: &str = "events.out.tfevents.";
/// The temporary file a resume rewrites an event file into (no `tfevents` in the name, so a
/// TensorBoard watching the directory does not load it).
const REWRITE_PREFIX: &str = ".tb-rewrite-";
/// The `file_version` of the first record of each file.
const FILE_VERSION: &str = "brain.Event:2";
/// Bytes of a record around its data: length, length CRC, data CRC.
const FRAMING: usize = 8 + 4 + 4;

/// CRC-32C (Castagnoli) lookup table for the reflected polynomial 0x82F63B78.
const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC-32C of `data` (iSCSI / Castagnoli; `crc32c(b"123456789") == 0xE3069283`).
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc = CRC32C_TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TFRecord's masked CRC-32C (masked so that CRCs of data containing CRCs stay well distributed).
fn masked_crc(data: &[u8]) -> u32 {
    // ((crc >> 15) | (crc << 17)) + 0xa282ead8
    crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one TFRecord.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + FRAMING);
    record.extend_from_slice(&len);
    record.extend_from_slice(&masked_crc(&len).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc(data).to_le_bytes());
    record
}

/// The records of an event file's bytes, split by their framing.
struct Records {
    /// Byte ranges of each whole record (framing included) and of its data.
    records: Vec<(Range<usize>, Range<usize>)>,
    /// Where a record cut short at the end of the file starts, if one is.
    truncated_at: Option<usize>,
}

/// Splits `bytes` (the contents of `path`) into records, checking both CRCs of each. A record whose
/// bytes end before its length says is reported in `truncated_at`; a CRC mismatch is an error.
fn split_records(bytes: &[u8], path: &Path) -> Result<Records> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < 12 {
            return Ok(Records {
                records,
                truncated_at: Some(at),
            });
        }
        let len_bytes = &rest[..8];
        if masked_crc(len_bytes) != u32::from_le_bytes(rest[8..12].try_into()?) {
            bail!(
                "{}: the record at byte offset {at} is corrupt (its length fails its CRC-32C check)",
                path.display()
            );
        }
        let len = u64::from_le_bytes(len_bytes.try_into()?);
        let whole = usize::try_from(len)
            .ok()
            .and_then(|len| len.checked_add(FRAMING));
        let Some(whole) = whole.filter(|&whole| whole <= rest.len()) else {
            return Ok(Records {
                records,
                truncated_at: Some(at),
            });
        };
        let data = at + 12..at + whole - 4;
        let data_crc = u32::from_le_bytes(rest[whole - 4..whole].try_into()?);
        if masked_crc(&bytes[data.clone()]) != data_crc {
            bail!(
                "{}: the record at byte offset {at} is corrupt (its data fails its CRC-32C check)",
                path.display()
            );
        }
        records.push((at..at + whole, data));
        at += whole;
    }
    Ok(Records {
        records,
        truncated_at: None,
    })
}

// --- Protobuf encoding (https://protobuf.dev/programming-guides/encoding/) ---

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const FIXED32: u8 = 5;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, LENGTH_DELIMITED);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A serialised `Event` carrying `file_version` or a one-value `summary` (a step of 0, proto3's
/// default, is left out as protobuf serialisers do).
fn encode_event(
    wall_time: f64,
    step: i64,
    file_version: Option<&str>,
    value: Option<&[u8]>,
) -> Vec<u8> {
    let mut event = Vec::new();
    put_key(&mut event, 1, FIXED64);
    event.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        put_key(&mut event, 2, VARINT);
        put_varint(&mut event, step as u64);
    }
    if let Some(version) = file_version {
        put_bytes(&mut event, 3, version.as_bytes());
    }
    if let Some(value) = value {
        let mut summary = Vec::new();
        put_bytes(&mut summary, 1, value);
        put_bytes(&mut event, 5, &summary);
    }
    event
}

/// A serialised `Summary.Value` holding `value` as its `simple_value`.
fn scalar_value(tag: &str, value: f64) -> Vec<u8> {
    let mut v = Vec::with_capacity(tag.len() + 8);
    put_bytes(&mut v, 1, tag.as_bytes());
    put_key(&mut v, 2, FIXED32);
    v.extend_from_slice(&(value as f32).to_le_bytes());
    v
}

/// One decoded protobuf field value.
enum Field<'a> {
    Varint(u64),
    /// Skipped (only `Event.wall_time` is one, and nothing reads it).
    Fixed64,
    Fixed32([u8; 4]),
    Bytes(&'a [u8]),
}

fn take_varint(buf: &mut &[u8]) -> Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf
            .split_first()
            .ok_or_else(|| anyhow!("a varint runs past the end of its message"))?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    bail!("a varint is longer than 10 bytes")
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if buf.len() < n {
        bail!("a field of {n} bytes runs past the end of its message");
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// The (field number, value) pairs of a serialised message, in order.
fn fields(mut buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = take_varint(&mut buf)?;
        let field = match (key & 7) as u8 {
            VARINT => Field::Varint(take_varint(&mut buf)?),
            FIXED64 => {
                take(&mut buf, 8)?;
                Field::Fixed64
            }
            LENGTH_DELIMITED => {
                let len = usize::try_from(take_varint(&mut buf)?)?;
                Field::Bytes(take(&mut buf, len)?)
            }
            FIXED32 => Field::Fixed32(take(&mut buf, 4)?.try_into()?),
            other => bail!(
                "unsupported protobuf wire type {other} (field {})",
                key >> 3
            ),
        };
        out.push((key >> 3, field));
    }
    Ok(out)
}

/// The fields of an `Event` this module uses.
struct Event<'a> {
    step: i64,
    file_version: Option<&'a [u8]>,
    summary: Option<&'a [u8]>,
}

fn decode_event(data: &[u8]) -> Result<Event<'_>> {
    let mut event = Event {
        step: 0,
        file_version: None,
        summary: None,
    };
    for (number, field) in fields(data)? {
        match (number, field) {
            (2, Field::Varint(step)) => event.step = step as i64,
            (3, Field::Bytes(version)) => event.file_version = Some(version),
            (5, Field::Bytes(summary)) => event.summary = Some(summary),
            _ => {}
        }
    }
    Ok(event)
}

// --- Writing ---

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's host name for event file names (`localhost` if it cannot be read), with
/// characters other than ASCII letters, digits, `-`, `_` and `.` replaced by `_`.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes; gethostname writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name: String = String::from_utf8_lossy(&buf[..end])
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || "-_.".contains(c) {
            true => c,
            false => '_',
        })
        .collect();
    match rc == 0 && !name.is_empty() {
        true => name,
        false => "localhost".to_string(),
    }
}

/// The event files of `dir` (names containing `tfevents`), sorted by name: the order TensorBoard
/// loads them in, which is the order they were written in as their names start with the time.
fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.contains(EVENT_FILE_MARK)
            && !name.starts_with(REWRITE_PREFIX)
            && entry.path().is_file()
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Rewrites the event file `path` without the summary records of step `from` on and without a
/// truncated last record (atomically: a temporary file renamed over it). A file left with no
/// summary record is removed.
fn truncate_steps(path: &Path, from: u64, temp: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let hint = "; delete it (or start the run afresh) to continue";
    let split = split_records(&bytes, path).map_err(|e| anyhow!("{e}{hint}"))?;
    let mut kept = Vec::with_capacity(bytes.len());
    let mut summaries = 0;
    let mut dropped = split.truncated_at.is_some();
    for (record, data) in &split.records {
        let event = decode_event(&bytes[data.clone()]).map_err(|e| {
            anyhow!(
                "{}: the record at byte offset {} is not an Event: {e}{hint}",
                path.display(),
                record.start
            )
        })?;
        let is_summary = event.summary.is_some();
        if is_summary && u64::try_from(event.step).map_or(true, |step| step >= from) {
            dropped = true;
            continue;
        }
        summaries += usize::from(is_summary);
        kept.extend_from_slice(&bytes[record.clone()]);
    }
    if summaries == 0 {
        std::fs::remove_file(path).with_context(|| format!("cannot remove {}", path.display()))?;
    } else if dropped {
        let write = || -> std::io::Result<()> {
            let mut file = File::create(temp)?;
            file.write_all(&kept)?;
            file.sync_all()?;
            std::fs::rename(temp, path)
        };
        write().with_context(|| {
            format!(
                "cannot rewrite {} (through {})",
                path.display(),
                temp.display()
            )
        })?;
    }
    Ok(())
}

/// Appends a run's scalars and images to a new event file
/// `DIR/events.out.tfevents.<secs>.<host>.<pid>.<n>` (`n` counts up from 0 to a free name).
///
/// Records go through a buffer: call [`EventWriter::flush`] where TensorBoard should see them
/// (dropping the writer flushes too, ignoring errors).
pub struct EventWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl EventWriter {
    /// Opens the run's TensorBoard directory `dir` (created if absent) and starts a new event file.
    ///
    /// `resume_step`: `Some(s)` when the run resumes from a checkpoint taken after `s` optimiser
    /// steps: every summary record with step `>= s` in the directory's event files is dropped, as
    /// is a record cut short at a file's end (a kill mid-write), each changed file being rewritten
    /// atomically (temporary file + rename) and a file left without summaries removed; so after a
    /// kill and a resume each step is logged once. A record failing its CRC is an error. `None`: a
    /// fresh run; the directory's event files are removed.
    pub fn open(dir: &Path, resume_step: Option<u64>) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // Leftovers of a rewrite that was killed before its rename.
        for entry in
            std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?
        {
            let path = entry
                .with_context(|| format!("cannot list {}", dir.display()))?
                .path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(REWRITE_PREFIX))
            {
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot remove {}", path.display()))?;
            }
        }
        for (i, path) in event_files(dir)?.iter().enumerate() {
            match resume_step {
                None => std::fs::remove_file(path).with_context(|| {
                    format!("cannot remove the old event file {}", path.display())
                })?,
                Some(from) => {
                    truncate_steps(path, from, &dir.join(format!("{REWRITE_PREFIX}{i}.tmp")))?
                }
            }
        }
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let stem = format!(
            "{EVENT_FILE_PREFIX}{secs:010}.{}.{}",
            hostname(),
            std::process::id()
        );
        let mut n = 0u32;
        let (path, file) = loop {
            let path = dir.join(format!("{stem}.{n}"));
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", path.display()))
                }
            }
        };
        let mut writer = EventWriter {
            path,
            file: BufWriter::new(file),
        };
        writer.write_record(&encode_event(wall_time(), 0, Some(FILE_VERSION), None))?;
        writer.flush()?;
        Ok(writer)
    }

    /// The event file this writer appends to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_record(&mut self, event: &[u8]) -> Result<()> {
        self.file
            .write_all(&frame(event))
            .with_context(|| format!("cannot write to {}", self.path.display()))
    }

    fn write_value(&mut self, tag: &str, step: u64, value: &[u8]) -> Result<()> {
        let step = i64::try_from(step)
            .map_err(|_| anyhow!("{tag}: step {step} does not fit TensorBoard's int64 step"))?;
        self.write_record(&encode_event(wall_time(), step, None, Some(value)))
    }

    /// Logs `value` (stored as f32) under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, step: u64, value: f64) -> Result<()> {
        self.write_value(tag, step, &scalar_value(tag, value))
    }

    /// Logs the PNG `png` under `tag` at `step`; its width, height and colour type are read from
    /// its IHDR chunk (an error if `png` does not start like a PNG).
    pub fn image(&mut self, tag: &str, step: u64, png: &[u8]) -> Result<()> {
        let (width, height, colour_type) =
            png_header(png).with_context(|| format!("image {tag} at step {step}"))?;
        // TensorBoard's colorspace: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA (palette images: RGB).
        let colorspace = match colour_type {
            0 => 1,
            4 => 2,
            6 => 4,
            _ => 3,
        };
        let mut image = Vec::with_capacity(png.len() + 24);
        put_key(&mut image, 1, VARINT);
        put_varint(&mut image, u64::from(height));
        put_key(&mut image, 2, VARINT);
        put_varint(&mut image, u64::from(width));
        put_key(&mut image, 3, VARINT);
        put_varint(&mut image, colorspace);
        put_bytes(&mut image, 4, png);
        let mut v = Vec::with_capacity(image.len() + tag.len() + 8);
        put_bytes(&mut v, 1, tag.as_bytes());
        put_bytes(&mut v, 4, &image);
        self.write_value(tag, step, &v)
    }

    /// Hands the buffered records to the operating system, where TensorBoard can read them.
    pub fn flush(&mut self) -> Result<()> {
        self.file
            .flush()
            .with_context(|| format!("cannot write to {}", self.path.display()))
    }
}

/// A PNG's (width, height, colour type) from its signature and IHDR chunk (PNG spec, section
/// 11.2.2).
fn png_header(png: &[u8]) -> Result<(u32, u32, u8)> {
    const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    if png.len() < 26 || png[..8] != SIGNATURE || &png[12..16] != b"IHDR" {
        bail!("not a PNG (no PNG signature followed by an IHDR chunk)");
    }
    let width = u32::from_be_bytes([png[16], png[17], png[18], png[19]]);
    let height = u32::from_be_bytes([png[20], png[21], png[22], png[23]]);
    if width > i32::MAX as u32 || height > i32::MAX as u32 {
        bail!("PNG size {width}x{height} is out of range");
    }
    Ok((width, height, png[25]))
}

// --- Reading ---

/// One scalar point read back.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalarEvent {
    pub tag: String,
    pub step: u64,
    pub value: f32,
}

/// One image read back.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageEvent {
    pub tag: String,
    pub step: u64,
    pub width: u32,
    pub height: u32,
    /// The encoded image (PNG as this writer writes it).
    pub png: Vec<u8>,
}

/// The contents of a directory's event files, in file (name) and record order.
#[derive(Debug, Default)]
pub struct Events {
    pub scalars: Vec<ScalarEvent>,
    pub images: Vec<ImageEvent>,
}

impl Events {
    /// The values logged under `tag` at `step`, in the order written.
    pub fn scalar_at(&self, tag: &str, step: u64) -> Vec<f32> {
        self.scalars
            .iter()
            .filter(|s| s.tag == tag && s.step == step)
            .map(|s| s.value)
            .collect()
    }
}

/// Decodes a `Summary`'s values into `events`.
fn read_summary(summary: &[u8], step: u64, events: &mut Events) -> Result<()> {
    for (number, field) in fields(summary)? {
        let (1, Field::Bytes(value)) = (number, field) else {
            continue;
        };
        let mut tag = None;
        let mut simple = None;
        let mut image = None;
        for (number, field) in fields(value)? {
            match (number, field) {
                (1, Field::Bytes(t)) => {
                    tag = Some(String::from_utf8(t.to_vec()).context("a tag is not UTF-8")?)
                }
                (2, Field::Fixed32(v)) => simple = Some(f32::from_le_bytes(v)),
                (4, Field::Bytes(i)) => image = Some(i),
                _ => {}
            }
        }
        let tag = tag.ok_or_else(|| anyhow!("a summary value has no tag"))?;
        if let Some(value) = simple {
            events.scalars.push(ScalarEvent { tag, step, value });
        } else if let Some(image) = image {
            let (mut width, mut height, mut png) = (0, 0, Vec::new());
            for (number, field) in fields(image)? {
                match (number, field) {
                    (1, Field::Varint(h)) => height = u32::try_from(h)?,
                    (2, Field::Varint(w)) => width = u32::try_from(w)?,
                    (4, Field::Bytes(bytes)) => png = bytes.to_vec(),
                    _ => {}
                }
            }
            events.images.push(ImageEvent {
                tag,
                step,
                width,
                height,
                png,
            });
        }
    }
    Ok(())
}

/// Reads every event file of `dir` (sorted by name) back. Each file must start with a
/// `file_version` record; a record whose length or data fails its CRC, or that is cut short (also
/// at the end of a file: [`EventWriter::open`] drops that one when resuming), is an error naming
/// the file and the record's byte offset.
pub fn read_dir(dir: &Path) -> Result<Events> {
    let files = event_files(dir)?;
    if files.is_empty() {
        bail!(
            "no TensorBoard event files ({EVENT_FILE_PREFIX}*) in {}",
            dir.display()
        );
    }
    let mut events = Events::default();
    for path in &files {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let split = split_records(&bytes, path)?;
        if let Some(at) = split.truncated_at {
            bail!(
                "{}: the record at byte offset {at} is truncated ({} bytes left in the file; was the \
                 writer killed mid-write? resuming the run drops it)",
                path.display(),
                bytes.len() - at
            );
        }
        for (i, (record, data)) in split.records.iter().enumerate() {
            let at = |e: anyhow::Error| {
                anyhow!(
                    "{}: the record at byte offset {}: {e}",
                    path.display(),
                    record.start
                )
            };
            let event = decode_event(&bytes[data.clone()]).map_err(at)?;
            if i == 0
                && event
                    .file_version
                    .is_none_or(|v| !v.starts_with(b"brain.Event:"))
            {
                bail!(
                    "{}: not a TensorBoard event file (its first record has no file_version \"brain.Event:N\")",
                    path.display()
                );
            }
            if let Some(summary) = event.summary {
                let step = u64::try_from(event.step)
                    .map_err(|_| at(anyhow!("negative step {}", event.step)))?;
                read_summary(summary, step, &mut events).map_err(at)?;
            }
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests;
