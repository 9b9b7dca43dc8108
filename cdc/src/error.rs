//! Errors of the PostgreSQL side, each classified for the stage loops.

use wal2delta_model::ErrorClass;

/// A failure talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum CdcError {
    #[error("Cannot connect to PostgreSQL at {target}")]
    Connect {
        target: String,
        #[source]
        source: std::io::Error,
    },
    /// TLS could not be set up as `sslmode` asks; the message says why and the fix.
    #[error("TLS to PostgreSQL at {target} failed: {message}")]
    Tls { target: String, message: String },
    #[error("PostgreSQL rejected the login of role {user:?}: {message}")]
    Auth { user: String, message: String },
    #[error("PostgreSQL error {code}: {message}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Server {
        code: String,
        message: String,
        detail: Option<String>,
    },
    #[error("Unexpected replication protocol data: {0}")]
    Protocol(String),
    #[error("Connection to PostgreSQL lost")]
    Io(#[from] std::io::Error),
    #[error("Query failed")]
    Query(#[from] tokio_postgres::Error),
    #[error("Invalid source DSN: {0}")]
    Dsn(String),
    #[error("Source check failed: {0}")]
    Check(String),
}

impl CdcError {
    /// Whether to retry, quarantine or stop.
    pub fn class(&self) -> ErrorClass {
        match self {
            CdcError::Connect { .. } | CdcError::Io(_) => ErrorClass::Transient,
            CdcError::Query(e) if e.is_closed() => ErrorClass::Transient,
            CdcError::Server { code, .. } => match &code[..] {
                // admin_shutdown, crash_shutdown, cannot_connect_now, too many connections.
                "57P01" | "57P02" | "57P03" | "53300" | "08006" | "08003" => ErrorClass::Transient,
                _ => ErrorClass::Operator,
            },
            _ => ErrorClass::Operator,
        }
    }

    /// What an operator should do about it, when that is known.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            CdcError::Connect { .. } => Some("check [source] dsn host and port, and that PostgreSQL is running"),
            CdcError::Auth { .. } => Some("check the user and password in [source] dsn and pg_hba.conf (a replication connection needs a 'replication' line)"),
            // 42704 (undefined_object) is both a missing slot and, from pgoutput, a
            // missing publication; the server's message names which.
            CdcError::Server { code, message, .. } if code == "42704" && message.starts_with("publication") => Some("the publication ([source] publication) does not exist: run `wal2delta setup`, which creates it for [source] tables"),
            CdcError::Server { code, .. } if code == "42704" => Some("the replication slot does not exist: run `wal2delta setup`"),
            CdcError::Server { code, .. } if code == "55000" => Some("the slot is in use by another process or invalidated; see `wal2delta status`"),
            CdcError::Server { code, .. } if code == "42501" => Some("the role needs the REPLICATION attribute: ALTER ROLE ... REPLICATION"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, message: &str) -> CdcError {
        CdcError::Server {
            code: code.into(),
            message: message.into(),
            detail: None,
        }
    }

    #[test]
    fn a_missing_publication_is_not_taken_for_a_missing_slot() {
        let publication = server("42704", "publication \"orders_pub\" does not exist");
        let hint = publication.hint().unwrap_or_default();
        assert!(
            hint.contains("publication") && hint.contains("wal2delta setup"),
            "{hint}"
        );
        assert!(!hint.contains("slot"), "{hint}");
        assert!(publication.to_string().contains("orders_pub"));
        let slot = server("42704", "replication slot \"w2d\" does not exist");
        assert!(slot.hint().unwrap_or_default().contains("replication slot"));
    }
}
