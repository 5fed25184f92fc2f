//! A reader for the Python pickles of the CIFAR archives, and a writer of the same layout.
//!
//! The official `cifar-10-python.tar.gz` and `cifar-100-python.tar.gz` hold dicts pickled by
//! Python 2's `cPickle` (protocol 2): byte-string keys (`data`, `labels`, `fine_labels`, …), label
//! lists of small ints, and the images as a NumPy array reduced through
//! `numpy.core.multiarray._reconstruct` whose state carries the shape, the dtype (`u1`) and the raw
//! bytes as a byte string. [`read_dict`] runs a pickle machine over exactly the opcodes such files
//! (and the same dicts pickled by Python 3 at protocols 2–4) use, and refuses any other opcode
//! by name, so a file of another kind is an error, not a misreading. Byte strings are kept as
//! ranges of the input, so the images are never copied here.

use std::collections::HashMap;
use std::ops::Range;

use anyhow::{bail, ensure, Context, Result};

/// A value of the pickle machine.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// A byte string, as the range of the input it is stored in.
    Bytes(Range<usize>),
    /// A byte string made by the machine (Python 3's `_codecs.encode(str, 'latin1')`).
    Owned(Vec<u8>),
    Str(String),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Global(String, String),
    /// `callable(*args)` (REDUCE), with the state given to it by BUILD, if any.
    Object {
        callable: Box<Value>,
        args: Box<Value>,
        state: Option<Box<Value>>,
    },
}

