//! A disk-backed buffer for transactions PostgreSQL streams while they are still in
//! progress (pgoutput protocol version 2, `streaming 'on'`).
//!
//! With streaming on, the server does not wait for a large transaction to commit: it sends
//! its changes in blocks, `StreamStart(xid)` … data messages … `StreamStop`, interleaved
//! with blocks of other streamed transactions and with ordinary `Begin` … `Commit`
//! transactions, and only later `StreamCommit(xid)` or `StreamAbort(xid, subxid)`. Inside a
//! block every data message carries the xid of the (sub)transaction that made the change.
//!
//! [`StreamBuffer`] sits in front of the decoder: every XLogData payload goes through
//! [`StreamBuffer::on_message`]. Messages outside stream blocks come straight back
//! ([`Routed::Pass`]); messages inside blocks are written to a per-transaction scratch file
//! and come back, in their original order and without the aborted ones, only when the
//! transaction commits ([`Routed::Commit`] and [`CommittedTx::replay`]).
//!
//! # Invariants
//!
//! **Nothing aborted is ever published** (docs/architecture.md, promise 1 keeps only committed
//! changes). The only way a buffered change leaves the buffer is [`CommittedTx`], and one is
//! made only on `StreamCommit` of that top-level xid. A top-level abort (`subxid == xid`)
//! forgets the transaction and deletes its file. A subtransaction abort records the subxid
//! in the transaction's aborted set; replay skips every record whose stream xid is in that
//! set, whether it was written before or after the abort, so the file is never rewritten
//! and yet none of that subtransaction's changes (nor its Relation messages) come back.
//!
//! **Memory is bounded, whatever the size of the transactions.** Records first go into a
//! small in-memory buffer per open transaction. Before a record is added, the largest
//! buffers are written to their files until the sum over all open transactions plus the
//! new record fits in `memory_limit_bytes`; a record larger than the whole budget goes
//! straight to disk. Replay reads one record at a time through a fixed-size reader. What
//! stays in memory is therefore at most the limit, plus one message, plus small
//! bookkeeping (a counter per subtransaction that made changes, like the server's own
//! reorder buffer keeps).
//!
//! **The files are scratch.** They are never fsynced and [`StreamBuffer::new`] deletes any
//! left by a previous process. That is safe because the capture loop confirms the slot
//! only up to the end LSN of transactions whose every event Kafka acknowledged; an
//! uncommitted streamed transaction commits after that point, so after a crash or
//! reconnect the server decodes it again from the slot's restart LSN and streams it from
//! its first segment. Nothing in these files is needed that the server will not resend.
//!
//! **An error leaves the buffer as it was.** When `on_message` fails, the message was not
//! consumed (a failed write is retried over the same bytes: reads stop at the last fully
//! written length). The caller may skip the message or reconnect; on reconnect it must call
//! [`StreamBuffer::reset`] (or make a new buffer), since the server re-streams every open
//! transaction from its first segment.
//!
//! # File format
//!
//! One append-only file per open top-level transaction, `stream-<xid>-<seq>.w2dbuf` in the
//! buffer's directory, holding records of `lsn: u64`, `stream xid: u32`, `len: u32` (all
//! little-endian) followed by `len` bytes of the raw pgoutput message. The directory
//! belongs to one buffer: `new` deletes every `*.w2dbuf` file in it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use wal2delta_model::{ErrorClass, Lsn};

use crate::pgoutput::{self, PgOutputError, PgOutputMessage};

const FILE_PREFIX: &str = "stream-";
const FILE_SUFFIX: &str = ".w2dbuf";
/// lsn u64 + stream xid u32 + len u32.
const HEADER_LEN: usize = 16;
/// Read buffer of a replay.
const REPLAY_BUFFER: usize = 64 * 1024;

/// A failure of the stream buffer.
#[derive(Debug, thiserror::Error)]
pub enum StreamBufferError {
    /// Reading or writing a scratch file failed (disk full, permissions).
    #[error("Stream buffer I/O failed on {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The messages arrived in an order pgoutput never sends (StreamStop without
    /// StreamStart, a commit of an unknown transaction, ...).
    #[error("Unexpected pgoutput stream sequence at {lsn}: {reason}")]
    Protocol { lsn: Lsn, reason: String },
    /// One message is not valid pgoutput. `data` is the raw payload, for the quarantine.
    #[error("Malformed pgoutput message at {lsn}: {error}")]
    Malformed {
        lsn: Lsn,
        data: Bytes,
        error: PgOutputError,
    },
    /// A scratch file does not hold what was written to it.
    #[error("Stream buffer file {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
}

