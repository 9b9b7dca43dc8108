//! Schema registration and the Confluent wire format.
//!
//! Schemas are registered with `schema_registry_converter`'s `post_schema` (topic-name
//! strategy). Registered ids are cached per subject and schema text, so a schema is posted
//! once per process and again only when the table's shape changes.

use std::collections::HashMap;

use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use schema_registry_converter::async_impl::schema_registry::{post_schema, SrSettings};

use crate::registry_connection::{is_auth_refusal, RegistryConnection};
use schema_registry_converter::schema_registry_common::{SchemaType, SuppliedSchema};

use crate::StreamError;

/// Registers schemas and frames Avro values as `0x00 | schema id (u32 BE) | Avro datum`.
pub struct Registry {
    settings: SrSettings,
    connection: RegistryConnection,
    http: sr_reqwest::Client,
    ids: HashMap<(String, String), u32>,
}

impl Registry {
    pub fn new(connection: &RegistryConnection) -> Result<Self, StreamError> {
        Ok(Registry {
            settings: connection.sr_settings()?,
            http: connection.http()?,
            connection: connection.clone(),
            ids: HashMap::new(),
        })
    }

    /// [`Self::id_for`] for a table's key subject. A key schema refused as incompatible
    /// with an earlier version means the table gained, lost or changed its primary key
    /// (an `ADD PRIMARY KEY` on a table whose key was empty adds a field no old key has,
    /// which `BACKWARD` refuses). Old and new keys are then different identities that no
    /// schema evolution can relate, and every reader decodes a key with the schema its id
    /// names, so the subject's compatibility is set to `NONE` (the subject alone; value
    /// subjects keep theirs) and the schema registered again, instead of sending every
    /// later event of the table to the DLQ. `Ok((id, true))` when that happened.
    pub async fn key_id_for(
        &mut self,
        subject: &str,
        schema_json: &str,
    ) -> Result<(u32, bool), StreamError> {
        match self.id_for(subject, schema_json).await {
            Err(StreamError::RegistryRefused { reason, .. }) if reason.contains("409") => {
                self.set_compatibility(subject, "NONE").await.map_err(|e| {
                    StreamError::RegistryRefused {
                        subject: subject.to_owned(),
                        reason: format!("{reason}; and setting the subject's compatibility to NONE failed ({e}): set it by hand (PUT /config/{subject} {{\"compatibility\": \"NONE\"}}) and the table's next change registers its key"),
                    }
                })?;
                Ok((self.id_for(subject, schema_json).await?, true))
            }
            other => other.map(|id| (id, false)),
        }
    }

    /// `PUT /config/{subject}` with `level` (Confluent's subject-level compatibility).
    async fn set_compatibility(&self, subject: &str, level: &str) -> Result<(), String> {
        let url = config_url(self.connection.url(), subject)?;
        let response = self
            .connection
            .authorized(self.http.put(url))
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .body(serde_json::json!({ "compatibility": level }).to_string())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {}", response.status()))
        }
    }

    /// The id of `schema_json` under `subject`, registering it if needed.
    pub async fn id_for(&mut self, subject: &str, schema_json: &str) -> Result<u32, StreamError> {
        let cache_key = (subject.to_owned(), schema_json.to_owned());
        if let Some(id) = self.ids.get(&cache_key) {
            return Ok(*id);
        }
        let supplied = SuppliedSchema::new(None, SchemaType::Avro, schema_json.to_owned());
        match post_schema(&self.settings, subject.to_owned(), supplied).await {
            Ok(registered) => {
                self.ids.insert(cache_key, registered.id);
                Ok(registered.id)
            }
            Err(e) => {
                let reason = match &e.cause {
                    Some(c) => format!("{}: {c}", e.error),
                    None => e.error.clone(),
                };
                if is_auth_refusal(&reason) {
                    Err(StreamError::Refused {
                        what: "registry authentication",
                        reason,
                    })
                } else if e.retriable {
                    Err(StreamError::RegistryUnavailable { reason })
                } else {
                    Err(StreamError::RegistryRefused {
                        subject: subject.to_owned(),
                        reason,
                    })
                }
            }
        }
    }
}

/// `{base}/config/{subject}`, the subject percent-encoded as one path segment.
fn config_url(base: &str, subject: &str) -> Result<sr_reqwest::Url, String> {
    let mut url = sr_reqwest::Url::parse(base).map_err(|e| e.to_string())?;
    url.path_segments_mut()
        .map_err(|()| format!("{base} cannot take a path"))?
        .pop_if_empty()
        .extend(["config", subject]);
    Ok(url)
}

/// Frames a value in the Confluent wire format, validated against `schema` (capture
/// writes its events directly: [`crate::avro::binary::frame_change`]).
pub fn frame(schema_id: u32, schema: &Schema, value: Value) -> Result<Vec<u8>, apache_avro::Error> {
    let writer = GenericDatumWriter::builder(schema).build()?;
    let mut out = Vec::with_capacity(256);
    out.push(0);
    out.extend_from_slice(&schema_id.to_be_bytes());
    writer.write_value_ref(&mut out, &value)?;
    Ok(out)
}

/// Splits a Confluent-framed payload into schema id and Avro datum.
pub fn unframe(payload: &[u8]) -> Option<(u32, &[u8])> {
    if payload.len() < 5 || payload[0] != 0 {
        return None;
    }
    Some((
        u32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]),
        &payload[5..],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_urls_take_the_subject_as_one_segment() {
        assert_eq!(
            config_url("http://127.0.0.1:8081", "w2d.public.-4frder-20-49tems-key")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:8081/config/w2d.public.-4frder-20-49tems-key"
        );
        assert_eq!(
            config_url("http://r:1/registry/", "a/b c-key")
                .unwrap()
                .as_str(),
            "http://r:1/registry/config/a%2Fb%20c-key"
        );
    }

    #[test]
    fn frame_and_unframe() {
        let schema = Schema::parse_str(r#""long""#).unwrap();
        let bytes = frame(7, &schema, Value::Long(3)).unwrap();
        let (id, datum) = unframe(&bytes).unwrap();
        assert_eq!(id, 7);
        let v = apache_avro::reader::datum::GenericDatumReader::builder(&schema)
            .build()
            .unwrap()
            .read_value(&mut &datum[..])
            .unwrap();
        assert_eq!(v, Value::Long(3));
        assert!(unframe(&[1, 0, 0, 0, 7]).is_none());
        assert!(unframe(&[0, 0]).is_none());
    }
}
