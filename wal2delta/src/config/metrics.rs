//! `[metrics]`: the Prometheus endpoint.

use std::net::SocketAddr;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    #[serde(default = "MetricsConfig::default_listen")]
    pub listen: String,
}

impl MetricsConfig {
    fn default_listen() -> String {
        "127.0.0.1:9187".into()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|_| invalid("metrics.listen", "must be an address like 127.0.0.1:9187"))?;
        Ok(())
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: Self::default_listen(),
        }
    }
}
