//! Parsing pgoutput messages (protocol versions 1 and 2) into typed values.
//!
//! Every read is bounds-checked: a malformed message returns [`PgOutputError`], never panics.

use bytes::Bytes;
use wal2delta_model::Lsn;

/// The message was not valid pgoutput.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Malformed pgoutput message {tag:?}: {reason}")]
pub struct PgOutputError {
    pub tag: char,
    pub reason: String,
}

/// One column's value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    Null,
    /// An unchanged TOASTed value that pgoutput did not send.
    UnchangedToast,
    Text(Bytes),
    Binary(Bytes),
}

/// A relation column as described by a Relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    pub is_key: bool,
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
}

/// A pgoutput message.
#[derive(Debug, Clone, PartialEq)]
pub enum PgOutputMessage {
    Begin {
        final_lsn: Lsn,
        commit_ts: i64,
        xid: u32,
    },
    Commit {
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_ts: i64,
    },
    Origin {
        name: String,
    },
    Relation {
        rel_id: u32,
        namespace: String,
        name: String,
        replica_identity: u8,
        columns: Vec<RelationColumn>,
    },
    Type {
        type_oid: u32,
        namespace: String,
        name: String,
    },
    Insert {
        rel_id: u32,
        new: Vec<TupleValue>,
    },
    /// `old` is the key (`K`) or full old row (`O`) when the server sent one.
    Update {
        rel_id: u32,
        old: Option<(u8, Vec<TupleValue>)>,
        new: Vec<TupleValue>,
    },
    Delete {
        rel_id: u32,
        old: (u8, Vec<TupleValue>),
    },
    Truncate {
        rel_ids: Vec<u32>,
        cascade: bool,
        restart_identity: bool,
    },
    Message {
        transactional: bool,
        lsn: Lsn,
        prefix: String,
        content: Bytes,
    },
    StreamStart {
        xid: u32,
        first_segment: bool,
    },
    StreamStop,
    StreamCommit {
        xid: u32,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_ts: i64,
    },
    StreamAbort {
        xid: u32,
        subxid: u32,
    },
}

struct Reader<'a> {
    tag: char,
    data: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: impl Into<String>) -> PgOutputError {
        PgOutputError {
            tag: self.tag,
            reason: reason.into(),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], PgOutputError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.data.len())
            .ok_or_else(|| self.err("message ends early"))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PgOutputError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, PgOutputError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, PgOutputError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, PgOutputError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn cstr(&mut self) -> Result<String, PgOutputError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| self.err("unterminated string"))?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| self.err("string is not UTF-8"))?
            .to_owned();
        self.pos += n + 1;
        Ok(s)
    }
    fn bytes(&mut self, n: usize) -> Result<Bytes, PgOutputError> {
        let start = self.pos;
        self.take(n)?;
        Ok(self.data.slice(start..start + n))
    }
    /// Bytes not read yet: a count read from the message reserves no more entries than
    /// this (each takes at least one byte), so memory follows the message's real size.
    fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }
    fn tuple(&mut self) -> Result<Vec<TupleValue>, PgOutputError> {
        let n = self.u16()?;
        let mut values = Vec::with_capacity(usize::from(n).min(self.remaining()));
        for _ in 0..n {
            values.push(match self.u8()? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::UnchangedToast,
                b't' => {
                    let len = self.u32()? as usize;
                    TupleValue::Text(self.bytes(len)?)
                }
                b'b' => {
                    let len = self.u32()? as usize;
                    TupleValue::Binary(self.bytes(len)?)
                }
                other => {
                    return Err(self.err(format!("unknown tuple column kind {:?}", other as char)))
                }
            });
        }
        Ok(values)
    }
}

/// The transaction id a data message carries inside a stream block (protocol version 2):
/// the u32 right after the tag of Relation, Type, Insert, Update, Delete, Truncate and
/// Message. It is the xid of the (sub)transaction that made the change, which differs from
/// the StreamStart xid for changes made in a subtransaction. `None` for other tags or when
/// the message is too short.
pub fn stream_xid(data: &Bytes) -> Option<u32> {
    match data.first()? {
        b'R' | b'Y' | b'I' | b'U' | b'D' | b'T' | b'M' => {
            let b = data.get(1..5)?;
            Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        }
        _ => None,
    }
}

