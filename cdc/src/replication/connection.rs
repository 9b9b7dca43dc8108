//! Opening a walsender connection and running replication commands on it.

use std::net::IpAddr;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use postgres_protocol::authentication::sasl::{
    ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::config::{ChannelBinding as CbMode, Host};

use super::frame::{server_error, take_frame, Frame};
use super::socket::Socket;
use super::stream::ReplicationStream;
use crate::tls::{SslMode, Tls};
use crate::CdcError;

/// Settings every replication session runs with. The value decoder in [`crate::value`]
/// relies on them: ISO dates, ISO 8601 intervals, UTC, shortest exact floats, hex bytea.
pub const SESSION_OPTIONS: &str = "-c DateStyle=ISO,MDY -c IntervalStyle=iso_8601 -c TimeZone=UTC \
     -c extra_float_digits=3 -c bytea_output=hex -c client_encoding=UTF8";

/// Where and as whom to connect, taken from the `[source] dsn`.
#[derive(Clone)]
pub struct ConnectParams {
    pub host: String,
    /// libpq's `hostaddr`: the address to connect to, while `host` still names the server
    /// for the certificate check.
    pub hostaddr: Option<IpAddr>,
    pub port: u16,
    pub user: String,
    pub password: Option<Vec<u8>>,
    pub dbname: String,
    pub connect_timeout: Duration,
    /// The DSN's own `options` (e.g. `-c logical_decoding_work_mem=256MB`), sent before
    /// [`SESSION_OPTIONS`], which the decoder relies on and so take precedence.
    pub options: Option<String>,
    /// `sslmode` and the certificates, loaded.
    pub tls: Tls,
    /// `channel_binding` (disable, prefer, require) for SCRAM over TLS.
    pub channel_binding: CbMode,
    /// The DSN without its TLS parameters, for tokio-postgres (the query connection).
    pub(crate) query_config: tokio_postgres::Config,
}

impl std::fmt::Debug for ConnectParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is a secret: never print it.
        f.debug_struct("ConnectParams")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("dbname", &self.dbname)
            .field("sslmode", &self.tls.mode().as_str())
            .finish_non_exhaustive()
    }
}

impl ConnectParams {
    /// Reads the parameters from a libpq-style DSN (URL or key=value form) and loads its
    /// certificate files.
    pub fn from_dsn(dsn: &str) -> Result<Self, CdcError> {
        let split = crate::dsn::split(dsn)?;
        let mut config: tokio_postgres::Config = split
            .rest
            .parse()
            .map_err(|e: tokio_postgres::Error| CdcError::Dsn(e.to_string()))?;
        let tls = Tls::load(split.tls)?;
        // tokio-postgres knows disable/prefer/require; the certificate checks that make
        // verify-ca and verify-full are in the connector `Tls` builds.
        config.ssl_mode(match tls.mode() {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        if config.get_ssl_negotiation() != tokio_postgres::config::SslNegotiation::Postgres {
            return Err(CdcError::Dsn(
                "sslnegotiation=direct is not supported; remove it (the default, postgres, works with every server)".into(),
            ));
        }
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(_)) => {
                return Err(CdcError::Dsn(
                    "unix socket hosts are not supported for replication; use a TCP host".into(),
                ))
            }
            None => match config.get_hostaddrs().first() {
                Some(addr) => addr.to_string(),
                None => "localhost".to_owned(),
            },
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config
            .get_user()
            .ok_or_else(|| CdcError::Dsn("the DSN names no user".into()))?
            .to_owned();
        let dbname = config.get_dbname().unwrap_or(&user).to_owned();
        Ok(ConnectParams {
            host,
            hostaddr: config.get_hostaddrs().first().copied(),
            port,
            user,
            password: config.get_password().map(<[u8]>::to_vec),
            dbname,
            connect_timeout: config
                .get_connect_timeout()
                .copied()
                .unwrap_or(Duration::from_secs(10)),
            options: config.get_options().map(str::to_owned),
            tls,
            channel_binding: config.get_channel_binding(),
            query_config: config,
        })
    }

    pub fn target(&self) -> String {
        format!("{}:{}/{}", self.host, self.port, self.dbname)
    }
}

/// A connection in logical replication mode (`replication=database`), before streaming.
pub struct ReplicationConnection {
    socket: Socket,
    buf: BytesMut,
}

/// The rows of a simple query, every value as text.
pub type TextRows = Vec<Vec<Option<String>>>;

impl ReplicationConnection {
    /// Connects, negotiates TLS as `sslmode` says, and authenticates (trust, cleartext,
    /// MD5 or SCRAM-SHA-256, with `tls-server-end-point` channel binding over TLS).
    pub async fn connect(params: &ConnectParams) -> Result<Self, CdcError> {
        let target = params.target();
        let addr = match params.hostaddr {
            Some(ip) => ip.to_string(),
            None => params.host.clone(),
        };
        let tcp = TcpStream::connect((&addr[..], params.port));
        let tcp = tokio::time::timeout(params.connect_timeout, tcp)
            .await
            .map_err(|_| CdcError::Connect {
                target: target.clone(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            })?
            .map_err(|source| CdcError::Connect {
                target: target.clone(),
                source,
            })?;
        tcp.set_nodelay(true)?;
        // TLS and login within the same bound: a server that accepts TCP and then says
        // nothing must not hang the stage.
        tokio::time::timeout(params.connect_timeout, Self::start(tcp, params, &target))
            .await
            .map_err(|_| CdcError::Connect {
                target: target.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer to the TLS negotiation or login within connect_timeout",
                ),
            })?
    }

