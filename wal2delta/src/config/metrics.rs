//! `[metrics]`: the Prometheus endpoint.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Deserializer};

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Parsed while the file is read: a bad address fails there, named `metrics.listen`.
    #[serde(
        default = "MetricsConfig::default_listen",
        deserialize_with = "address"
    )]
    pub listen: SocketAddr,
}

fn address<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(|_| {
        serde::de::Error::custom("must be an address like 127.0.0.1:9187 (an IP and a port)")
    })
}

impl MetricsConfig {
    fn default_listen() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9187))
    }

    /// Where a client on this machine reaches the listener: a listener on every
    /// interface is asked on the loopback address.
    pub fn local_address(&self) -> SocketAddr {
        let ip = match self.listen.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        SocketAddr::new(ip, self.listen.port())
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: Self::default_listen(),
        }
    }
}
