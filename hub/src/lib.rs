//! candle-ssl on the network.
//!
//! [`hub`] is a client of the Hugging Face Hub's HTTP API (upload, download, revisions);
//! [`card`] writes a run's model card; [`publish`] uploads a run's exported encoder with its
//! card; [`download`] fetches the public data sets candle-ssl reads, with their checksums.

pub mod card;
pub mod download;
pub mod hub;
pub mod publish;
