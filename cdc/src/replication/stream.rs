//! The CopyBoth phase: WAL data in, standby status updates out.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wal2delta_model::Lsn;

use super::connection::copy_data;
use super::frame::{server_error, take_frame};
use super::socket::Socket;
use crate::CdcError;

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

/// One message from the walsender.
#[derive(Debug)]
pub enum ReplicationMessage {
    /// A chunk of decoded WAL (one pgoutput message).
    XLogData {
        wal_start: Lsn,
        wal_end: Lsn,
        data: Bytes,
    },
    /// The server's heartbeat; when `reply_requested`, a status update must follow at once
    /// or the walsender drops the connection after `wal_sender_timeout`.
    Keepalive { wal_end: Lsn, reply_requested: bool },
}

/// A connection streaming logical replication messages.
pub struct ReplicationStream {
    socket: Socket,
    buf: BytesMut,
}

impl ReplicationStream {
    pub(super) fn new(socket: Socket, buf: BytesMut) -> Self {
        ReplicationStream { socket, buf }
    }

    /// The next message, or `None` when the server ended the stream.
    ///
    /// Cancel-safe: bytes read before a cancellation stay in the buffer.
    pub async fn next(&mut self) -> Result<Option<ReplicationMessage>, CdcError> {
        loop {
            while let Some(mut frame) = take_frame(&mut self.buf)? {
                match frame.tag {
                    b'd' => return parse_copy_data(&mut frame.body).map(Some),
                    b'c' => return Ok(None),
                    b'E' => return Err(server_error(&frame.body)),
                    // NoticeResponse, ParameterStatus, CommandComplete, ReadyForQuery.
                    b'N' | b'S' | b'C' | b'Z' => {}
                    other => {
                        return Err(CdcError::Protocol(format!(
                            "unexpected message {:?} while streaming",
                            other as char
                        )))
                    }
                }
            }
            if self.socket.read_buf(&mut self.buf).await? == 0 {
                return Err(CdcError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the replication connection",
                )));
            }
        }
    }

    /// Sends a standby status update.
    ///
    /// `flush` is what the server may treat as durably consumed: the slot's
    /// `confirmed_flush_lsn` moves to it and WAL before it can be recycled. Callers must
    /// only pass an LSN whose every change is acknowledged by Kafka.
    pub async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        reply_requested: bool,
    ) -> Result<(), CdcError> {
        let mut payload = BytesMut::with_capacity(34);
        payload.put_u8(b'r');
        payload.put_u64(write.0);
        payload.put_u64(flush.0);
        payload.put_u64(flush.0);
        payload.put_i64(pg_now_us());
        payload.put_u8(u8::from(reply_requested));
        let mut out = BytesMut::with_capacity(40);
        copy_data(&payload, &mut out);
        self.socket.write_all(&out).await?;
        Ok(())
    }
}

fn parse_copy_data(body: &mut BytesMut) -> Result<ReplicationMessage, CdcError> {
    let short = |what: &str| CdcError::Protocol(format!("truncated {what} message"));
    if body.is_empty() {
        return Err(short("CopyData"));
    }
    match body.get_u8() {
        b'w' => {
            if body.remaining() < 24 {
                return Err(short("XLogData"));
            }
            let wal_start = Lsn(body.get_u64());
            let wal_end = Lsn(body.get_u64());
            let _server_clock = body.get_i64();
            Ok(ReplicationMessage::XLogData {
                wal_start,
                wal_end,
                data: body.split().freeze(),
            })
        }
        b'k' => {
            if body.remaining() < 17 {
                return Err(short("keepalive"));
            }
            let wal_end = Lsn(body.get_u64());
            let _server_clock = body.get_i64();
            Ok(ReplicationMessage::Keepalive {
                wal_end,
                reply_requested: body.get_u8() == 1,
            })
        }
        other => Err(CdcError::Protocol(format!(
            "unknown CopyData kind {:?}",
            other as char
        ))),
    }
}

fn pg_now_us() -> i64 {
    wal2delta_model::clock::unix_us() - PG_EPOCH_OFFSET_US
}

/// Converts a PostgreSQL timestamp (µs since 2000-01-01) to µs since the Unix epoch.
pub fn pg_ts_to_unix_us(pg_us: i64) -> i64 {
    pg_us.saturating_add(PG_EPOCH_OFFSET_US)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_xlogdata_and_keepalive() {
        let mut body = BytesMut::new();
        body.put_u8(b'w');
        body.put_u64(10);
        body.put_u64(20);
        body.put_i64(0);
        body.put_slice(b"BEGIN");
        match parse_copy_data(&mut body).unwrap() {
            ReplicationMessage::XLogData {
                wal_start,
                wal_end,
                data,
            } => {
                assert_eq!((wal_start, wal_end), (Lsn(10), Lsn(20)));
                assert_eq!(&data[..], b"BEGIN");
            }
            other => panic!("unexpected {other:?}"),
        }
        let mut ka = BytesMut::new();
        ka.put_u8(b'k');
        ka.put_u64(7);
        ka.put_i64(0);
        ka.put_u8(1);
        assert!(matches!(
            parse_copy_data(&mut ka).unwrap(),
            ReplicationMessage::Keepalive {
                wal_end: Lsn(7),
                reply_requested: true
            }
        ));
        let mut short = BytesMut::from(&b"w\x00"[..]);
        assert!(parse_copy_data(&mut short).is_err());
    }
}
