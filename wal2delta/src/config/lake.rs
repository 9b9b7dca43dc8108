//! `[lake]`: where the Delta tables live.

use std::collections::BTreeMap;

use serde::Deserialize;
use wal2delta_lake::{Lake, LakeError, StorageOptions};

use super::{invalid, ConfigError};

/// `[lake]`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LakeConfig {
    /// `file:///path`, `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`
    /// (`abfss://` too) or `memory:///` (tests).
    pub uri: String,
    /// object_store options (`aws_endpoint_url`, `aws_region`, `aws_allow_http`,
    /// `google_service_account`, `azure_storage_account_name`...). Credentials belong in
    /// the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, instance or
    /// workload identity); values here are never printed.
    #[serde(default, deserialize_with = "scalar_map")]
    pub storage_options: BTreeMap<String, String>,
    /// This process is the lake's only writer: run on a store that ignores conditional
    /// writes (If-None-Match), where two writers could both commit the same Delta version.
    #[serde(default)]
    pub single_writer: bool,
    /// Seconds of Delta log kept for time travel, for every table of the lake: the stages'
    /// scheduled maintenance removes the log entries older than this (or than the
    /// table's own `delta.logRetentionDuration`, whichever is shorter) once a checkpoint
    /// makes them unnecessary. Unset: each table's own retention (30 days by default).
    /// The stages commit several times a second, and on a local or network filesystem
    /// every commit lists the whole log, so the log's length is a cost.
    #[serde(default)]
    pub log_retention_s: Option<u64>,
    /// `[source] name`, under which this source's tables live (set after loading).
    #[serde(skip)]
    pub namespace: Option<String>,
}

/// Keys only: option values may be credentials.
impl std::fmt::Debug for LakeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeConfig")
            .field("uri", &self.uri)
            .field("storage_options", &self.storage_options.keys())
            .field("single_writer", &self.single_writer)
            .field("log_retention_s", &self.log_retention_s)
            .finish()
    }
}

impl LakeConfig {
    /// The URI's form only ([`Lake::parse`]): nothing is created or contacted here (the
    /// stages open the lake and probe the store when they start).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.uri.contains("://") {
            return Err(invalid(
                "lake.uri",
                "must be a URI: file:///absolute/path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix",
            ));
        }
        Lake::parse(&self.uri).map_err(|e| invalid("lake.uri", e.to_string()))?;
        if let Some(k) = self.storage_options.keys().find(|k| k.trim().is_empty()) {
            return Err(invalid(
                "lake.storage_options",
                format!("an empty option name ({k:?})"),
            ));
        }
        if self.log_retention_s == Some(0) {
            return Err(invalid(
                "lake.log_retention_s",
                "must be at least 1 (seconds; 172800 keeps 2 days); leave it out to keep each table's own delta.logRetentionDuration (30 days by default)",
            ));
        }
        Ok(())
    }

    /// The log retention the stages' maintenance applies, if one is set.
    pub fn log_retention(&self) -> Option<std::time::Duration> {
        self.log_retention_s.map(std::time::Duration::from_secs)
    }

    /// The lake, its storage options registered for every table under it.
    #[allow(clippy::result_large_err)] // once per stage start or command
    pub fn open(&self) -> Result<Lake, LakeError> {
        Lake::with_options(
            &self.root(),
            StorageOptions(self.storage_options.clone().into_iter().collect()),
        )
    }

    /// [`open`](Self::open), then refuse a store on which concurrent Delta commits are not
    /// safe (unless `single_writer`): what every stage that writes the lake calls first.
    pub async fn open_for_writing(&self) -> Result<Lake, LakeError> {
        let lake = self.open()?;
        lake.check_commits_safe(self.single_writer).await?;
        Ok(lake)
    }

    /// The root of this source's tables: `uri`, or `{uri}/{[source] name}`.
    pub fn root(&self) -> String {
        match &self.namespace {
            Some(name) => format!("{}/{name}", self.uri.trim_end_matches('/')),
            None => self.uri.clone(),
        }
    }

    /// What `check-config` prints.
    pub fn summary(&self) -> String {
        let mut s = self.root();
        if !self.storage_options.is_empty() {
            let keys: Vec<&str> = self.storage_options.keys().map(String::as_str).collect();
            s.push_str(&format!(" (storage options: {})", keys.join(", ")));
        }
        if self.single_writer {
            s.push_str(" (single writer)");
        }
        if let Some(secs) = self.log_retention_s {
            s.push_str(&format!(" (log kept {secs} s)"));
        }
        s
    }
}

/// Option values as object_store takes them, text: `allow_http = true` and
/// `"true"` (what an environment override gives) are the same.
fn scalar_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Flag(bool),
        Int(i64),
        Float(f64),
    }
    let map = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Scalar::Text(s) => s,
                Scalar::Flag(b) => b.to_string(),
                Scalar::Int(i) => i.to_string(),
                Scalar::Float(f) => f.to_string(),
            };
            (k, v)
        })
        .collect())
}