/// Parses one pgoutput message. `in_stream` is true between StreamStart and StreamStop,
/// where data messages carry the transaction id first (protocol version 2).
pub fn parse(data: &Bytes, in_stream: bool) -> Result<PgOutputMessage, PgOutputError> {
    let first = *data.first().ok_or(PgOutputError {
        tag: '?',
        reason: "empty message".into(),
    })?;
    let mut r = Reader {
        tag: first as char,
        data,
        pos: 1,
    };
    let stream_xid = |r: &mut Reader| -> Result<(), PgOutputError> {
        if in_stream {
            r.u32()?;
        }
        Ok(())
    };
    let msg = match first {
        b'B' => PgOutputMessage::Begin {
            final_lsn: Lsn(r.u64()?),
            commit_ts: r.u64()? as i64,
            xid: r.u32()?,
        },
        b'C' => {
            let _flags = r.u8()?;
            PgOutputMessage::Commit {
                commit_lsn: Lsn(r.u64()?),
                end_lsn: Lsn(r.u64()?),
                commit_ts: r.u64()? as i64,
            }
        }
        b'O' => {
            let _lsn = r.u64()?;
            PgOutputMessage::Origin { name: r.cstr()? }
        }
        b'R' => {
            stream_xid(&mut r)?;
            let rel_id = r.u32()?;
            let namespace = r.cstr()?;
            let name = r.cstr()?;
            let replica_identity = r.u8()?;
            let n = r.u16()?;
            let mut columns = Vec::with_capacity(usize::from(n).min(r.remaining()));
            for _ in 0..n {
                let flags = r.u8()?;
                columns.push(RelationColumn {
                    is_key: flags & 1 == 1,
                    name: r.cstr()?,
                    type_oid: r.u32()?,
                    typmod: r.u32()? as i32,
                });
            }
            PgOutputMessage::Relation {
                rel_id,
                namespace,
                name,
                replica_identity,
                columns,
            }
        }
        b'Y' => {
            stream_xid(&mut r)?;
            PgOutputMessage::Type {
                type_oid: r.u32()?,
                namespace: r.cstr()?,
                name: r.cstr()?,
            }
        }
        b'I' => {
            stream_xid(&mut r)?;
            let rel_id = r.u32()?;
            match r.u8()? {
                b'N' => PgOutputMessage::Insert {
                    rel_id,
                    new: r.tuple()?,
                },
                other => return Err(r.err(format!("expected 'N', got {:?}", other as char))),
            }
        }
        b'U' => {
            stream_xid(&mut r)?;
            let rel_id = r.u32()?;
            let mut kind = r.u8()?;
            let mut old = None;
            if kind == b'K' || kind == b'O' {
                old = Some((kind, r.tuple()?));
                kind = r.u8()?;
            }
            if kind != b'N' {
                return Err(r.err(format!("expected 'N', got {:?}", kind as char)));
            }
            PgOutputMessage::Update {
                rel_id,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            stream_xid(&mut r)?;
            let rel_id = r.u32()?;
            let kind = r.u8()?;
            if kind != b'K' && kind != b'O' {
                return Err(r.err(format!("expected 'K' or 'O', got {:?}", kind as char)));
            }
            PgOutputMessage::Delete {
                rel_id,
                old: (kind, r.tuple()?),
            }
        }
        b'T' => {
            stream_xid(&mut r)?;
            let n = r.u32()?;
            let options = r.u8()?;
            let mut rel_ids = Vec::with_capacity((n as usize).min(r.remaining() / 4));
            for _ in 0..n {
                rel_ids.push(r.u32()?);
            }
            PgOutputMessage::Truncate {
                rel_ids,
                cascade: options & 1 != 0,
                restart_identity: options & 2 != 0,
            }
        }
        b'M' => {
            stream_xid(&mut r)?;
            let flags = r.u8()?;
            let lsn = Lsn(r.u64()?);
            let prefix = r.cstr()?;
            let len = r.u32()? as usize;
            PgOutputMessage::Message {
                transactional: flags & 1 != 0,
                lsn,
                prefix,
                content: r.bytes(len)?,
            }
        }
        b'S' => PgOutputMessage::StreamStart {
            xid: r.u32()?,
            first_segment: r.u8()? == 1,
        },
        b'E' => PgOutputMessage::StreamStop,
        b'c' => {
            let xid = r.u32()?;
            let _flags = r.u8()?;
            PgOutputMessage::StreamCommit {
                xid,
                commit_lsn: Lsn(r.u64()?),
                end_lsn: Lsn(r.u64()?),
                commit_ts: r.u64()? as i64,
            }
        }
        b'A' => PgOutputMessage::StreamAbort {
            xid: r.u32()?,
            subxid: r.u32()?,
        },
        other => {
            return Err(PgOutputError {
                tag: other as char,
                reason: "unknown message type".into(),
            })
        }
    };
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, BytesMut};

    #[test]
    fn parses_relation_and_update_with_toast() {
        let mut b = BytesMut::new();
        b.put_u8(b'R');
        b.put_u32(16384);
        b.put_slice(b"public\0t\0");
        b.put_u8(b'd');
        b.put_u16(2);
        b.put_u8(1);
        b.put_slice(b"id\0");
        b.put_u32(23);
        b.put_i32(-1);
        b.put_u8(0);
        b.put_slice(b"doc\0");
        b.put_u32(25);
        b.put_i32(-1);
        let rel = parse(&b.freeze(), false).unwrap();
        assert!(
            matches!(rel, PgOutputMessage::Relation { rel_id: 16384, ref columns, .. } if columns.len() == 2 && columns[0].is_key)
        );

        let mut u = BytesMut::new();
        u.put_u8(b'U');
        u.put_u32(16384);
        u.put_u8(b'N');
        u.put_u16(2);
        u.put_u8(b't');
        u.put_u32(1);
        u.put_slice(b"7");
        u.put_u8(b'u');
        let upd = parse(&u.freeze(), false).unwrap();
        assert_eq!(
            upd,
            PgOutputMessage::Update {
                rel_id: 16384,
                old: None,
                new: vec![
                    TupleValue::Text(Bytes::from_static(b"7")),
                    TupleValue::UnchangedToast
                ]
            }
        );
    }

    #[test]
    fn never_panics_on_garbage() {
        // Deterministic pseudo-random inputs; every prefix of valid messages too.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 0..2000usize {
            let mut v = Vec::with_capacity(len % 64);
            for _ in 0..(len % 64) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                v.push(state as u8);
            }
            if let Some(first) = v.first_mut() {
                *first = b"BCORYIUDTMSEcA"[len % 14];
            }
            let _ = parse(&Bytes::from(v.clone()), len % 2 == 0);
        }
    }
}
