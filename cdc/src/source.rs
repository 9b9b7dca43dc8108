//! Ordinary (non-replication) connections to the source database.

use tokio_postgres::{Client, NoTls};

use crate::replication::ConnectParams;
use crate::CdcError;

/// Opens a SQL connection, used for setup checks, the type catalog and slot health. It
/// never reads product tables.
pub async fn connect(dsn: &str) -> Result<Client, CdcError> {
    let params = ConnectParams::from_dsn(dsn)?;
    let (client, connection) = tokio_postgres::connect(dsn, NoTls)
        .await
        .map_err(|e| classify_connect(&params, e))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(error = %error, "source connection closed");
        }
    });
    // The same output settings as the replication session, so text renderings agree.
    client
        .batch_execute("SET DateStyle = 'ISO, MDY'; SET IntervalStyle = iso_8601; SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET bytea_output = hex; SET application_name = 'wal2delta'")
        .await?;
    Ok(client)
}

fn classify_connect(params: &ConnectParams, e: tokio_postgres::Error) -> CdcError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code().to_owned();
        if code.starts_with("28") {
            return CdcError::Auth {
                user: params.user.clone(),
                message: db.message().to_owned(),
            };
        }
        return CdcError::Server {
            code,
            message: db.message().to_owned(),
            detail: db.detail().map(str::to_owned),
        };
    }
    // Walk to the innermost cause (e.g. "Connection refused") for a one-line message.
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    CdcError::Connect {
        target: params.target(),
        source: std::io::Error::other(last.unwrap_or_else(|| e.to_string())),
    }
}