    /// TLS as `sslmode` says, the startup message, and authentication.
    async fn start(tcp: TcpStream, params: &ConnectParams, target: &str) -> Result<Self, CdcError> {
        let socket = negotiate_tls(tcp, params, target).await?;
        let mut conn = ReplicationConnection {
            socket,
            buf: BytesMut::with_capacity(64 * 1024),
        };
        let options = match &params.options {
            Some(own) => format!("{own} {SESSION_OPTIONS}"),
            None => SESSION_OPTIONS.to_owned(),
        };
        let mut out = BytesMut::new();
        frontend::startup_message(
            [
                ("user", &params.user[..]),
                ("database", &params.dbname[..]),
                ("replication", "database"),
                ("application_name", "wal2delta"),
                ("options", &options[..]),
            ],
            &mut out,
        )?;
        conn.socket.write_all(&out).await?;
        conn.authenticate(params).await?;
        Ok(conn)
    }

    async fn authenticate(&mut self, params: &ConnectParams) -> Result<(), CdcError> {
        let auth_err = |message: &str| CdcError::Auth {
            user: params.user.clone(),
            message: message.to_owned(),
        };
        let password = || {
            params
                .password
                .clone()
                .ok_or_else(|| auth_err("the server asks for a password and the DSN has none"))
        };
        let mut scram: Option<ScramSha256> = None;
        let mut bound = false;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'R' => {
                    let kind = be_u32(&frame.body, 0)?;
                    let mut out = BytesMut::new();
                    if kind == 0 && params.channel_binding == CbMode::Require && !bound {
                        return Err(auth_err("channel_binding=require, but the server authenticated without SCRAM channel binding"));
                    }
                    match kind {
                        0 => {}
                        3 => {
                            let mut pw = password()?;
                            pw.push(0);
                            frontend::password_message(&pw, &mut out)?;
                        }
                        5 => {
                            let salt: [u8; 4] = frame
                                .body
                                .get(4..8)
                                .and_then(|s| s.try_into().ok())
                                .ok_or_else(|| auth_err("short MD5 salt"))?;
                            let hash = postgres_protocol::authentication::md5_hash(
                                params.user.as_bytes(),
                                &password()?,
                                salt,
                            );
                            let mut pw = hash.into_bytes();
                            pw.push(0);
                            frontend::password_message(&pw, &mut out)?;
                        }
                        10 => {
                            let (mechanism, binding) =
                                self.choose_sasl(params, &frame.body[4..])?;
                            bound = mechanism == SCRAM_SHA_256_PLUS;
                            let s = ScramSha256::new(&password()?, binding);
                            frontend::sasl_initial_response(mechanism, s.message(), &mut out)?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram
                                .as_mut()
                                .ok_or_else(|| auth_err("SASL continue without a SASL exchange"))?;
                            s.update(&frame.body[4..])
                                .map_err(|e| auth_err(&e.to_string()))?;
                            frontend::sasl_response(s.message(), &mut out)?;
                        }
                        12 => {
                            let s = scram
                                .as_mut()
                                .ok_or_else(|| auth_err("SASL final without a SASL exchange"))?;
                            s.finish(&frame.body[4..])
                                .map_err(|e| auth_err(&e.to_string()))?;
                        }
                        other => {
                            return Err(auth_err(&format!(
                                "unsupported authentication method {other}"
                            )))
                        }
                    }
                    if !out.is_empty() {
                        self.socket.write_all(&out).await?;
                    }
                }
                b'E' => {
                    let err = server_error(&frame.body);
                    return Err(match err {
                        CdcError::Server { code, message, .. } if code.starts_with("28") => {
                            CdcError::Auth {
                                user: params.user.clone(),
                                message,
                            }
                        }
                        other => other,
                    });
                }
                b'Z' => return Ok(()),
                // ParameterStatus, BackendKeyData, NoticeResponse.
                b'S' | b'K' | b'N' => {}
                other => {
                    return Err(CdcError::Protocol(format!(
                        "unexpected message {:?} during startup",
                        other as char
                    )))
                }
            }
        }
    }

    /// The SASL mechanism and channel binding to use: `SCRAM-SHA-256-PLUS` bound to the
    /// server's certificate when TLS is up and the server offers it (unless
    /// `channel_binding=disable`), else plain `SCRAM-SHA-256`.
    fn choose_sasl(
        &self,
        params: &ConnectParams,
        mechanisms: &[u8],
    ) -> Result<(&'static str, ChannelBinding), CdcError> {
        let offered = |name: &str| mechanisms.split(|b| *b == 0).any(|m| m == name.as_bytes());
        let auth_err = |message: &str| CdcError::Auth {
            user: params.user.clone(),
            message: message.to_owned(),
        };
        let end_point = self.socket.server_end_point();
        let tls = matches!(self.socket, Socket::Tls(_));
        match (params.channel_binding, end_point) {
            (CbMode::Disable, _) => {}
            (_, Some(data)) if offered(SCRAM_SHA_256_PLUS) => {
                return Ok((
                    SCRAM_SHA_256_PLUS,
                    ChannelBinding::tls_server_end_point(data),
                ))
            }
            (CbMode::Require, _) => {
                return Err(auth_err(if tls {
                    "channel_binding=require, but the server offers no SCRAM-SHA-256-PLUS"
                } else {
                    "channel_binding=require needs TLS: set sslmode=verify-full"
                }))
            }
            _ => {}
        }
        if !offered(SCRAM_SHA_256) {
            return Err(auth_err(
                "the server offers no SASL mechanism wal2delta supports (SCRAM-SHA-256)",
            ));
        }
        let binding = if tls && params.channel_binding != CbMode::Disable {
            ChannelBinding::unrequested()
        } else {
            ChannelBinding::unsupported()
        };
        Ok((SCRAM_SHA_256, binding))
    }

    pub(super) async fn read_frame(&mut self) -> Result<Frame, CdcError> {
        loop {
            if let Some(frame) = take_frame(&mut self.buf)? {
                return Ok(frame);
            }
            if self.socket.read_buf(&mut self.buf).await? == 0 {
                return Err(CdcError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                )));
            }
        }
    }

    /// Runs a replication command (or, on PG15, a plain SELECT) and returns its rows as text.
    pub async fn simple_query(&mut self, sql: &str) -> Result<TextRows, CdcError> {
        let mut out = BytesMut::new();
        frontend::query(sql, &mut out)?;
        self.socket.write_all(&out).await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'D' => rows.push(data_row(&frame.body)?),
                b'E' => error = Some(server_error(&frame.body)),
                b'Z' => return error.map_or(Ok(rows), Err),
                b'T' | b'C' | b'N' | b'S' | b'I' => {}
                other => {
                    return Err(CdcError::Protocol(format!(
                        "unexpected message {:?} in a query response",
                        other as char
                    )))
                }
            }
        }
    }

    /// Sends `START_REPLICATION` and switches to streaming.
    pub async fn start_replication(mut self, command: &str) -> Result<ReplicationStream, CdcError> {
        let mut out = BytesMut::new();
        frontend::query(command, &mut out)?;
        self.socket.write_all(&out).await?;
        loop {
            let frame = self.read_frame().await?;
            match frame.tag {
                b'W' => return Ok(ReplicationStream::new(self.socket, self.buf)),
                b'E' => {
                    let err = server_error(&frame.body);
                    // Drain to ReadyForQuery is unnecessary: the connection is dropped.
                    return Err(err);
                }
                b'N' | b'S' => {}
                other => {
                    return Err(CdcError::Protocol(format!(
                        "unexpected message {:?} after START_REPLICATION",
                        other as char
                    )))
                }
            }
        }
    }
}

