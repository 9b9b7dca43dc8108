//! The registry itself: subjects, their versions, global schema ids and compatibility
//! settings, held in memory. Persistence is `store`'s job; HTTP is `api`'s.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::Serialize;

use crate::compat::{self, Compatibility, Earlier};
use crate::error::RegistryError;
use crate::schema::ParsedSchema;

/// A schema under a global id. Ids are never reused and never forgotten, so a consumer can
/// always decode old data, even after its subject was deleted.
#[derive(Debug, Clone)]
pub struct StoredSchema {
    pub parsed: ParsedSchema,
}

/// One version of a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubjectVersion {
    pub version: u32,
    pub id: u32,
    /// Soft-deleted: hidden unless asked for with `deleted=true`.
    pub deleted: bool,
}

/// A subject's versions, oldest first; version numbers only grow.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub versions: Vec<SubjectVersion>,
}

impl Subject {
    fn live(&self) -> impl DoubleEndedIterator<Item = &SubjectVersion> {
        self.versions.iter().filter(|v| !v.deleted)
    }

    fn visible(&self, include_deleted: bool) -> impl DoubleEndedIterator<Item = &SubjectVersion> {
        self.versions
            .iter()
            .filter(move |v| include_deleted || !v.deleted)
    }
}

/// A version as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    pub subject: String,
    pub version: u32,
    pub id: u32,
    pub schema: String,
}

/// Which version a request means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionSelector {
    Latest,
    Number(u32),
}

impl FromStr for VersionSelector {
    type Err = RegistryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "latest" || s == "-1" {
            return Ok(VersionSelector::Latest);
        }
        match s.parse::<i32>() {
            Ok(n) if n >= 1 => Ok(VersionSelector::Number(n.unsigned_abs())),
            _ => Err(RegistryError::InvalidVersion(s.to_owned())),
        }
    }
}

/// The outcome of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The subject already had this schema; nothing changed.
    Existing { id: u32, version: u32 },
    /// A new version was added (with a new id, or the id this schema has under another subject).
    Added { id: u32, version: u32 },
}

impl Registration {
    pub fn id(self) -> u32 {
        match self {
            Registration::Existing { id, .. } | Registration::Added { id, .. } => id,
        }
    }
}

/// All the registry's state.
#[derive(Debug, Clone)]
pub struct Registry {
    pub(crate) compatibility: Compatibility,
    pub(crate) next_id: u32,
    pub(crate) schemas: BTreeMap<u32, StoredSchema>,
    pub(crate) subjects: BTreeMap<String, Subject>,
    pub(crate) subject_compatibility: BTreeMap<String, Compatibility>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            compatibility: Compatibility::default(),
            next_id: 1,
            schemas: BTreeMap::new(),
            subjects: BTreeMap::new(),
            subject_compatibility: BTreeMap::new(),
        }
    }
}

impl Registry {
    /// Registers `schema` under `subject`: returns the existing version if the subject already
    /// has this schema, refuses it if the subject's compatibility level forbids it, and
    /// otherwise adds a version, reusing the schema's global id if any subject has it.
    pub fn register(
        &mut self,
        subject: &str,
        schema: &ParsedSchema,
    ) -> Result<Registration, RegistryError> {
        if let Some(existing) = self.find_in_subject(subject, schema, false) {
            return Ok(Registration::Existing {
                id: existing.id,
                version: existing.version,
            });
        }
        let level = self.effective_compatibility(subject);
        let messages = compat::check_against_history(level, &schema.schema, &self.history(subject));
        if !messages.is_empty() {
            return Err(RegistryError::Incompatible {
                subject: subject.to_owned(),
                level,
                messages,
            });
        }
        let id = match self.id_of(schema) {
            Some(id) => id,
            None => self.allocate(schema)?,
        };
        let entry = self.subjects.entry(subject.to_owned()).or_default();
        let version = entry
            .versions
            .last()
            .map_or(1, |v| v.version.saturating_add(1));
        entry.versions.push(SubjectVersion {
            version,
            id,
            deleted: false,
        });
        Ok(Registration::Added { id, version })
    }

    /// The version of `subject` that has `schema`.
    pub fn lookup(
        &self,
        subject: &str,
        schema: &ParsedSchema,
        include_deleted: bool,
    ) -> Result<VersionInfo, RegistryError> {
        self.visible_subject(subject, include_deleted)?;
        let found = self
            .find_in_subject(subject, schema, include_deleted)
            .ok_or_else(|| RegistryError::SchemaNotFoundInSubject(subject.to_owned()))?;
        self.info(subject, found)
    }

    /// The schema text under a global id.
    pub fn schema_text(&self, id: u32) -> Result<&str, RegistryError> {
        self.schemas
            .get(&id)
            .map(|s| s.parsed.text.as_str())
            .ok_or_else(|| RegistryError::SchemaIdNotFound(id.to_string()))
    }

