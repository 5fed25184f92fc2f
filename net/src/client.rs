//! The HTTP client every request of candle-ssl goes through: blocking, HTTP/1.1 over rustls with
//! ring's crypto, with candle-ssl's user agent.

use std::time::Duration;

use reqwest::blocking::{Client, ClientBuilder};

/// A blocking HTTP client builder with candle-ssl's user agent and a 30-s connect timeout; its
/// TLS is rustls with ring's crypto, installed as the process's provider on the first call.
pub fn http_client() -> ClientBuilder {
    // A provider installed before (by an earlier call) serves as well.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder()
        .user_agent(concat!("candle-ssl/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
}
