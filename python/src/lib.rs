//! `candle_ssl._native`: the extension module under the `candle_ssl` Python package.
//!
//! The package's Python files (`python/candle_ssl/`) give the public API its shape (keyword
//! arguments, `Run`, the data forms `train` accepts); this module does the work over the Rust
//! crates: training ([`train`]), loading and running trained encoders ([`encoder`]), the
//! evaluation metrics on feature matrices ([`eval`]), objectives' losses and their gradients
//! ([`losses`]) and the registries ([`registry`]).
//!
//! Every function that computes releases the GIL and runs through [`pools::run`], which keeps it
//! working in a process forked from one whose thread pools had started (their threads do not
//! survive `fork`). Errors become Python exceptions ([`errors`]).

use pyo3::prelude::*;

mod arrays;
mod encoder;
mod errors;
mod eval;
mod losses;
mod pools;
mod registry;
mod train;

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pools::record_start();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    m.add_class::<train::StepEvent>()?;
    m.add_class::<train::EpochEvent>()?;
    m.add_class::<encoder::Encoder>()?;
    m.add_function(wrap_pyfunction!(registry::objectives, m)?)?;
    m.add_function(wrap_pyfunction!(registry::encoders, m)?)?;
    m.add_function(wrap_pyfunction!(registry::describe, m)?)?;
    m.add_function(wrap_pyfunction!(losses::loss, m)?)?;
    m.add_function(wrap_pyfunction!(losses::loss_objectives, m)?)?;
    eval::register(m)?;
    m.add_function(wrap_pyfunction!(pools::forked, m)?)?;
    Ok(())
}