    /// The (subject, version) pairs that use a global id.
    pub fn usages(
        &self,
        id: u32,
        include_deleted: bool,
    ) -> Result<Vec<(String, u32)>, RegistryError> {
        self.schema_text(id)?;
        Ok(self
            .subjects
            .iter()
            .flat_map(|(name, subject)| {
                subject
                    .visible(include_deleted)
                    .filter(move |v| v.id == id)
                    .map(move |v| (name.clone(), v.version))
            })
            .collect())
    }

    /// Subject names, sorted; soft-deleted subjects only with `include_deleted`.
    pub fn subject_names(&self, include_deleted: bool) -> Vec<String> {
        self.subjects
            .iter()
            .filter(|(_, s)| s.visible(include_deleted).next().is_some())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// A subject's version numbers, oldest first.
    pub fn versions(
        &self,
        subject: &str,
        include_deleted: bool,
    ) -> Result<Vec<u32>, RegistryError> {
        let found = self.visible_subject(subject, include_deleted)?;
        Ok(found.visible(include_deleted).map(|v| v.version).collect())
    }

    /// One version of a subject.
    pub fn version(
        &self,
        subject: &str,
        selector: VersionSelector,
        include_deleted: bool,
    ) -> Result<VersionInfo, RegistryError> {
        let found = self.visible_subject(subject, include_deleted)?;
        let mut candidates = found.visible(include_deleted);
        let hit = match selector {
            VersionSelector::Latest => candidates.next_back(),
            VersionSelector::Number(n) => candidates.find(|v| v.version == n),
        };
        let hit = hit.ok_or_else(|| RegistryError::VersionNotFound {
            subject: subject.to_owned(),
            version: match selector {
                VersionSelector::Latest => "latest".to_owned(),
                VersionSelector::Number(n) => n.to_string(),
            },
        })?;
        self.info(subject, *hit)
    }

    /// Soft-deletes every version of a subject, or with `permanent` forgets a subject that was
    /// soft-deleted before. Returns the version numbers deleted. Global ids stay readable.
    pub fn delete_subject(
        &mut self,
        subject: &str,
        permanent: bool,
    ) -> Result<Vec<u32>, RegistryError> {
        let found = self
            .subjects
            .get_mut(subject)
            .ok_or_else(|| RegistryError::SubjectNotFound(subject.to_owned()))?;
        let has_live = found.live().next().is_some();
        if permanent {
            if has_live {
                return Err(RegistryError::SubjectNotSoftDeleted(subject.to_owned()));
            }
            let versions = found.versions.iter().map(|v| v.version).collect();
            self.subjects.remove(subject);
            self.subject_compatibility.remove(subject);
            return Ok(versions);
        }
        if !has_live {
            return Err(RegistryError::SubjectSoftDeleted(subject.to_owned()));
        }
        let mut deleted = Vec::new();
        for v in found.versions.iter_mut().filter(|v| !v.deleted) {
            v.deleted = true;
            deleted.push(v.version);
        }
        Ok(deleted)
    }

    /// Checks `schema` against one version of `subject` in the direction(s) the subject's
    /// level demands. Returns the violations; empty means compatible.
    pub fn check_against_version(
        &self,
        subject: &str,
        selector: VersionSelector,
        schema: &ParsedSchema,
    ) -> Result<Vec<String>, RegistryError> {
        let target = self.version(subject, selector, false)?;
        let stored = self.stored(target.id)?;
        let earlier = Earlier {
            version: target.version,
            schema: &stored.parsed.schema,
        };
        let level = self.effective_compatibility(subject);
        Ok(compat::check_against(level, &schema.schema, &earlier))
    }

    /// Checks `schema` as registering it would: against the latest live version, or all of
    /// them for a transitive level. A subject with no versions accepts anything.
    pub fn check_against_subject(&self, subject: &str, schema: &ParsedSchema) -> Vec<String> {
        let level = self.effective_compatibility(subject);
        compat::check_against_history(level, &schema.schema, &self.history(subject))
    }

    pub fn global_compatibility(&self) -> Compatibility {
        self.compatibility
    }

    pub fn set_global_compatibility(&mut self, level: Compatibility) {
        self.compatibility = level;
    }

    /// The subject's own level, if one was set.
    pub fn subject_compatibility(&self, subject: &str) -> Option<Compatibility> {
        self.subject_compatibility.get(subject).copied()
    }

    pub fn set_subject_compatibility(&mut self, subject: &str, level: Compatibility) {
        self.subject_compatibility.insert(subject.to_owned(), level);
    }

    /// Removes the subject's own level, returning it.
    pub fn clear_subject_compatibility(
        &mut self,
        subject: &str,
    ) -> Result<Compatibility, RegistryError> {
        self.subject_compatibility
            .remove(subject)
            .ok_or_else(|| RegistryError::SubjectCompatibilityNotConfigured(subject.to_owned()))
    }

    /// The level that applies to a subject: its own, else the global one.
    pub fn effective_compatibility(&self, subject: &str) -> Compatibility {
        self.subject_compatibility(subject)
            .unwrap_or(self.compatibility)
    }

    fn visible_subject(
        &self,
        subject: &str,
        include_deleted: bool,
    ) -> Result<&Subject, RegistryError> {
        self.subjects
            .get(subject)
            .filter(|s| s.visible(include_deleted).next().is_some())
            .ok_or_else(|| RegistryError::SubjectNotFound(subject.to_owned()))
    }

    fn find_in_subject(
        &self,
        subject: &str,
        schema: &ParsedSchema,
        include_deleted: bool,
    ) -> Option<SubjectVersion> {
        let found = self.subjects.get(subject)?;
        let hit = found.visible(include_deleted).rev().find(|v| {
            self.schemas
                .get(&v.id)
                .is_some_and(|s| s.parsed.identity == schema.identity)
        });
        hit.copied()
    }

    /// The subject's live versions with their schemas, oldest first.
    fn history(&self, subject: &str) -> Vec<Earlier<'_>> {
        let Some(found) = self.subjects.get(subject) else {
            return Vec::new();
        };
        found
            .live()
            .filter_map(|v| {
                self.schemas.get(&v.id).map(|s| Earlier {
                    version: v.version,
                    schema: &s.parsed.schema,
                })
            })
            .collect()
    }

