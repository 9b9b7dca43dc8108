//! The data file: one JSON document holding the whole registry, replaced atomically
//! (temporary file, fsync, rename, fsync of the directory) on every change.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::compat::Compatibility;
use crate::registry::{Registry, StoredSchema, Subject, SubjectVersion};
use crate::schema;

const FORMAT: u32 = 1;

/// Reading or writing the data file failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot read data file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },

    #[error("data file {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },

    #[error("cannot write data file {path}: {source}")]
    Write { path: PathBuf, source: io::Error },

    #[error("cannot encode the registry for data file {path}: {source}")]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },

    #[error("writing data file {path} did not finish: {reason}")]
    Interrupted { path: PathBuf, reason: String },
}

/// Where the registry lives on disk.
#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
}

impl Store {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Store { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the registry; a missing file is an empty registry.
    pub fn load(&self) -> Result<Registry, StoreError> {
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Registry::default()),
            Err(source) => {
                return Err(StoreError::Read {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let corrupt = |reason: String| StoreError::Corrupt {
            path: self.path.clone(),
            reason,
        };
        let file: DataFile = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        restore(file).map_err(corrupt)
    }

    /// Replaces the data file with `registry`, durably.
    pub async fn save(&self, registry: &Registry) -> Result<(), StoreError> {
        let mut bytes = serde_json::to_vec_pretty(&snapshot(registry)).map_err(|source| {
            StoreError::Encode {
                path: self.path.clone(),
                source,
            }
        })?;
        bytes.push(b'\n');
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            write_atomically(&path, &bytes).map_err(|source| StoreError::Write { path, source })
        })
        .await
        .map_err(|e| StoreError::Interrupted {
            path: self.path.clone(),
            reason: e.to_string(),
        })?
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir)?;
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&tmp, path)?;
    File::open(&dir)?.sync_all()
}

/// The data file's layout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DataFile {
    format: u32,
    compatibility: Compatibility,
    next_id: u32,
    schemas: Vec<FileSchema>,
    subjects: BTreeMap<String, Vec<FileVersion>>,
    #[serde(default)]
    subject_compatibility: BTreeMap<String, Compatibility>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSchema {
    id: u32,
    schema: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileVersion {
    version: u32,
    id: u32,
    #[serde(default)]
    deleted: bool,
}

fn snapshot(registry: &Registry) -> DataFile {
    DataFile {
        format: FORMAT,
        compatibility: registry.compatibility,
        next_id: registry.next_id,
        schemas: registry
            .schemas
            .iter()
            .map(|(id, s)| FileSchema {
                id: *id,
                schema: s.parsed.text.clone(),
            })
            .collect(),
        subjects: registry
            .subjects
            .iter()
            .map(|(name, subject)| {
                let versions = subject
                    .versions
                    .iter()
                    .map(|v| FileVersion {
                        version: v.version,
                        id: v.id,
                        deleted: v.deleted,
                    })
                    .collect();
                (name.clone(), versions)
            })
            .collect(),
        subject_compatibility: registry.subject_compatibility.clone(),
    }
}

/// Rebuilds the registry, checking everything a hand edit or a bug could have broken.
fn restore(file: DataFile) -> Result<Registry, String> {
    if file.format != FORMAT {
        return Err(format!(
            "format {} is not supported (expected {FORMAT})",
            file.format
        ));
    }
    if file.next_id == 0 {
        return Err("next_id must be at least 1".to_owned());
    }
    let mut schemas = BTreeMap::new();
    for entry in file.schemas {
        let parsed = schema::parse(&entry.schema)
            .map_err(|e| format!("schema {} does not parse: {e}", entry.id))?;
        if entry.id == 0 || entry.id >= file.next_id {
            return Err(format!(
                "schema id {} is outside 1..next_id ({})",
                entry.id, file.next_id
            ));
        }
        if schemas.insert(entry.id, StoredSchema { parsed }).is_some() {
            return Err(format!("schema id {} appears twice", entry.id));
        }
    }
    let mut subjects = BTreeMap::new();
    for (name, versions) in file.subjects {
        let mut last = 0;
        let mut subject = Subject::default();
        for v in versions {
            if v.version <= last {
                return Err(format!(
                    "subject '{name}': versions are not strictly increasing at {}",
                    v.version
                ));
            }
            if !schemas.contains_key(&v.id) {
                return Err(format!(
                    "subject '{name}' version {} refers to unknown schema id {}",
                    v.version, v.id
                ));
            }
            last = v.version;
            subject.versions.push(SubjectVersion {
                version: v.version,
                id: v.id,
                deleted: v.deleted,
            });
        }
        if subject.versions.is_empty() {
            return Err(format!("subject '{name}' has no versions"));
        }
        subjects.insert(name, subject);
    }
    Ok(Registry {
        compatibility: file.compatibility,
        next_id: file.next_id,
        schemas,
        subjects,
        subject_compatibility: file.subject_compatibility,
    })
}
