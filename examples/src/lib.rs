//! candle-ssl's examples of the library: see the `examples` listed in this package's
//! `Cargo.toml` and the README's "As a library" section. `tests/examples.rs` runs each one.