    fn id_of(&self, schema: &ParsedSchema) -> Option<u32> {
        self.schemas
            .iter()
            .find(|(_, s)| s.parsed.identity == schema.identity)
            .map(|(id, _)| *id)
    }

    fn allocate(&mut self, schema: &ParsedSchema) -> Result<u32, RegistryError> {
        let id = self.next_id;
        self.next_id = id.checked_add(1).ok_or(RegistryError::IdsExhausted)?;
        self.schemas.insert(
            id,
            StoredSchema {
                parsed: schema.clone(),
            },
        );
        Ok(id)
    }

    fn stored(&self, id: u32) -> Result<&StoredSchema, RegistryError> {
        self.schemas
            .get(&id)
            .ok_or_else(|| RegistryError::SchemaIdNotFound(id.to_string()))
    }

    fn info(&self, subject: &str, version: SubjectVersion) -> Result<VersionInfo, RegistryError> {
        Ok(VersionInfo {
            subject: subject.to_owned(),
            version: version.version,
            id: version.id,
            schema: self.schema_text(version.id)?.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    fn record(fields: &str) -> ParsedSchema {
        schema::parse(&format!(
            r#"{{"type":"record","name":"R","fields":[{fields}]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn versions_keep_counting_after_a_soft_delete() {
        let mut registry = Registry::default();
        let v1 = record(r#"{"name":"a","type":"int"}"#);
        registry.register("s", &v1).unwrap();
        assert_eq!(registry.delete_subject("s", false).unwrap(), vec![1]);
        assert!(matches!(
            registry.versions("s", false),
            Err(RegistryError::SubjectNotFound(_))
        ));
        assert_eq!(registry.versions("s", true).unwrap(), vec![1]);
        assert_eq!(
            registry.register("s", &v1).unwrap(),
            Registration::Added { id: 1, version: 2 }
        );
    }

    #[test]
    fn permanent_delete_needs_a_soft_delete_first() {
        let mut registry = Registry::default();
        registry
            .register("s", &record(r#"{"name":"a","type":"int"}"#))
            .unwrap();
        assert!(matches!(
            registry.delete_subject("s", true),
            Err(RegistryError::SubjectNotSoftDeleted(_))
        ));
        registry.delete_subject("s", false).unwrap();
        assert!(matches!(
            registry.delete_subject("s", false),
            Err(RegistryError::SubjectSoftDeleted(_))
        ));
        assert_eq!(registry.delete_subject("s", true).unwrap(), vec![1]);
        assert!(registry.subject_names(true).is_empty());
        assert!(
            registry.schema_text(1).is_ok(),
            "ids outlive their subjects"
        );
    }

    #[test]
    fn version_selector_parses_latest_and_positive_numbers_only() {
        assert_eq!(
            "latest".parse::<VersionSelector>().unwrap(),
            VersionSelector::Latest
        );
        assert_eq!(
            "-1".parse::<VersionSelector>().unwrap(),
            VersionSelector::Latest
        );
        assert_eq!(
            "3".parse::<VersionSelector>().unwrap(),
            VersionSelector::Number(3)
        );
        for bad in ["0", "-2", "x", "", "99999999999"] {
            assert!(
                matches!(
                    bad.parse::<VersionSelector>(),
                    Err(RegistryError::InvalidVersion(_))
                ),
                "{bad}"
            );
        }
    }
}
