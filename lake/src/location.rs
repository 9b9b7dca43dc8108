//! Where the lake's tables live (docs/architecture.md, interfaces): `bronze/{schema}/{table}`,
//! `silver/{schema}/{table}`, `gold/{model}`, `quarantine/records`, `rules/...` under
//! `[lake] uri`.

use url::Url;

use crate::LakeError;

/// The directory under `bronze/` (and `silver/`) of wal2delta's own tables.
pub const INTERNAL_SCHEMA: &str = "_wal2delta";

/// The lake root.
#[derive(Debug, Clone)]
pub struct Lake {
    root: Url,
}

impl Lake {
    /// `uri` is `file:///absolute/path` (or a plain absolute path). Object stores
    /// (`s3://`) are not built into this release.
    pub fn new(uri: &str) -> Result<Self, LakeError> {
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
                let path = root
                    .to_file_path()
                    .map_err(|_| bad("a file:// URI needs an absolute path"))?;
                std::fs::create_dir_all(&path)
                    .map_err(|e| bad(&format!("cannot create the directory: {e}")))?;
            }
            other => {
                return Err(bad(&format!(
                    "scheme {other}:// is not supported by this build; use file:///path"
                )))
            }
        }
        if !root.path().ends_with('/') {
            let p = format!("{}/", root.path());
            root.set_path(&p);
        }
        Ok(Lake { root })
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
    /// identity parts, sorted.
    pub fn bronze_tables(&self) -> Vec<(String, String, Url)> {
        let mut out = Vec::new();
        let Ok(root) = self.root.to_file_path() else {
            return out;
        };
        let dirs = |p: std::path::PathBuf| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            names.sort();
            names
        };
        for schema in dirs(root.join("bronze")) {
            if schema == INTERNAL_SCHEMA {
                continue;
            }
            for table in dirs(root.join("bronze").join(&schema)) {
                if root
                    .join("bronze")
                    .join(&schema)
                    .join(&table)
                    .join("_delta_log")
                    .is_dir()
                {
                    let url = self.bronze(&schema, &table);
                    out.push((schema.clone(), table, url));
                }
            }
        }
        out
    }

    pub fn quarantine_records(&self) -> Url {
        self.table(&["quarantine", "records"])
    }

    /// `rules/transitions`: every row entering or leaving a rule (append-only).
    pub fn rules_transitions(&self) -> Url {
        self.table(&["rules", "transitions"])
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
        assert!(matches!(Lake::new("s3://b/p"), Err(LakeError::Uri { .. })));
        assert!(matches!(
            Lake::new("relative/dir"),
            Err(LakeError::Uri { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
