//! Decoding Confluent-framed Avro events with the writer schema from the registry.
//!
//! Events are read with the *lake's view* of their writer schema: the registered text with
//! the Avro logical type of every temporal semantic name added
//! ([`crate::avro::temporal::with_logical_types`]). Logical types do not change the binary
//! encoding, so the bytes read exactly as written; dates and timestamps then decode to the
//! same `Value` variants whether the event was written with today's schemas (plain
//! `int`/`long` with `connect.name`) or with older ones (logical types in the registered
//! schema), and the Arrow mapping sees one shape for both.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::Schema;
use schema_registry_converter::async_impl::avro::AvroDecoder;
use wal2delta_model::ErrorClass;

use crate::avro::arrow::ArrowMappingError;
use crate::avro::columnar::{EnvelopePlan, EventPosition, KeyPlan};
use crate::avro::temporal::with_logical_types_text;

use crate::registry::unframe;
use crate::StreamError;

/// Why one event could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The payload is not Confluent-framed Avro (no magic byte, too short, or empty).
    #[error("payload is not Confluent-framed Avro")]
    NotFramed,
    /// The registry does not know the schema id, or its schema cannot be parsed.
    #[error("schema id {id} cannot be used: {reason}")]
    UnknownSchema { id: u32, reason: String },
    /// The bytes do not match the schema they name.
    #[error("Avro datum does not match schema id {id}: {reason}")]
    Corrupt { id: u32, reason: String },
    /// The registry is unreachable: nothing is wrong with the event.
    #[error("the schema registry is unavailable: {reason}")]
    RegistryUnavailable { reason: String },
    /// The registry refused the credentials: no event can be decoded until an operator
    /// fixes `[schema_registry]`, so none may be quarantined for it.
    #[error("the schema registry refused the credentials: {reason}")]
    RegistryRefused { reason: String },
}

impl DecodeError {
    pub fn class(&self) -> ErrorClass {
        match self {
            DecodeError::RegistryUnavailable { .. } => ErrorClass::Transient,
            DecodeError::RegistryRefused { .. } => ErrorClass::Operator,
            _ => ErrorClass::Record,
        }
    }

    /// What an operator should check, for an error that needs one.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            DecodeError::RegistryRefused { .. } => Some(
                "check [schema_registry] username and the password its password_env or password_file names",
            ),
            _ => None,
        }
    }

    /// The quarantine reason code.
    pub fn reason_code(&self) -> &'static str {
        match self {
            DecodeError::NotFramed => "not_framed",
            DecodeError::UnknownSchema { .. } => "unknown_schema",
            DecodeError::Corrupt { .. } => "corrupt_payload",
            DecodeError::RegistryUnavailable { .. } => "registry_unavailable",
            DecodeError::RegistryRefused { .. } => "registry_refused",
        }
    }
}

/// The schema an event was read with: its registry id and the lake's view of the
/// registered schema (see the module doc), with the plans that read its events straight
/// into Bronze's columns ([`crate::avro::columnar`]), compiled on first use.
#[derive(Debug)]
pub struct ReadSchema {
    pub id: u32,
    pub parsed: Schema,
    envelope: OnceLock<Result<Arc<EnvelopePlan>, ArrowMappingError>>,
    key: OnceLock<Result<Arc<KeyPlan>, ArrowMappingError>>,
}

impl ReadSchema {
    pub fn new(id: u32, parsed: Schema) -> Self {
        ReadSchema {
            id,
            parsed,
            envelope: OnceLock::new(),
            key: OnceLock::new(),
        }
    }

    /// How change envelopes written with this schema are read into columns.
    pub fn envelope_plan(&self) -> Result<Arc<EnvelopePlan>, ArrowMappingError> {
        self.envelope
            .get_or_init(|| EnvelopePlan::new(&self.parsed, self.id).map(Arc::new))
            .clone()
    }

    /// `source.lsn`, `source.commit_lsn` and `ordinal` of an event whose columns could not
    /// be built (its schema has no plan, or one value cannot be held), through
    /// apache-avro's generic decoding: a cold path, so that the quarantine record still
    /// places the change in its transaction. All `None` if the datum does not decode.
    pub fn position_of(&self, datum: &[u8]) -> EventPosition {
        let Ok(reader) = GenericDatumReader::builder(&self.parsed).build() else {
            return EventPosition::default();
        };
        let Ok(Value::Record(fields)) = reader.read_value(&mut &datum[..]) else {
            return EventPosition::default();
        };
        let long = |fs: &[(String, Value)], name: &str| match fs.iter().find(|(n, _)| n == name) {
            Some((_, Value::Long(l))) => Some(*l),
            Some((_, Value::Union(_, v))) => match v.as_ref() {
                Value::Long(l) => Some(*l),
                _ => None,
            },
            _ => None,
        };
        let source = match fields.iter().find(|(n, _)| n == "source") {
            Some((_, Value::Record(s))) => Some(s.as_slice()),
            _ => None,
        };
        EventPosition {
            lsn: source.and_then(|s| long(s, "lsn")),
            commit_lsn: source.and_then(|s| long(s, "commit_lsn")),
            ordinal: long(&fields, wal2delta_model::bronze::ORDINAL),
        }
    }

