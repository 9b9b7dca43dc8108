//! Decoding Confluent-framed Avro events with the writer schema from the registry.

use std::sync::Arc;

use apache_avro::types::Value;
use schema_registry_converter::async_impl::avro::AvroDecoder;
pub use schema_registry_converter::avro_common::AvroSchema;
use wal2delta_model::ErrorClass;

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

/// One decoded event.
pub struct Decoded {
    pub schema: Arc<AvroSchema>,
    pub value: Value,
}

/// Decodes event values; writer schemas are fetched once per id and cached.
pub struct EventDecoder {
    decoder: AvroDecoder,
}

impl EventDecoder {
    pub fn new(
        registry: &crate::registry_connection::RegistryConnection,
    ) -> Result<Self, StreamError> {
        Ok(EventDecoder {
            decoder: AvroDecoder::new(registry.sr_settings()?),
        })
    }

    pub async fn decode(&self, payload: &[u8]) -> Result<Decoded, DecodeError> {
        let Some((id, _)) = unframe(payload) else {
            return Err(DecodeError::NotFramed);
        };
        let schema = self.decoder.get_schema(id).await.map_err(|e| {
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
        match self.decoder.decode_with_schema(Some(payload)).await {
            Ok(Some(d)) => Ok(Decoded {
                schema,
                value: d.value,
            }),
            Ok(None) => Err(DecodeError::NotFramed),
            Err(e) if e.retriable => Err(DecodeError::RegistryUnavailable { reason: e.error }),
            Err(e) => Err(DecodeError::Corrupt {
                id,
                reason: e.error,
            }),
        }
    }
}
