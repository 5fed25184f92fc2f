//! Publishing a run on the Hugging Face Hub.
//!
//! [`card`] writes a run's model card; [`publish`] stages a run (its exported encoder, recipe,
//! evaluation and card) and uploads it through `ssl_net::hub`, or pulls one back.
//!
//! # Example
//!
//! The licence a model card declares for weights trained on a data set (nothing here touches the
//! network):
//!
//! ```
//! use ssl_data::DataSource;
//! use ssl_hub::card::license;
//!
//! let data = DataSource::parse;
//! assert_eq!(license(data("bloodmnist")?, None)?, "cc-by-4.0");
//! assert_eq!(license(data("dermamnist")?, None)?, "cc-by-nc-4.0");
//! assert_eq!(license(data("folder")?, Some("MIT"))?, "mit");
//! // Images of unknown terms need a licence named by hand.
//! assert!(license(data("folder")?, None).is_err());
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod card;
pub mod publish;
