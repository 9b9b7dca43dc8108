//! Where the lake's tables live (docs/architecture.md, interfaces): `bronze/{schema}/{table}`,
//! `silver/{schema}/{table}`, `gold/{model}`, `quarantine/records`, `rules/...` under
//! `[lake] uri`.

use url::Url;

use crate::storage::{self, StorageOptions, SCHEMES};
use crate::LakeError;

/// The directory under `bronze/` (and `silver/`) of wal2delta's own tables.
pub const INTERNAL_SCHEMA: &str = "_wal2delta";

/// The lake root.
#[derive(Debug, Clone)]
pub struct Lake {
    root: Url,
}

impl Lake {
    /// `uri` is `file:///absolute/path` (or a plain absolute path), `s3://bucket/prefix`,
    /// `gs://bucket/prefix`, `az://container/prefix` (`abfss://` too) or `memory:///`,
    /// with no storage options (credentials then come from the environment, see
    /// [`Lake::with_options`]).
    pub fn new(uri: &str) -> Result<Self, LakeError> {
        Self::with_options(uri, StorageOptions::default())
    }

    /// [`Lake::new`] with the object store's options (endpoint, region, credentials...:
    /// object_store's keys). Options the environment also sets (`AWS_*`, `GOOGLE_*`,
    /// `AZURE_*`) are read from it by the store; these take precedence.
    pub fn with_options(uri: &str, options: StorageOptions) -> Result<Self, LakeError> {
        let root = Self::parse(uri)?;
        if let Ok(path) = root.to_file_path() {
            std::fs::create_dir_all(&path).map_err(|e| LakeError::Uri {
                uri: uri.to_owned(),
                reason: format!("cannot create the directory: {e}"),
            })?;
        }
        storage::register(&root, options);
        Ok(Lake { root })
    }

    /// The root URL `uri` names (see [`Lake::new`]), ending in `/`; creates, registers and
    /// contacts nothing (what the config check uses).
    pub fn parse(uri: &str) -> Result<Url, LakeError> {
        let bad = |reason: &str| LakeError::Uri {
            uri: uri.to_owned(),
            reason: reason.to_owned(),
        };
        let mut root = if uri.starts_with('/') {
            Url::from_directory_path(uri).map_err(|_| bad("not an absolute path"))?
        } else {
            Url::parse(uri).map_err(|e| bad(&e.to_string()))?
        };
        match root.scheme() {
            "file" => {
                root.to_file_path()
                    .map_err(|_| bad("a file:// URI needs an absolute path"))?;
            }
            "memory" => {}
            s if SCHEMES.contains(&s) => {
                if root.host_str().is_none_or(str::is_empty) {
                    return Err(bad(&format!(
                        "a {s}:// URI names its bucket or container: {s}://bucket/path"
                    )));
                }
            }
            other => {
                return Err(bad(&format!(
                    "scheme {other}:// is not supported; use file:///path, s3://bucket/path, gs://bucket/path, az://container/path or memory:///"
                )))
            }
        }
        if !root.path().ends_with('/') {
            let p = format!("{}/", root.path());
            root.set_path(&p);
        }
        Ok(root)
    }

    /// Whether a Delta table exists at `url` (a `_delta_log` is there).
    pub async fn table_exists(&self, url: &Url) -> Result<bool, LakeError> {
        storage::table_exists(url).await
    }

    /// The lake root URL.
    pub fn root(&self) -> &Url {
        &self.root
    }

    /// Refuses to write a lake another source writes (docs/operations.md, "Several
    /// databases, one lake"): the first Bronze writer records its source at the lake root
    /// ([`storage::SOURCE_MARKER`]), and a start with another source is refused with
    /// both named, before anything is read or written. (Each Bronze commit records its
    /// source too, which catches a lake shared before the marker existed.)
    pub async fn claim_source(&self, ours: &str) -> Result<(), LakeError> {
        let found = storage::claim_source(&self.root, ours).await?;
        if found != ours {
            return Err(LakeError::Source {
                table: format!("the lake at {}", self.root),
                found,
                ours: ours.to_owned(),
            });
        }
        Ok(())
    }

    /// Refuses a store on which two writers committing the same table version could both
    /// succeed (see [`storage`](crate::storage)), unless the operator declared this the
    /// only writer of the lake (`single_writer`).
    pub async fn check_commits_safe(&self, single_writer: bool) -> Result<(), LakeError> {
        if storage::probe_conditional_put(&self.root).await? {
            return Ok(());
        }
        if single_writer {
            tracing::warn!(lake = %self.root, "the object store ignores conditional writes (If-None-Match); running because [lake] single_writer = true: no second wal2delta process may write this lake");
            return Ok(());
        }
        Err(LakeError::Uri {
            uri: self.root.to_string(),
            reason: "the object store does not refuse to overwrite an existing object (If-None-Match: * was ignored), so two writers could both commit the same Delta version and one commit would be lost; use a store with conditional writes (AWS S3, R2, MinIO, GCS, Azure) or, if this process is the lake's only writer, set [lake] single_writer = true".into(),
        })
    }