impl StreamBufferError {
    /// Whether to retry, quarantine or stop. Only a malformed message is a record
    /// problem; a replay goes on after one.
    pub fn class(&self) -> ErrorClass {
        match self {
            StreamBufferError::Io { .. } | StreamBufferError::Corrupt { .. } => {
                ErrorClass::Transient
            }
            StreamBufferError::Malformed { .. } => ErrorClass::Record,
            StreamBufferError::Protocol { .. } => ErrorClass::Operator,
        }
    }
}

/// Where a message went.
#[derive(Debug)]
pub enum Routed {
    /// Outside any stream block: handle it as usual (parsed with `in_stream = false`).
    Pass(PgOutputMessage),
    /// Buffered inside a stream block (StreamStart and StreamStop also answer this).
    Buffered,
    /// A Relation or Type message inside a stream block of top-level transaction `xid`:
    /// buffered in order *and* returned now so the caller can note it. It describes a
    /// relation, it is not a change; replay yields it again at its position (or not at all
    /// if its subtransaction aborted, though pgoutput will not send it again for `xid`).
    Schema { xid: u32, message: PgOutputMessage },
    /// `StreamAbort`, after discarding: when `subxid == xid` the whole transaction and its
    /// file, otherwise the changes of subtransaction `subxid` (skipped on replay).
    /// `dropped` counts the buffered messages that will now never be replayed; an abort of
    /// a transaction that was never streamed drops nothing and is not an error.
    Aborted { xid: u32, subxid: u32, dropped: u64 },
    /// `StreamCommit`: the transaction's surviving messages, to replay and publish.
    Commit(CommittedTx),
}

/// One open streamed transaction.
struct OpenTx {
    path: PathBuf,
    /// Opened on the first spill.
    file: Option<File>,
    /// Bytes fully written to the file; a failed write is overwritten by the next one.
    disk_len: u64,
    /// Encoded records not yet written.
    mem: Vec<u8>,
    first_lsn: Lsn,
    /// Surviving records per stream xid.
    per_xid: HashMap<u32, u64>,
    /// Aborted subtransactions: their records are skipped on replay.
    aborted: HashSet<u32>,
    /// Records that will be replayed.
    live: u64,
    /// Records that will be skipped.
    dropped: u64,
}

impl OpenTx {
    fn new(path: PathBuf, first_lsn: Lsn) -> Self {
        OpenTx {
            path,
            file: None,
            disk_len: 0,
            mem: Vec::new(),
            first_lsn,
            per_xid: HashMap::new(),
            aborted: HashSet::new(),
            live: 0,
            dropped: 0,
        }
    }

    /// Writes `parts` after the last fully written byte.
    fn write_at_end(&mut self, parts: &[&[u8]]) -> Result<(), StreamBufferError> {
        let mut file = match self.file.take() {
            Some(f) => f,
            None => OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&self.path)
                .map_err(|source| io_error(&self.path, source))?,
        };
        let result = (|| {
            file.seek(SeekFrom::Start(self.disk_len))?;
            for p in parts {
                file.write_all(p)?;
            }
            Ok(())
        })();
        self.file = Some(file);
        result.map_err(|source| io_error(&self.path, source))?;
        self.disk_len += parts.iter().map(|p| p.len() as u64).sum::<u64>();
        Ok(())
    }

    /// Closes and deletes the file, if any. A failure only leaves a scratch file behind
    /// for the next `new` to delete.
    fn discard(mut self) {
        if self.file.take().is_some() {
            remove_scratch(&self.path);
        }
    }
}

/// The disk-backed buffer of streamed transactions. See the [module docs](self).
pub struct StreamBuffer {
    dir: PathBuf,
    memory_limit: usize,
    /// Sum of the in-memory buffers of all open transactions.
    memory: usize,
    /// Sum of the fully written file lengths of all open transactions.
    disk: u64,
    open: HashMap<u32, OpenTx>,
    /// The top-level xid of the stream block in progress.
    block: Option<u32>,
    next_file: u64,
}

