//! The `ssl` command line over the candle-ssl libraries: [`cli`] parses the arguments and runs
//! each subcommand with a short function over `ssl-train`, `ssl-experiments` and `ssl-hub`.
//! A program of its own can add objectives and keep the whole CLI with a three-line `main`
//! that calls [`cli::main`]:
//!
//! ```no_run
//! // main.rs of a program whose crate links objectives of its own (each registered with
//! // `ssl_core::register_objective!`): `ssl list` names them beside the built-in ones.
//! fn main() -> std::process::ExitCode {
//!     ssl::cli::main()
//! }
//! ```
//!
//! # Example
//!
//! The arguments of `ssl run` resolved to the configuration it would train with (no run is
//! started):
//!
//! ```
//! use clap::Parser;
//! use ssl::cli::{resolve, Cli, Command};
//!
//! let run_args = |line: &str| -> anyhow::Result<_> {
//!     match Cli::try_parse_from(line.split(' '))?.command {
//!         Some(Command::Run(args)) => Ok(args),
//!         other => anyhow::bail!("not `ssl run`: {other:?}"),
//!     }
//! };
//! let args = run_args("ssl run --objective simclr --epochs 3 --set train.lr=0.01")?;
//! let cfg = resolve(&args, None)?;
//! assert_eq!(cfg.objective.name, "simclr");
//! assert_eq!((cfg.train.epochs, cfg.train.lr), (3, 0.01));
//!
//! // A flag and a `--set` that disagree are refused, not one of them guessed.
//! let args = run_args("ssl run --epochs 3 --set train.epochs=4")?;
//! assert!(resolve(&args, None).is_err());
//! // So is a value the flag cannot take, naming the key it sets.
//! let err = run_args("ssl run --epochs 2.5").unwrap_err();
//! assert!(err.to_string().contains("train.epochs"));
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod cli;