    /// The table at `parts` under the root. Parts are path segments: a source table's
    /// `schema` and `table` are its identity ([`wal2delta_model::TableName::ident_parts`],
    /// the escaped name, made of `[a-z0-9_-]`), which pass unchanged. Any other character
    /// still becomes `_`, only as a guard so that a segment can never escape its layer.
    pub fn table(&self, parts: &[&str]) -> Url {
        let path: Vec<String> = parts.iter().map(|p| segment(p)).collect();
        // Joining a relative path of safe segments to a directory URL cannot fail.
        self.root
            .join(&format!("{}/", path.join("/")))
            .unwrap_or_else(|_| self.root.clone())
    }

    /// The Bronze table of a source table, by its identity parts.
    pub fn bronze(&self, schema: &str, table: &str) -> Url {
        self.table(&["bronze", schema, table])
    }

    /// The Silver table of a source table, by its identity parts.
    pub fn silver(&self, schema: &str, table: &str) -> Url {
        self.table(&["silver", schema, table])
    }

    /// The Gold table of a model.
    pub fn gold(&self, model: &str) -> Url {
        self.table(&["gold", model])
    }

    /// Delete tombstones of a Silver table (see `silver::tombstones`).
    pub fn silver_tombstones(&self, schema: &str, table: &str) -> Url {
        self.table(&["silver", INTERNAL_SCHEMA, "tombstones", schema, table])
    }

    /// The Bronze table of transaction records (END and WATERMARK, from capture's
    /// transactions topic). Not a source table: [`Lake::bronze_tables`] leaves it out.
    pub fn bronze_transactions(&self) -> Url {
        self.table(&["bronze", INTERNAL_SCHEMA, "transactions"])
    }

    /// Every Bronze table of a source table that exists: `(schema, table, url)` with the
    /// identity parts, sorted. Listed through the object store.
    pub async fn bronze_tables(&self) -> Result<Vec<(String, String, Url)>, LakeError> {
        let mut out = Vec::new();
        let bronze = self.table(&["bronze"]);
        for schema in storage::list_dirs(&bronze).await? {
            if schema == INTERNAL_SCHEMA {
                continue;
            }
            for table in storage::list_dirs(&self.table(&["bronze", &schema])).await? {
                let url = self.bronze(&schema, &table);
                if storage::table_exists(&url).await? {
                    out.push((schema.clone(), table, url));
                }
            }
        }
        Ok(out)
    }

    pub fn quarantine_records(&self) -> Url {
        self.table(&["quarantine", "records"])
    }

    /// `rules/transitions`: every row entering or leaving a rule (append-only).
    pub fn rules_transitions(&self) -> Url {
        self.table(&["rules", "transitions"])
    }

    /// `rules/versions`: the rule set's versions from the rules table, each with the LSN
    /// after which it is in effect (append-only).
    pub fn rules_versions(&self) -> Url {
        self.table(&["rules", "versions"])
    }

    /// `rules/hits`: the rules every row matches now.
    pub fn rules_hits(&self) -> Url {
        self.table(&["rules", "hits"])
    }

    /// `quarantine/resolutions`: one row per resolved record (replayed or resolved).
    pub fn quarantine_resolutions(&self) -> Url {
        self.table(&["quarantine", "resolutions"])
    }
}

fn segment(part: &str) -> String {
    let s: String = part
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_sit_under_the_root() {
        let dir = std::env::temp_dir().join(format!("w2d-lake-{}", std::process::id()));
        let lake = Lake::new(&format!("file://{}", dir.display())).unwrap();
        assert_eq!(
            lake.bronze("public", "pay ments").as_str(),
            format!("file://{}/bronze/public/pay_ments/", dir.display())
        );
        assert!(lake.table(&["..", "x"]).as_str().ends_with("/__/x/"));
        assert!(matches!(Lake::new("ftp://b/p"), Err(LakeError::Uri { .. })));
        assert!(matches!(Lake::new("s3:///p"), Err(LakeError::Uri { .. })));
        assert_eq!(
            Lake::new("s3://bucket/lake")
                .unwrap()
                .silver("public", "t")
                .as_str(),
            "s3://bucket/lake/silver/public/t/"
        );
        assert!(matches!(
            Lake::new("relative/dir"),
            Err(LakeError::Uri { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
