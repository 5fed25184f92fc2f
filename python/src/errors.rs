//! Rust errors as Python exceptions, with the Rust message (its whole context chain, as `ssl`
//! prints it): `ValueError` for a configuration or an argument that is refused, `FileNotFoundError`
//! where a file or directory is missing, `RuntimeError` for a failure while working.

use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

/// The message of `e` on one line: each context, then its cause (`a: b: c`).
pub fn message(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

/// Whether a cause of `e` is a missing file or directory.
fn not_found(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
    })
}

/// `e` as a `ValueError` (or `FileNotFoundError` when a file is missing).
pub fn value(e: anyhow::Error) -> PyErr {
    match not_found(&e) {
        true => PyFileNotFoundError::new_err(message(&e)),
        false => PyValueError::new_err(message(&e)),
    }
}

/// `e` as a `RuntimeError` (or `FileNotFoundError` when a file is missing).
pub fn runtime(e: anyhow::Error) -> PyErr {
    match not_found(&e) {
        true => PyFileNotFoundError::new_err(message(&e)),
        false => PyRuntimeError::new_err(message(&e)),
    }
}

/// Turns an `anyhow::Result` into a `PyResult` with the exception kind of its call site.
pub trait IntoPy<T> {
    /// Refused input: `ValueError`.
    fn or_value(self) -> pyo3::PyResult<T>;
    /// Failed work: `RuntimeError`.
    fn or_runtime(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPy<T> for anyhow::Result<T> {
    fn or_value(self) -> pyo3::PyResult<T> {
        self.map_err(value)
    }

    fn or_runtime(self) -> pyo3::PyResult<T> {
        self.map_err(runtime)
    }
}