impl fmt::Debug for StreamBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamBuffer")
            .field("dir", &self.dir)
            .field("memory_limit", &self.memory_limit)
            .field("memory", &self.memory)
            .field("disk", &self.disk)
            .field("open_transactions", &self.open.len())
            .field("block", &self.block)
            .finish()
    }
}

impl StreamBuffer {
    /// A buffer keeping its files under `dir` (created if missing) and at most
    /// `memory_limit_bytes` of buffered messages in memory. Deletes the scratch files
    /// (`*.w2dbuf`) a previous process left in `dir`; other files are left alone.
    pub fn new(dir: PathBuf, memory_limit_bytes: usize) -> io::Result<Self> {
        let with_path = |path: &Path, e: io::Error| {
            io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        };
        fs::create_dir_all(&dir).map_err(|e| with_path(&dir, e))?;
        for entry in fs::read_dir(&dir).map_err(|e| with_path(&dir, e))? {
            let entry = entry.map_err(|e| with_path(&dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(FILE_PREFIX) && name.ends_with(FILE_SUFFIX) {
                let path = entry.path();
                match fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::debug!(path = %path.display(), "deleted leftover stream buffer file")
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(with_path(&path, e)),
                }
            }
        }
        Ok(StreamBuffer {
            dir,
            memory_limit: memory_limit_bytes,
            memory: 0,
            disk: 0,
            open: HashMap::new(),
            block: None,
            next_file: 0,
        })
    }

    /// Routes one XLogData payload (`wal_start` is its WAL position). See [`Routed`].
    ///
    /// On error nothing changed: the message was not consumed.
    pub fn on_message(&mut self, wal_start: Lsn, data: Bytes) -> Result<Routed, StreamBufferError> {
        match self.block {
            None => self.outside_block(wal_start, data),
            Some(xid) => self.inside_block(xid, wal_start, data),
        }
    }

    /// Bytes buffered for open transactions, on disk and in memory.
    pub fn buffered_bytes(&self) -> u64 {
        self.disk + self.memory as u64
    }

    /// Bytes buffered in memory (never more than the memory limit).
    pub fn memory_bytes(&self) -> usize {
        self.memory
    }

    /// Streamed transactions neither committed nor aborted yet.
    pub fn open_transactions(&self) -> usize {
        self.open.len()
    }

    /// The top-level xid of the stream block being received, if any.
    pub fn in_stream_block(&self) -> Option<u32> {
        self.block
    }

    /// The directory holding the scratch files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Forgets every open transaction and deletes its file: for a reconnect, after which
    /// the server streams every open transaction again from its first segment.
    pub fn reset(&mut self) {
        self.block = None;
        self.memory = 0;
        self.disk = 0;
        for (_, tx) in self.open.drain() {
            tx.discard();
        }
    }

    fn outside_block(&mut self, lsn: Lsn, data: Bytes) -> Result<Routed, StreamBufferError> {
        let msg = pgoutput::parse(&data, false).map_err(|error| StreamBufferError::Malformed {
            lsn,
            data: data.clone(),
            error,
        })?;
        match msg {
            PgOutputMessage::StreamStart { xid, first_segment } => {
                let known = self.open.contains_key(&xid);
                if first_segment && known {
                    return Err(protocol(lsn, format!("StreamStart of the first segment of transaction {xid}, which is already open")));
                }
                if !first_segment && !known {
                    return Err(protocol(lsn, format!("StreamStart continues transaction {xid}, which is unknown (its first segment was never received)")));
                }
                if first_segment {
                    let path = self.dir.join(format!(
                        "{FILE_PREFIX}{xid}-{}{FILE_SUFFIX}",
                        self.next_file
                    ));
                    self.next_file += 1;
                    self.open.insert(xid, OpenTx::new(path, lsn));
                }
                self.block = Some(xid);
                Ok(Routed::Buffered)
            }
            PgOutputMessage::StreamStop => Err(protocol(lsn, "StreamStop without StreamStart")),
            PgOutputMessage::StreamCommit {
                xid,
                commit_lsn,
                end_lsn,
                commit_ts,
            } => {
                let Some(mut tx) = self.open.remove(&xid) else {
                    return Err(protocol(
                        lsn,
                        format!("StreamCommit of transaction {xid}, which is unknown"),
                    ));
                };
                let tail_len = tx.mem.len();
                let spilled = tx.file.is_some();
                let tail = io::Cursor::new(std::mem::take(&mut tx.mem));
                let reader: Box<dyn Read + Send> = match tx.file.take() {
                    Some(mut file) => {
                        if let Err(source) = file.rewind() {
                            let path = tx.path.clone();
                            tx.file = Some(file);
                            tx.mem = tail.into_inner();
                            self.open.insert(xid, tx);
                            return Err(io_error(&path, source));
                        }
                        Box::new(
                            BufReader::with_capacity(REPLAY_BUFFER, file.take(tx.disk_len))
                                .chain(tail),
                        )
                    }
                    None => Box::new(tail),
                };
                // The tail now belongs to the committed transaction, which the caller
                // replays before feeding more messages.
                self.memory -= tail_len;
                self.disk -= tx.disk_len;
                let remaining = tx.disk_len + tail_len as u64;
                Ok(Routed::Commit(CommittedTx {
                    xid,
                    commit_lsn,
                    end_lsn,
                    commit_ts,
                    first_lsn: tx.first_lsn,
                    path: tx.path,
                    spilled,
                    reader: Some(reader),
                    remaining,
                    aborted: tx.aborted,
                    messages: tx.live,
                    dropped: tx.dropped,
                }))
            }
            PgOutputMessage::StreamAbort { xid, subxid } => {
                let dropped = if subxid == xid {
                    self.open.remove(&xid).map(|tx| {
                        self.memory -= tx.mem.len();
                        self.disk -= tx.disk_len;
                        let dropped = tx.live;
                        tx.discard();
                        dropped
                    })
                } else {
                    self.open.get_mut(&xid).map(|tx| {
                        let n = tx.per_xid.remove(&subxid).unwrap_or(0);
                        tx.aborted.insert(subxid);
                        tx.live -= n;
                        tx.dropped += n;
                        n
                    })
                };
                // Aborting a transaction that was never streamed publishes nothing either
                // way, so it is not an error.
                let dropped = dropped.unwrap_or_else(|| {
                    tracing::debug!(xid, subxid, "StreamAbort of an unknown transaction");
                    0
                });
                Ok(Routed::Aborted {
                    xid,
                    subxid,
                    dropped,
                })
            }
            other => Ok(Routed::Pass(other)),
        }
    }

    fn inside_block(
        &mut self,
        block_xid: u32,
        lsn: Lsn,
        data: Bytes,
    ) -> Result<Routed, StreamBufferError> {
        let malformed = |data: &Bytes, error| StreamBufferError::Malformed {
            lsn,
            data: data.clone(),
            error,
        };
        let Some(&tag) = data.first() else {
            return Err(malformed(
                &data,
                PgOutputError {
                    tag: '?',
                    reason: "empty message".into(),
                },
            ));
        };
        match tag {
            b'E' => {
                self.block = None;
                Ok(Routed::Buffered)
            }
            b'S' | b'c' | b'A' | b'B' | b'C' => Err(protocol(
                lsn,
                format!(
                    "message {:?} inside the stream block of transaction {block_xid}",
                    tag as char
                ),
            )),
            b'R' | b'Y' => {
                let msg = pgoutput::parse(&data, true).map_err(|e| malformed(&data, e))?;
                let xid = pgoutput::stream_xid(&data).unwrap_or(block_xid);
                self.append(block_xid, lsn, xid, &data)?;
                Ok(Routed::Schema {
                    xid: block_xid,
                    message: msg,
                })
            }
            b'I' | b'U' | b'D' | b'T' | b'M' => {
                let Some(xid) = pgoutput::stream_xid(&data) else {
                    let e = match pgoutput::parse(&data, true) {
                        Err(e) => e,
                        Ok(_) => PgOutputError {
                            tag: tag as char,
                            reason: "no transaction id".into(),
                        },
                    };
                    return Err(malformed(&data, e));
                };
                self.append(block_xid, lsn, xid, &data)?;
                Ok(Routed::Buffered)
            }
            // Origin, or a message type this version does not know: kept in order and
            // attributed to the top-level transaction; replay parses (or reports) it.
            _ => {
                self.append(block_xid, lsn, block_xid, &data)?;
                Ok(Routed::Buffered)
            }
        }
    }

    /// Appends one record to transaction `top`, spilling to keep memory under the limit.
    fn append(
        &mut self,
        top: u32,
        lsn: Lsn,
        xid: u32,
        data: &[u8],
    ) -> Result<(), StreamBufferError> {
        if !self.open.contains_key(&top) {
            return Err(protocol(
                lsn,
                format!("data for transaction {top}, which is not open"),
            ));
        }
        let len = u32::try_from(data.len()).map_err(|_| {
            protocol(
                lsn,
                format!("message of {} bytes is too large to buffer", data.len()),
            )
        })?;
        let record_len = HEADER_LEN + data.len();
        // Make room: write the largest buffers out until the record fits. When this stops
        // without room, every buffer is empty, so writing the record directly keeps order.
        while self.memory + record_len > self.memory_limit {
            let Some((&victim, _)) = self
                .open
                .iter()
                .filter(|(_, tx)| !tx.mem.is_empty())
                .max_by_key(|(_, tx)| tx.mem.len())
            else {
                break;
            };
            self.spill(victim)?;
        }
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&lsn.0.to_le_bytes());
        header[8..12].copy_from_slice(&xid.to_le_bytes());
        header[12..].copy_from_slice(&len.to_le_bytes());
        let memory_left = self.memory_limit - self.memory.min(self.memory_limit);
        let Some(tx) = self.open.get_mut(&top) else {
            return Err(protocol(
                lsn,
                format!("data for transaction {top}, which is not open"),
            ));
        };
        if record_len <= memory_left {
            tx.mem.extend_from_slice(&header);
            tx.mem.extend_from_slice(data);
            self.memory += record_len;
        } else {
            tx.write_at_end(&[&header, data])?;
            self.disk += record_len as u64;
        }
        if tx.aborted.contains(&xid) {
            tx.dropped += 1;
        } else {
            *tx.per_xid.entry(xid).or_default() += 1;
            tx.live += 1;
        }
        Ok(())
    }

