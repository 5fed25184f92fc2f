//! `candle_ssl.objectives()`, `encoders()` and `describe(name)`: what this build can train.

use pyo3::prelude::*;

use crate::errors::IntoPy;

/// Every linked objective's name, sorted.
#[pyfunction]
pub fn objectives() -> Vec<&'static str> {
    ssl_core::registry().into_iter().map(|r| r.name).collect()
}

/// The built-in encoders, then the registered ones.
#[pyfunction]
pub fn encoders() -> Vec<&'static str> {
    let registered = ssl_models::registered_encoders()
        .into_iter()
        .map(|r| r.name);
    ssl_train::config::ENCODERS
        .iter()
        .copied()
        .chain(registered)
        .collect()
}

/// An objective's summary, paper, aliases, keys with their defaults, and limits, as `ssl
/// describe` prints them.
#[pyfunction]
pub fn describe(name: &str) -> PyResult<String> {
    ssl_train::describe::objective(name).or_value()
}