impl Value {
    /// The bytes of a byte or text string (a key: `b"data"` in Python 2, `"data"` in Python 3).
    fn bytes<'a>(&'a self, input: &'a [u8]) -> Option<&'a [u8]> {
        match self {
            Value::Bytes(range) => input.get(range.clone()),
            Value::Owned(bytes) => Some(bytes),
            Value::Str(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
}

/// A pickled dict: its entries by key, over the input they were read from.
pub(crate) struct Dict<'a> {
    input: &'a [u8],
    entries: HashMap<Vec<u8>, Value>,
}

impl Dict<'_> {
    /// The value of `key`, or an error naming the keys there are.
    fn get(&self, key: &str) -> Result<&Value> {
        self.entries.get(key.as_bytes()).with_context(|| {
            let mut keys: Vec<String> = self
                .entries
                .keys()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            keys.sort();
            format!("it has no `{key}` entry (its keys: {})", keys.join(", "))
        })
    }

    /// The list of ints under `key`.
    pub(crate) fn ints(&self, key: &str) -> Result<Vec<i64>> {
        let Value::List(items) = self.get(key)? else {
            bail!("its `{key}` entry is not a list");
        };
        items
            .iter()
            .map(|v| match v {
                Value::Int(i) => Ok(*i),
                other => bail!("its `{key}` list holds {other:?}, not an int"),
            })
            .collect()
    }

    /// The `uint8` NumPy array under `key`: its shape and its bytes (C order).
    pub(crate) fn u8_array(&self, key: &str) -> Result<(Vec<usize>, &[u8])> {
        let not = |what: &str| format!("its `{key}` entry is not a uint8 NumPy array ({what})");
        let Value::Object {
            callable,
            state: Some(state),
            ..
        } = self.get(key)?
        else {
            bail!(not("no reconstructed object"));
        };
        ensure!(
            **callable == global("numpy.core.multiarray", "_reconstruct")
                || **callable == global("numpy._core.multiarray", "_reconstruct"),
            not(&format!("made by {callable:?}"))
        );
        // ndarray.__setstate__((version, shape, dtype, is_fortran, raw bytes)).
        let Value::Tuple(state) = &**state else {
            bail!(not("its state is not a tuple"));
        };
        let [_, Value::Tuple(shape), dtype, Value::Bool(fortran), raw] = &state[..] else {
            bail!(not(
                "its state is not (version, shape, dtype, fortran, bytes)"
            ));
        };
        ensure!(!fortran, not("it is in Fortran order"));
        let shape = shape
            .iter()
            .map(|d| match d {
                Value::Int(n) if *n >= 0 => Ok(*n as usize),
                other => bail!(not(&format!("its shape holds {other:?}"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let kind = match dtype {
            Value::Object { args, .. } => match &**args {
                Value::Tuple(args) => args.first().and_then(|a| a.bytes(self.input)),
                _ => None,
            },
            _ => None,
        };
        ensure!(
            kind == Some(b"u1"),
            not(&format!(
                "its dtype is {}",
                kind.map_or("unknown".into(), String::from_utf8_lossy)
            ))
        );
        let bytes = raw
            .bytes(self.input)
            .with_context(|| not("its data is not a byte string"))?;
        let expected: usize = shape.iter().product();
        ensure!(
            bytes.len() == expected,
            not(&format!(
                "{} bytes of data for shape {shape:?}",
                bytes.len()
            ))
        );
        Ok((shape, bytes))
    }
}

fn global(module: &str, name: &str) -> Value {
    Value::Global(module.into(), name.into())
}

/// The dict pickled in `input` (see the module docs).
pub(crate) fn read_dict(input: &[u8]) -> Result<Dict<'_>> {
    match run(input)? {
        Value::Dict(items) => {
            let mut entries = HashMap::new();
            for (key, value) in items {
                let key = key
                    .bytes(input)
                    .with_context(|| format!("a dict key is {key:?}, not a string"))?
                    .to_vec();
                entries.insert(key, value);
            }
            Ok(Dict { input, entries })
        }
        other => bail!("the pickle holds {}, not a dict", kind(&other)),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::Int(_) => "an int",
        Value::Bytes(_) | Value::Owned(_) => "a byte string",
        Value::Str(_) => "a string",
        Value::Tuple(_) => "a tuple",
        Value::List(_) => "a list",
        Value::Dict(_) => "a dict",
        Value::Global(..) => "a global",
        Value::Object { .. } => "an object",
    }
}

/// A stack entry: a value or a MARK.
enum Slot {
    Mark,
    Value(Value),
}

/// Runs the pickle machine over `input` to its STOP; returns the value it leaves.
fn run(input: &[u8]) -> Result<Value> {
    let mut stack: Vec<Slot> = Vec::new();
    let mut memo: HashMap<u32, Value> = HashMap::new();
    let mut at = 0usize;
    let truncated = || anyhow::anyhow!("the pickle ends early (a truncated file?)");
    // The next `n` bytes.
    let take = |n: usize, at: &mut usize| -> Result<Range<usize>> {
        let range = *at..at.checked_add(n).ok_or_else(truncated)?;
        ensure!(range.end <= input.len(), truncated());
        *at = range.end;
        Ok(range)
    };
    let le = |range: Range<usize>| -> u64 {
        input[range]
            .iter()
            .rev()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b))
    };
    let pop = |stack: &mut Vec<Slot>| -> Result<Value> {
        match stack.pop() {
            Some(Slot::Value(v)) => Ok(v),
            Some(Slot::Mark) => bail!("a MARK where a value was expected"),
            None => bail!("the pickle's stack is empty where a value was expected"),
        }
    };
    // The values above the topmost MARK, which is removed.
    let pop_mark = |stack: &mut Vec<Slot>| -> Result<Vec<Value>> {
        let mark = stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .context("no MARK on the pickle's stack")?;
        let items = stack
            .drain(mark + 1..)
            .map(|s| match s {
                Slot::Value(v) => v,
                Slot::Mark => unreachable!("the topmost mark is at `mark`"),
            })
            .collect();
        stack.pop();
        Ok(items)
    };
    let text = |range: Range<usize>| -> Result<String> {
        String::from_utf8(input[range].to_vec()).context("a string in the pickle is not UTF-8")
    };
    loop {
        let op = input[take(1, &mut at)?.start];
        let value = match op {
            // PROTO n, FRAME n (protocol 4's framing: the frames are read as one stream).
            0x80 => {
                take(1, &mut at)?;
                continue;
            }
            0x95 => {
                take(8, &mut at)?;
                continue;
            }
            b'.' => return pop(&mut stack),
            b'(' => {
                stack.push(Slot::Mark);
                continue;
            }
            b'N' => Value::None,
            0x88 => Value::Bool(true),
            0x89 => Value::Bool(false),
            b'K' => Value::Int(le(take(1, &mut at)?) as i64),
            b'M' => Value::Int(le(take(2, &mut at)?) as i64),
            b'J' => Value::Int(i64::from(le(take(4, &mut at)?) as u32 as i32)),
            // SHORT_BINSTRING, SHORT_BINBYTES; BINSTRING, BINBYTES.
            b'U' | b'C' => {
                let n = le(take(1, &mut at)?) as usize;
                Value::Bytes(take(n, &mut at)?)
            }
            b'T' | b'B' => {
                let n = le(take(4, &mut at)?) as usize;
                Value::Bytes(take(n, &mut at)?)
            }
            // SHORT_BINUNICODE, BINUNICODE.
            0x8c => {
                let n = le(take(1, &mut at)?) as usize;
                Value::Str(text(take(n, &mut at)?)?)
            }
            b'X' => {
                let n = le(take(4, &mut at)?) as usize;
                Value::Str(text(take(n, &mut at)?)?)
            }
            b')' => Value::Tuple(Vec::new()),
            b']' => Value::List(Vec::new()),
            b'}' => Value::Dict(Vec::new()),
            b't' => Value::Tuple(pop_mark(&mut stack)?),
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(pop(&mut stack)?);
                }
                items.reverse();
                Value::Tuple(items)
            }
            // GLOBAL "module\nname\n"; STACK_GLOBAL.
            b'c' => {
                let mut line = || -> Result<String> {
                    let end = input[at..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .ok_or_else(truncated)?;
                    let s = text(at..at + end)?;
                    at += end + 1;
                    Ok(s)
                };
                let module = line()?;
                Value::Global(module, line()?)
            }
            0x93 => {
                let name = pop(&mut stack)?;
                let module = pop(&mut stack)?;
                match (module, name) {
                    (Value::Str(m), Value::Str(n)) => Value::Global(m, n),
                    _ => bail!("STACK_GLOBAL without two strings"),
                }
            }
            b'R' => {
                let args = pop(&mut stack)?;
                let callable = pop(&mut stack)?;
                reduce(callable, args)?
            }
            b'b' => {
                let state = pop(&mut stack)?;
                match stack.last_mut() {
                    Some(Slot::Value(Value::Object { state: slot, .. })) if slot.is_none() => {
                        *slot = Some(Box::new(state));
                    }
                    _ => bail!("BUILD without an object to build"),
                }
                continue;
            }
            b'a' | b'e' => {
                let items = match op {
                    b'a' => vec![pop(&mut stack)?],
                    _ => pop_mark(&mut stack)?,
                };
                match stack.last_mut() {
                    Some(Slot::Value(Value::List(list))) => list.extend(items),
                    _ => bail!("APPEND(S) without a list"),
                }
                continue;
            }
            b's' | b'u' => {
                let items = match op {
                    b's' => {
                        let value = pop(&mut stack)?;
                        vec![pop(&mut stack)?, value]
                    }
                    _ => pop_mark(&mut stack)?,
                };
                ensure!(
                    items.len() % 2 == 0,
                    "SETITEMS with an odd number of values"
                );
                match stack.last_mut() {
                    Some(Slot::Value(Value::Dict(dict))) => {
                        let mut items = items.into_iter();
                        while let (Some(k), Some(v)) = (items.next(), items.next()) {
                            dict.push((k, v));
                        }
                    }
                    _ => bail!("SETITEM(S) without a dict"),
                }
                continue;
            }
            // BINPUT, LONG_BINPUT, MEMOIZE.
            b'q' | b'r' | 0x94 => {
                let index = match op {
                    b'q' => le(take(1, &mut at)?) as u32,
                    b'r' => le(take(4, &mut at)?) as u32,
                    _ => memo.len() as u32,
                };
                match stack.last() {
                    // Lists and dicts are memoised empty and filled afterwards; the official
                    // files never refer back to one, so they are not kept.
                    Some(Slot::Value(Value::List(_) | Value::Dict(_))) => {}
                    Some(Slot::Value(v)) => {
                        memo.insert(index, v.clone());
                    }
                    _ => bail!("PUT without a value"),
                }
                continue;
            }
            // BINGET, LONG_BINGET.
            b'h' | b'j' => {
                let index = match op {
                    b'h' => le(take(1, &mut at)?) as u32,
                    _ => le(take(4, &mut at)?) as u32,
                };
                memo.get(&index)
                    .with_context(|| {
                        format!("the pickle refers to memo entry {index}, a list or dict or none")
                    })?
                    .clone()
            }
            other => bail!(
                "opcode 0x{other:02x} at byte {} is not one a CIFAR pickle uses",
                at - 1
            ),
        };
        stack.push(Slot::Value(value));
    }
}

/// `callable(*args)`: Python 3's latin-1 encoding of a byte string back into bytes, else an
/// object for BUILD to give its state to.
fn reduce(callable: Value, args: Value) -> Result<Value> {
    if callable == global("_codecs", "encode") {
        if let Value::Tuple(a) = &args {
            if let [Value::Str(s), Value::Str(codec)] = &a[..] {
                ensure!(codec == "latin1", "_codecs.encode with `{codec}`");
                return s
                    .chars()
                    .map(|c| u8::try_from(u32::from(c)).context("a latin-1 string above 255"))
                    .collect::<Result<Vec<u8>>>()
                    .map(Value::Owned);
            }
        }
    }
    Ok(Value::Object {
        callable: Box::new(callable),
        args: Box::new(args),
        state: None,
    })
}

/// Writes `dict` as Python 2's `cPickle.dump(dict, f, 2)` lays out a CIFAR batch: string keys,
/// int lists, and `(key, shape, pixels)` uint8 arrays through `_reconstruct` (every object
/// memoised, as cPickle does).
pub(crate) struct Writer {
    out: Vec<u8>,
    memo: u32,
}

impl Writer {
    /// A pickle of a dict whose entries follow.
    pub(crate) fn dict() -> Self {
        let mut w = Self {
            out: vec![0x80, 2, b'}'],
            memo: 0,
        };
        w.put();
        w.out.push(b'(');
        w
    }

    fn put(&mut self) {
        self.memo += 1;
        match u8::try_from(self.memo) {
            Ok(i) => self.out.extend([b'q', i]),
            Err(_) => {
                self.out.push(b'r');
                self.out.extend(self.memo.to_le_bytes());
            }
        }
    }

    fn string(&mut self, s: &[u8]) {
        match u8::try_from(s.len()) {
            Ok(n) => self.out.extend([b'U', n]),
            Err(_) => {
                self.out.push(b'T');
                self.out.extend((s.len() as u32).to_le_bytes());
            }
        }
        self.out.extend(s);
        self.put();
    }

    fn int(&mut self, v: u32) {
        match v {
            0..=0xff => self.out.extend([b'K', v as u8]),
            0x100..=0xffff => {
                self.out.push(b'M');
                self.out.extend((v as u16).to_le_bytes());
            }
            _ => {
                self.out.push(b'J');
                self.out.extend(v.to_le_bytes());
            }
        }
    }

    /// `key: [values…]`.
    pub(crate) fn ints(mut self, key: &str, values: &[u32]) -> Self {
        self.string(key.as_bytes());
        self.out.push(b']');
        self.put();
        if !values.is_empty() {
            self.out.push(b'(');
            for &v in values {
                self.int(v);
            }
            self.out.push(b'e');
        }
        self
    }

    /// `key: "value"`.
    pub(crate) fn text(mut self, key: &str, value: &str) -> Self {
        self.string(key.as_bytes());
        self.string(value.as_bytes());
        self
    }

    /// `key: numpy.ndarray(shape, dtype=uint8)` holding `bytes` (C order).
    pub(crate) fn u8_array(mut self, key: &str, shape: &[usize], bytes: &[u8]) -> Self {
        self.string(key.as_bytes());
        self.out
            .extend(b"cnumpy.core.multiarray\n_reconstruct\n".iter());
        self.put();
        self.out.extend(b"cnumpy\nndarray\n".iter());
        self.put();
        self.out.extend([b'K', 0, 0x85]);
        self.string(b"b");
        self.out.push(0x87);
        self.out.push(b'R');
        self.put();
        self.out.push(b'(');
        self.int(1);
        for &d in shape {
            self.int(d as u32);
        }
        self.out.push(match shape.len() {
            1 => 0x85,
            2 => 0x86,
            _ => 0x87,
        });
        self.out.extend(b"cnumpy\ndtype\n".iter());
        self.put();
        self.string(b"u1");
        self.out.extend([b'K', 0, b'K', 1, 0x87, b'R']);
        self.put();
        self.out.extend([b'(', b'K', 3]);
        self.string(b"|");
        self.out.extend([b'N', b'N', b'N', b'J']);
        self.out.extend((-1i32).to_le_bytes());
        self.out.push(b'J');
        self.out.extend((-1i32).to_le_bytes());
        self.out.extend([b'K', 0, b't', b'b', 0x89]);
        self.string(bytes);
        self.out.extend([b't', b'b']);
        self
    }

    /// The pickle's bytes.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.extend([b'u', b'.']);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_batch_reads_back() -> Result<()> {
        let pixels: Vec<u8> = (0..2 * 3072).map(|i| (i % 251) as u8).collect();
        let labels: Vec<u32> = (0..300).map(|i| i % 10).collect();
        let bytes = Writer::dict()
            .text("batch_label", "training batch 1 of 5")
            .ints("labels", &labels)
            .u8_array("data", &[2, 3072], &pixels)
            .finish();
        let dict = read_dict(&bytes)?;
        let (shape, data) = dict.u8_array("data")?;
        assert_eq!((shape, data), (vec![2, 3072], &pixels[..]));
        let read: Vec<i64> = labels.iter().map(|&l| i64::from(l)).collect();
        assert_eq!(dict.ints("labels")?, read);
        let e = format!("{:#}", dict.ints("fine_labels").unwrap_err());
        assert!(
            e.contains("no `fine_labels` entry") && e.contains("batch_label"),
            "{e}"
        );
        let e = format!("{:#}", dict.u8_array("labels").unwrap_err());
        assert!(e.contains("not a uint8 NumPy array"), "{e}");
        Ok(())
    }

    /// `pickle.dumps({'data': numpy.arange(6, dtype=numpy.uint8).reshape(2, 3), 'labels':
    /// [1, 300]}, protocol=2)` from Python 3.11 with NumPy 2.4: the same dict as Python 3
    /// pickles it (text keys, bytes through `_codecs.encode`, `numpy._core`).
    #[test]
    fn python3_protocol_2_reads_too() -> Result<()> {
        let bytes = b"\x80\x02}q\x00(X\x04\x00\x00\x00dataq\x01cnumpy._core.multiarray\n_reconstruct\nq\x02cnumpy\nndarray\nq\x03K\x00\x85q\x04c_codecs\nencode\nq\x05X\x01\x00\x00\x00bq\x06X\x06\x00\x00\x00latin1q\x07\x86q\x08Rq\t\x87q\nRq\x0b(K\x01K\x02K\x03\x86q\x0ccnumpy\ndtype\nq\rX\x02\x00\x00\x00u1q\x0e\x89\x88\x87q\x0fRq\x10(K\x03X\x01\x00\x00\x00|q\x11NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tq\x12b\x89h\x05X\x06\x00\x00\x00\x00\x01\x02\x03\x04\x05q\x13h\x07\x86q\x14Rq\x15tq\x16bX\x06\x00\x00\x00labelsq\x17]q\x18(K\x01M,\x01eu.";
        let dict = read_dict(bytes)?;
        let (shape, data) = dict.u8_array("data")?;
        assert_eq!((shape, data), (vec![2, 3], &[0u8, 1, 2, 3, 4, 5][..]));
        assert_eq!(dict.ints("labels")?, [1, 300]);
        Ok(())
    }

    #[test]
    fn truncated_and_foreign_pickles_are_errors() {
        let bytes = Writer::dict().ints("labels", &[1, 2]).finish();
        for end in [1, 5, bytes.len() - 1] {
            assert!(read_dict(&bytes[..end]).is_err(), "{end}");
        }
        let e = format!("{:#}", read_dict(b"\x80\x02G\x00").err().unwrap());
        assert!(e.contains("opcode 0x47"), "{e}");
        let e = format!("{:#}", read_dict(b"\x80\x02]q\x00.").err().unwrap());
        assert!(e.contains("not a dict"), "{e}");
    }
}
