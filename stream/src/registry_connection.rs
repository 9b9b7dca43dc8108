//! How wal2delta reaches the schema registry: its URL, HTTP basic authentication (hosted
//! registries: Confluent Cloud's API key and secret, Aiven, Karapace behind a proxy) and
//! the certificate authorities trusted for `https://`.
//!
//! Capture's [`crate::registry::Registry`] and Bronze's [`crate::decode::EventDecoder`] are
//! both built from one [`RegistryConnection`].

use std::fmt;
use std::time::Duration;

use schema_registry_converter::async_impl::schema_registry::SrSettings;

use crate::StreamError;

/// How long one registry request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Default)]
pub struct RegistryConnection {
    url: String,
    username: Option<String>,
    password: Option<String>,
    /// PEM certificates trusted for the registry (in addition to none: when set, they
    /// are the roots reqwest adds to the system's).
    ca_pem: Option<Vec<u8>>,
}

impl RegistryConnection {
    pub fn plain(url: &str) -> Self {
        RegistryConnection {
            url: url.trim_end_matches('/').to_owned(),
            ..Default::default()
        }
    }

    pub fn with_basic_auth(mut self, username: &str, password: String) -> Self {
        self.username = Some(username.to_owned());
        self.password = Some(password);
        self
    }

    pub fn with_ca_pem(mut self, pem: Vec<u8>) -> Self {
        self.ca_pem = Some(pem);
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether there is anything to check before the first request (TLS or credentials).
    pub fn is_secured(&self) -> bool {
        self.url.starts_with("https://") || self.username.is_some()
    }

    fn client_builder(&self) -> Result<sr_reqwest::ClientBuilder, StreamError> {
        let mut b = sr_reqwest::Client::builder().timeout(TIMEOUT);
        if let Some(pem) = &self.ca_pem {
            for cert in
                sr_reqwest::Certificate::from_pem_bundle(pem).map_err(|e| StreamError::Refused {
                    what: "registry TLS",
                    reason: format!("the registry CA file holds no usable PEM certificate: {e}"),
                })?
            {
                b = b.add_root_certificate(cert);
            }
        }
        Ok(b)
    }

    /// Settings for schema_registry_converter's calls.
    pub fn sr_settings(&self) -> Result<SrSettings, StreamError> {
        let mut b = SrSettings::new_builder(self.url.clone());
        b.set_timeout(TIMEOUT);
        if let Some(user) = &self.username {
            b.set_basic_authorization(user, self.password.as_deref());
        }
        b.build_with(self.client_builder()?)
            .map_err(|e| StreamError::RegistryUnavailable { reason: e.error })
    }

    /// An HTTP client for the calls schema_registry_converter does not make; requests get
    /// the credentials through [`Self::authorized`].
    pub fn http(&self) -> Result<sr_reqwest::Client, StreamError> {
        self.client_builder()?
            .build()
            .map_err(|e| StreamError::RegistryUnavailable {
                reason: e.to_string(),
            })
    }

    /// `request` with the basic-auth header, when configured.
    pub fn authorized(&self, request: sr_reqwest::RequestBuilder) -> sr_reqwest::RequestBuilder {
        match &self.username {
            Some(user) => request.basic_auth(user, self.password.as_deref()),
            None => request,
        }
    }

    /// Asks the registry for its subjects once: refused credentials and a certificate that
    /// does not verify are [`StreamError::Refused`] (an operator must fix
    /// `[schema_registry]`, and every event would otherwise fail); a registry that does not
    /// answer is transient.
    pub async fn check(&self) -> Result<(), StreamError> {
        let response = self
            .authorized(self.http()?.get(format!("{}/subjects", self.url)))
            .send()
            .await
            .map_err(|e| {
                let chain = error_chain(&e);
                if chain.contains("certificate") || chain.contains("SSL") || chain.contains("TLS") {
                    StreamError::Refused {
                        what: "registry TLS",
                        reason: chain,
                    }
                } else {
                    StreamError::RegistryUnavailable { reason: chain }
                }
            })?;
        match response.status().as_u16() {
            401 | 403 => Err(StreamError::Refused {
                what: "registry authentication",
                reason: format!("the registry answered HTTP {}", response.status()),
            }),
            _ => Ok(()),
        }
    }
}

/// Whether a schema_registry_converter error is the registry refusing the credentials.
pub fn is_auth_refusal(error: &str) -> bool {
    error.contains("failed with status 401") || error.contains("failed with status 403")
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

impl fmt::Debug for RegistryConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryConnection")
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ca_pem", &self.ca_pem.as_ref().map(|p| p.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_never_shows() {
        let c = RegistryConnection::plain("https://r:8081/")
            .with_basic_auth("key", "sekret-registry-pw".into());
        assert_eq!(c.url(), "https://r:8081");
        assert!(c.is_secured());
        assert!(!format!("{c:?}").contains("sekret"));
        assert!(!RegistryConnection::plain("http://r:8081").is_secured());
    }

    #[test]
    fn refusals_are_recognised() {
        assert!(is_auth_refusal(
            "HTTP request to schema registry failed with status 401 Unauthorized"
        ));
        assert!(!is_auth_refusal(
            "HTTP request to schema registry failed with status 409 Conflict"
        ));
    }
}
