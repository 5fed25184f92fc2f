//! candle-ssl on the network.
//!
//! [`client`] builds the HTTP client every request goes through (rustls with ring's crypto);
//! [`fetch`] downloads a file resumably, renaming it into place only once its MD5 matches;
//! [`hub`] is a client of the Hugging Face Hub's HTTP API (upload, download, revisions).
//!
//! # Example
//!
//! The offline parts: reading an `hf://` model path, and where a download's bytes go until they
//! are verified (nothing here touches the network):
//!
//! ```
//! use std::path::Path;
//! use ssl_net::fetch::part_path;
//! use ssl_net::hub::parse_hf_path;
//!
//! assert_eq!(
//!     parse_hf_path("hf://someone/vicreg-digits@v1"),
//!     Some(("someone/vicreg-digits".to_string(), Some("v1".to_string())))
//! );
//! assert_eq!(parse_hf_path("someone/vicreg-digits"), None); // a local path, not the Hub
//! assert_eq!(part_path(Path::new("data/cifar.tar.gz")), Path::new("data/cifar.tar.gz.part"));
//! ```

pub mod client;
pub mod fetch;
pub mod hub;