    /// How Kafka keys written with this schema are read into the `key` column.
    pub fn key_plan(&self) -> Result<Arc<KeyPlan>, ArrowMappingError> {
        self.key
            .get_or_init(|| KeyPlan::new(&self.parsed).map(Arc::new))
            .clone()
    }
}

/// One decoded event.
pub struct Decoded {
    pub schema: Arc<ReadSchema>,
    pub value: Value,
}

/// A schema id's reader, built once.
struct Reader {
    schema: Arc<ReadSchema>,
    /// Reads with a `'static` copy of `schema.parsed`: apache-avro's resolved reader borrows
    /// its schema, and the copy is leaked so the reader can live in the cache. One copy per
    /// schema id this decoder ever sees, which stays resident for the process's lifetime
    /// (as the registry client's own caches do), so the leak is bounded by the number of
    /// schema versions.
    reader: GenericDatumReader<'static>,
}

/// Decodes event values; writer schemas are fetched once per id and cached.
pub struct EventDecoder {
    decoder: AvroDecoder,
    readers: Mutex<HashMap<u32, Arc<Reader>>>,
}

impl EventDecoder {
    pub fn new(
        registry: &crate::registry_connection::RegistryConnection,
    ) -> Result<Self, StreamError> {
        Ok(EventDecoder {
            decoder: AvroDecoder::new(registry.sr_settings()?),
            readers: Mutex::new(HashMap::new()),
        })
    }

    /// The schema `payload` was written with, without decoding it: Bronze reads the datum
    /// straight into columns ([`ReadSchema::envelope_plan`]).
    pub async fn resolve(&self, payload: &[u8]) -> Result<Arc<ReadSchema>, DecodeError> {
        let Some((id, _)) = unframe(payload) else {
            return Err(DecodeError::NotFramed);
        };
        Ok(self.reader(id).await?.schema.clone())
    }

    pub async fn decode(&self, payload: &[u8]) -> Result<Decoded, DecodeError> {
        let Some((id, mut datum)) = unframe(payload) else {
            return Err(DecodeError::NotFramed);
        };
        let reader = self.reader(id).await?;
        let value = reader
            .reader
            .read_value(&mut datum)
            .map_err(|e| DecodeError::Corrupt {
                id,
                reason: e.to_string(),
            })?;
        Ok(Decoded {
            schema: reader.schema.clone(),
            value,
        })
    }

    /// The reader of schema `id`: fetched from the registry on first use, then cached.
    async fn reader(&self, id: u32) -> Result<Arc<Reader>, DecodeError> {
        if let Some(r) = self.cached(id) {
            return Ok(r);
        }
        let registered = self.decoder.get_schema(id).await.map_err(|e| {
            let reason = match &e.cause {
                Some(c) => format!("{}: {c}", e.error),
                None => e.error.clone(),
            };
            if crate::registry_connection::is_auth_refusal(&reason) {
                DecodeError::RegistryRefused { reason }
            } else if e.retriable {
                DecodeError::RegistryUnavailable { reason }
            } else {
                DecodeError::UnknownSchema { id, reason }
            }
        })?;
        let unknown = |reason: String| DecodeError::UnknownSchema { id, reason };
        let parsed = match with_logical_types_text(&registered.raw) {
            Some(text) => Schema::parse_str(&text).map_err(|e| unknown(e.to_string()))?,
            None => registered.parsed.clone(),
        };
        let leaked: &'static Schema = Box::leak(Box::new(parsed.clone()));
        let reader = GenericDatumReader::builder(leaked)
            .build()
            .map_err(|e| unknown(e.to_string()))?;
        let built = Arc::new(Reader {
            schema: Arc::new(ReadSchema::new(id, parsed)),
            reader,
        });
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        Ok(readers.entry(id).or_insert(built).clone())
    }

    fn cached(&self, id: u32) -> Option<Arc<Reader>> {
        let readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        readers.get(&id).cloned()
    }
}