    /// Writes transaction `xid`'s in-memory buffer to its file.
    fn spill(&mut self, xid: u32) -> Result<(), StreamBufferError> {
        let Some(tx) = self.open.get_mut(&xid) else {
            return Ok(());
        };
        let mem = std::mem::take(&mut tx.mem);
        if let Err(e) = tx.write_at_end(&[&mem]) {
            tx.mem = mem;
            return Err(e);
        }
        self.memory -= mem.len();
        self.disk += mem.len() as u64;
        Ok(())
    }
}

impl Drop for StreamBuffer {
    fn drop(&mut self) {
        self.reset();
    }
}

/// A committed streamed transaction, ready to replay. Its scratch file is deleted when the
/// replay ends or when it is dropped.
pub struct CommittedTx {
    pub xid: u32,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_ts: i64,
    first_lsn: Lsn,
    path: PathBuf,
    spilled: bool,
    /// `None` once the replay is over.
    reader: Option<Box<dyn Read + Send>>,
    /// Bytes left to read.
    remaining: u64,
    aborted: HashSet<u32>,
    messages: u64,
    dropped: u64,
}

impl fmt::Debug for CommittedTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommittedTx")
            .field("xid", &self.xid)
            .field("commit_lsn", &self.commit_lsn)
            .field("end_lsn", &self.end_lsn)
            .field("commit_ts", &self.commit_ts)
            .field("first_lsn", &self.first_lsn)
            .field("spilled", &self.spilled)
            .field("messages", &self.messages)
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