/// Sends the SSLRequest unless `sslmode=disable`, and wraps the socket in TLS when the
/// server accepts. A server that declines is refused when `sslmode` requires TLS.
async fn negotiate_tls(
    mut tcp: TcpStream,
    params: &ConnectParams,
    target: &str,
) -> Result<Socket, CdcError> {
    /// The SSLRequest code (1234.5679), sent in place of a protocol version.
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    let mode = params.tls.mode();
    if mode == SslMode::Disable {
        return Ok(Socket::Plain(tcp));
    }
    tcp.write_all(&SSL_REQUEST).await?;
    match tcp.read_u8().await? {
        b'S' => {
            let stream = params.tls.handshake(tcp, &params.host, target).await?;
            Ok(Socket::Tls(Box::new(stream)))
        }
        b'N' if !mode.requires_tls() => Ok(Socket::Plain(tcp)),
        b'N' => Err(CdcError::Tls {
            target: target.to_owned(),
            message: format!("the server does not accept TLS connections, and sslmode={} requires TLS; turn ssl on in the server (managed services have it on), or connect to the right server", mode.as_str()),
        }),
        // An error (e.g. too many connections) before the handshake; the body is not read.
        other => Err(CdcError::Protocol(format!(
            "unexpected answer {:?} to the SSLRequest",
            other as char
        ))),
    }
}

pub(super) fn be_u32(body: &[u8], at: usize) -> Result<u32, CdcError> {
    body.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| CdcError::Protocol("message too short".into()))
}

fn data_row(body: &[u8]) -> Result<Vec<Option<String>>, CdcError> {
    let short = || CdcError::Protocol("truncated DataRow".into());
    let count = body
        .get(0..2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]))
        .ok_or_else(short)?;
    let mut at = 2;
    let mut row = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = be_u32(body, at)? as i32;
        at += 4;
        if len < 0 {
            row.push(None);
        } else {
            let end = at + len as usize;
            let bytes = body.get(at..end).ok_or_else(short)?;
            row.push(Some(String::from_utf8_lossy(bytes).into_owned()));
            at = end;
        }
    }
    Ok(row)
}

/// Appends a CopyData message carrying `payload` to `out`.
pub(super) fn copy_data(payload: &[u8], out: &mut BytesMut) {
    out.put_u8(b'd');
    out.put_u32(4 + payload.len() as u32);
    out.put_slice(payload);
}
