//! The registry's errors and the Confluent error codes they map to.
//!
//! Every error reaches the client as `{"error_code": N, "message": "..."}`, with the HTTP
//! status taken from the first three digits of the code, as Confluent Schema Registry does.

use crate::compat::Compatibility;
use crate::store::StoreError;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("Subject '{0}' not found.")]
    SubjectNotFound(String),

    #[error("Version {version} not found for subject '{subject}'.")]
    VersionNotFound { subject: String, version: String },

    #[error("Schema not found under subject '{0}'.")]
    SchemaNotFoundInSubject(String),

    #[error("Schema {0} not found.")]
    SchemaIdNotFound(String),

    #[error("Subject '{0}' was soft deleted. Set permanent=true to delete permanently.")]
    SubjectSoftDeleted(String),

    #[error("Subject '{0}' was not deleted first before being permanently deleted.")]
    SubjectNotSoftDeleted(String),

    #[error("Subject '{0}' does not have subject-level compatibility configured.")]
    SubjectCompatibilityNotConfigured(String),

    #[error("Invalid schema: {0}")]
    InvalidSchema(String),

    #[error(
        "The specified version '{0}' is not a valid version id. \
         Allowed values are between [1, 2^31-1] and the string \"latest\"."
    )]
    InvalidVersion(String),

    #[error("Invalid compatibility level '{0}'. Valid values are: {levels}.", levels = Compatibility::NAMES.join(", "))]
    InvalidCompatibility(String),

    #[error(
        "Schema being registered is incompatible with an earlier schema for subject '{subject}' \
         (compatibility {level}): {}",
        messages.join("; ")
    )]
    Incompatible {
        subject: String,
        level: Compatibility,
        messages: Vec<String>,
    },

    #[error("Unprocessable request: {0}")]
    Unprocessable(String),

    #[error("Error in the backend data store: {0}")]
    Store(#[from] StoreError),

    #[error("Error in the backend data store: schema ids are exhausted.")]
    IdsExhausted,

    #[error("HTTP 404 Not Found")]
    RouteNotFound,

    #[error("HTTP 405 Method Not Allowed")]
    MethodNotAllowed,
}

impl RegistryError {
    /// Confluent's error code for this error.
    pub fn error_code(&self) -> u32 {
        match self {
            RegistryError::SubjectNotFound(_) => 40401,
            RegistryError::VersionNotFound { .. } => 40402,
            RegistryError::SchemaNotFoundInSubject(_) | RegistryError::SchemaIdNotFound(_) => 40403,
            RegistryError::SubjectSoftDeleted(_) => 40404,
            RegistryError::SubjectNotSoftDeleted(_) => 40405,
            RegistryError::SubjectCompatibilityNotConfigured(_) => 40408,
            RegistryError::InvalidSchema(_) => 42201,
            RegistryError::InvalidVersion(_) => 42202,
            RegistryError::InvalidCompatibility(_) => 42203,
            RegistryError::Incompatible { .. } => 409,
            RegistryError::Unprocessable(_) => 422,
            RegistryError::Store(_) | RegistryError::IdsExhausted => 50001,
            RegistryError::RouteNotFound => 404,
            RegistryError::MethodNotAllowed => 405,
        }
    }

    /// The HTTP status: the error code's first three digits.
    pub fn http_status(&self) -> u16 {
        let mut code = self.error_code();
        while code >= 1000 {
            code /= 10;
        }
        u16::try_from(code).unwrap_or(500)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_status_is_the_codes_first_three_digits() {
        assert_eq!(
            RegistryError::SubjectNotFound("s".into()).http_status(),
            404
        );
        assert_eq!(RegistryError::InvalidSchema("x".into()).http_status(), 422);
        assert_eq!(RegistryError::IdsExhausted.http_status(), 500);
        let incompatible = RegistryError::Incompatible {
            subject: "s".into(),
            level: Compatibility::Backward,
            messages: vec!["why".into()],
        };
        assert_eq!(incompatible.http_status(), 409);
        assert_eq!(incompatible.error_code(), 409);
    }
}
