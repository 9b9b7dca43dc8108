//! Ordinary (non-replication) connections to the source database.

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls, Socket};

use crate::replication::ConnectParams;
use crate::CdcError;

/// Opens a SQL connection, used for setup checks, the type catalog and slot health. It
/// never reads product tables. TLS follows the DSN's `sslmode` as for replication.
pub async fn connect(dsn: &str) -> Result<Client, CdcError> {
    let params = ConnectParams::from_dsn(dsn)?;
    // The whole connection (TCP, TLS, login) within connect_timeout, as for replication:
    // a server that accepts TCP and then says nothing must not hang the caller.
    let opened = match params.tls.make_connector() {
        Some(tls) => tokio::time::timeout(params.connect_timeout, open(&params, tls)).await,
        None => tokio::time::timeout(params.connect_timeout, open(&params, NoTls)).await,
    };
    let client = opened.map_err(|_| CdcError::Connect {
        target: params.target(),
        source: std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer within connect_timeout",
        ),
    })??;
    // The same output settings as the replication session, so text renderings agree.
    client
        .batch_execute("SET DateStyle = 'ISO, MDY'; SET IntervalStyle = iso_8601; SET TimeZone = 'UTC'; SET extra_float_digits = 3; SET bytea_output = hex; SET application_name = 'wal2delta'")
        .await?;
    Ok(client)
}

async fn open<T>(params: &ConnectParams, tls: T) -> Result<Client, CdcError>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = params
        .query_config
        .connect(tls)
        .await
        .map_err(|e| classify_connect(params, e))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(error = %error, "source connection closed");
        }
    });
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
    // tokio-postgres says "error performing TLS handshake" and leaves OpenSSL's reason
    // (with the certificate verification result) to its source.
    let text = e.to_string();
    if text.contains("TLS") {
        // The network failing mid-handshake is transient, not a TLS setting to fix.
        let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        while let Some(c) = cause {
            if let Some(io) = c.downcast_ref::<std::io::Error>() {
                return CdcError::Connect {
                    target: params.target(),
                    source: std::io::Error::new(io.kind(), io.to_string()),
                };
            }
            cause = c.source();
        }
        let detail = std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or(text);
        if detail.contains("does not support TLS") {
            return CdcError::Tls {
                target: params.target(),
                message: format!("the server does not accept TLS connections, and sslmode={} requires TLS; turn ssl on in the server (managed services have it on), or connect to the right server", params.tls.mode().as_str()),
            };
        }
        let detail = detail.rsplit(": ").next().unwrap_or(&detail).to_owned();
        return params.tls.failure(&params.target(), &params.host, &detail);
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
