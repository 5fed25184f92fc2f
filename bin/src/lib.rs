//! The `ssl` command line over the candle-ssl libraries: [`cli`] parses the arguments and runs
//! each subcommand with a short function over `ssl-train`, `ssl-experiments` and `ssl-hub`.
//! A program of its own can add objectives and keep the whole CLI with a three-line `main`
//! that calls [`cli::main`].

pub mod allocator;
pub mod cli;
