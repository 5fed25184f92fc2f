//! candle-ssl on the network.
//!
//! [`hub`] is a client of the Hugging Face Hub's HTTP API (upload, download, revisions);
//! [`card`] writes a run's model card; [`publish`] uploads a run's exported encoder with its
//! card; [`download`] fetches the public data sets candle-ssl reads, with their checksums.
//!
//! # Example
//!
//! The offline parts: reading an `hf://` model path, and the licence a model card declares for
//! weights trained on a data set (nothing here touches the network):
//!
//! ```
//! use ssl_hub::card::license;
//! use ssl_hub::hub::parse_hf_path;
//!
//! assert_eq!(
//!     parse_hf_path("hf://someone/vicreg-digits@v1"),
//!     Some(("someone/vicreg-digits".to_string(), Some("v1".to_string())))
//! );
//! assert_eq!(parse_hf_path("someone/vicreg-digits"), None); // a local path, not the Hub
//!
//! assert_eq!(license("bloodmnist", None)?, "cc-by-4.0");
//! assert_eq!(license("dermamnist", None)?, "cc-by-nc-4.0");
//! assert_eq!(license("folder", Some("MIT"))?, "mit");
//! // Images of unknown terms need a licence named by hand.
//! assert!(license("folder", None).is_err());
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod card;
pub mod download;
pub mod hub;
pub mod publish;