impl CommittedTx {
    /// The transaction's surviving messages in their original order, each with the WAL
    /// position it arrived at, parsed with `in_stream = true`. Reads the file sequentially,
    /// one message at a time.
    ///
    /// A malformed message yields [`StreamBufferError::Malformed`] and the replay goes on.
    /// Any other error ends it: the transaction cannot be completed, so its commit must not
    /// be confirmed (the server sends it again after a reconnect).
    pub fn replay(
        &mut self,
    ) -> impl Iterator<Item = Result<(Lsn, PgOutputMessage), StreamBufferError>> + '_ {
        std::iter::from_fn(move || self.next_message())
    }

    /// The next surviving message, `None` at the end. See [`CommittedTx::replay`].
    pub fn next_message(&mut self) -> Option<Result<(Lsn, PgOutputMessage), StreamBufferError>> {
        loop {
            let reader = self.reader.as_mut()?;
            match read_record(reader, &mut self.remaining, &self.aborted, &self.path) {
                Ok(Some(Record::Kept(lsn, data))) => {
                    return Some(
                        pgoutput::parse(&data, true)
                            .map(|m| (lsn, m))
                            .map_err(|error| StreamBufferError::Malformed { lsn, data, error }),
                    );
                }
                Ok(Some(Record::Skipped)) => continue,
                Ok(None) => {
                    self.finish();
                    return None;
                }
                Err(e) => {
                    self.finish();
                    return Some(Err(e));
                }
            }
        }
    }

    /// Messages the replay yields (those of aborted subtransactions excluded).
    pub fn message_count(&self) -> u64 {
        self.messages
    }

    /// Messages skipped because their subtransaction aborted.
    pub fn dropped_count(&self) -> u64 {
        self.dropped
    }

    /// WAL position of the transaction's StreamStart.
    pub fn first_lsn(&self) -> Lsn {
        self.first_lsn
    }

    /// Whether part of the transaction was written to disk.
    pub fn spilled(&self) -> bool {
        self.spilled
    }

    fn finish(&mut self) {
        if self.reader.take().is_some() && self.spilled {
            remove_scratch(&self.path);
        }
    }
}

impl Drop for CommittedTx {
    fn drop(&mut self) {
        self.finish();
    }
}

enum Record {
    Kept(Lsn, Bytes),
    Skipped,
}

fn read_record(
    reader: &mut dyn Read,
    remaining: &mut u64,
    aborted: &HashSet<u32>,
    path: &Path,
) -> Result<Option<Record>, StreamBufferError> {
    if *remaining == 0 {
        return Ok(None);
    }
    let corrupt = |reason: String| StreamBufferError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let read_err = |source: io::Error| {
        if source.kind() == io::ErrorKind::UnexpectedEof {
            corrupt("the file is shorter than what was written".into())
        } else {
            io_error(path, source)
        }
    };
    if *remaining < HEADER_LEN as u64 {
        return Err(corrupt(format!("{remaining} trailing bytes")));
    }
    let mut header = [0u8; HEADER_LEN];
    reader.read_exact(&mut header).map_err(read_err)?;
    *remaining -= HEADER_LEN as u64;
    let [l0, l1, l2, l3, l4, l5, l6, l7, x0, x1, x2, x3, n0, n1, n2, n3] = header;
    let lsn = Lsn(u64::from_le_bytes([l0, l1, l2, l3, l4, l5, l6, l7]));
    let xid = u32::from_le_bytes([x0, x1, x2, x3]);
    let len = u64::from(u32::from_le_bytes([n0, n1, n2, n3]));
    if len > *remaining {
        return Err(corrupt(format!(
            "a record of {len} bytes at {lsn} but only {remaining} bytes left"
        )));
    }
    *remaining -= len;
    if aborted.contains(&xid) {
        let skipped = io::copy(&mut reader.take(len), &mut io::sink()).map_err(read_err)?;
        if skipped != len {
            return Err(read_err(io::ErrorKind::UnexpectedEof.into()));
        }
        return Ok(Some(Record::Skipped));
    }
    let mut data = vec![0u8; len as usize];
    reader.read_exact(&mut data).map_err(read_err)?;
    Ok(Some(Record::Kept(lsn, Bytes::from(data))))
}

fn protocol(lsn: Lsn, reason: impl Into<String>) -> StreamBufferError {
    StreamBufferError::Protocol {
        lsn,
        reason: reason.into(),
    }
}

fn io_error(path: &Path, source: io::Error) -> StreamBufferError {
    StreamBufferError::Io {
        path: path.to_owned(),
        source,
    }
}

fn remove_scratch(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(path = %path.display(), error = %error, "cannot delete stream buffer file; the next start deletes it")
        }
    }
}

#[cfg(test)]
mod tests;
