use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, BytesMut};

use super::*;
use crate::pgoutput::TupleValue;

const REL: u32 = 16384;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "wal2delta-stream-buffer-{}-{name}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A buffer in its own directory, fed with increasing LSNs.
struct Harness {
    buf: StreamBuffer,
    lsn: u64,
    dir: TempDir,
}

impl Harness {
    fn new(name: &str, limit: usize) -> Self {
        let dir = TempDir::new(name);
        let buf = StreamBuffer::new(dir.0.clone(), limit).unwrap();
        Harness {
            buf,
            lsn: 0x1000,
            dir,
        }
    }

    fn try_feed(&mut self, data: Bytes) -> Result<Routed, StreamBufferError> {
        self.lsn += 0x10;
        self.buf.on_message(Lsn(self.lsn), data)
    }

    fn feed(&mut self, data: Bytes) -> Routed {
        self.try_feed(data).unwrap()
    }

    /// Feeds a message that must be buffered; returns its LSN.
    fn buffered(&mut self, data: Bytes) -> Lsn {
        assert!(matches!(self.feed(data), Routed::Buffered));
        Lsn(self.lsn)
    }

    fn commit(&mut self, xid: u32) -> CommittedTx {
        match self.feed(stream_commit(xid, 0x9000)) {
            Routed::Commit(tx) => tx,
            other => panic!("expected a commit, got {other:?}"),
        }
    }

    fn files(&self) -> Vec<PathBuf> {
        scratch_files(&self.dir.0)
    }
}

fn scratch_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(FILE_SUFFIX))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn replay_all(tx: &mut CommittedTx) -> Vec<(Lsn, PgOutputMessage)> {
    tx.replay().map(|r| r.unwrap()).collect()
}

fn values(messages: &[(Lsn, PgOutputMessage)]) -> Vec<String> {
    messages.iter().map(|(_, m)| value_of(m)).collect()
}

/// The first column of an Insert, or the message kind.
fn value_of(m: &PgOutputMessage) -> String {
    match m {
        PgOutputMessage::Insert { new, .. } => match &new[0] {
            TupleValue::Text(t) => String::from_utf8_lossy(t).into_owned(),
            other => format!("{other:?}"),
        },
        PgOutputMessage::Relation { rel_id, .. } => format!("relation {rel_id}"),
        PgOutputMessage::Type { type_oid, .. } => format!("type {type_oid}"),
        other => format!("{other:?}"),
    }
}

// --- raw pgoutput messages -------------------------------------------------------------

fn stream_start(xid: u32, first_segment: bool) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'S');
    b.put_u32(xid);
    b.put_u8(u8::from(first_segment));
    b.freeze()
}

fn stream_stop() -> Bytes {
    Bytes::from_static(b"E")
}

fn stream_commit(xid: u32, commit_lsn: u64) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'c');
    b.put_u32(xid);
    b.put_u8(0);
    b.put_u64(commit_lsn);
    b.put_u64(commit_lsn + 0x28);
    b.put_u64(777);
    b.freeze()
}

fn stream_abort(xid: u32, subxid: u32) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'A');
    b.put_u32(xid);
    b.put_u32(subxid);
    b.freeze()
}

fn begin(xid: u32) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'B');
    b.put_u64(0x5000);
    b.put_u64(123);
    b.put_u32(xid);
    b.freeze()
}

fn commit(commit_lsn: u64) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'C');
    b.put_u8(0);
    b.put_u64(commit_lsn);
    b.put_u64(commit_lsn + 0x28);
    b.put_u64(123);
    b.freeze()
}

fn put_xid(b: &mut BytesMut, xid: Option<u32>) {
    if let Some(x) = xid {
        b.put_u32(x);
    }
}

fn insert(xid: Option<u32>, value: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'I');
    put_xid(&mut b, xid);
    b.put_u32(REL);
    b.put_u8(b'N');
    b.put_u16(1);
    b.put_u8(b't');
    b.put_u32(value.len() as u32);
    b.put_slice(value.as_bytes());
    b.freeze()
}

fn update(xid: Option<u32>, value: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'U');
    put_xid(&mut b, xid);
    b.put_u32(REL);
    b.put_u8(b'N');
    b.put_u16(1);
    b.put_u8(b't');
    b.put_u32(value.len() as u32);
    b.put_slice(value.as_bytes());
    b.freeze()
}

fn delete(xid: Option<u32>, value: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'D');
    put_xid(&mut b, xid);
    b.put_u32(REL);
    b.put_u8(b'K');
    b.put_u16(1);
    b.put_u8(b't');
    b.put_u32(value.len() as u32);
    b.put_slice(value.as_bytes());
    b.freeze()
}

fn truncate(xid: Option<u32>) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'T');
    put_xid(&mut b, xid);
    b.put_u32(1);
    b.put_u8(1);
    b.put_u32(REL);
    b.freeze()
}

fn logical_message(xid: Option<u32>, content: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'M');
    put_xid(&mut b, xid);
    b.put_u8(1);
    b.put_u64(0x4242);
    b.put_slice(b"app\0");
    b.put_u32(content.len() as u32);
    b.put_slice(content.as_bytes());
    b.freeze()
}

fn relation(xid: Option<u32>, rel_id: u32) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'R');
    put_xid(&mut b, xid);
    b.put_u32(rel_id);
    b.put_slice(b"public\0t\0");
    b.put_u8(b'd');
    b.put_u16(1);
    b.put_u8(1);
    b.put_slice(b"id\0");
    b.put_u32(23);
    b.put_i32(-1);
    b.freeze()
}

fn type_message(xid: Option<u32>, oid: u32) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'Y');
    put_xid(&mut b, xid);
    b.put_u32(oid);
    b.put_slice(b"public\0mood\0");
    b.freeze()
}

fn origin() -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(b'O');
    b.put_u64(0x77);
    b.put_slice(b"upstream\0");
    b.freeze()
}

// --- tests -------------------------------------------------------------------------------

#[test]
fn stream_xid_reads_the_xid_after_the_tag() {
    assert_eq!(pgoutput::stream_xid(&insert(Some(501), "x")), Some(501));
    assert_eq!(pgoutput::stream_xid(&relation(Some(7), REL)), Some(7));
    assert_eq!(pgoutput::stream_xid(&type_message(Some(8), 1)), Some(8));
    assert_eq!(pgoutput::stream_xid(&update(Some(9), "x")), Some(9));
    assert_eq!(pgoutput::stream_xid(&delete(Some(10), "x")), Some(10));
    assert_eq!(pgoutput::stream_xid(&truncate(Some(11))), Some(11));
    assert_eq!(
        pgoutput::stream_xid(&logical_message(Some(12), "m")),
        Some(12)
    );
    assert_eq!(pgoutput::stream_xid(&stream_start(5, true)), None);
    assert_eq!(pgoutput::stream_xid(&begin(5)), None);
    assert_eq!(pgoutput::stream_xid(&Bytes::from_static(b"I\0\0")), None);
    assert_eq!(pgoutput::stream_xid(&Bytes::new()), None);
}

#[test]
fn interleaved_blocks_and_a_normal_transaction_between_them() {
    let mut h = Harness::new("interleaved", 1 << 20);

    // First block of 100.
    h.buffered(stream_start(100, true));
    assert_eq!(h.buf.in_stream_block(), Some(100));
    let schema = h.feed(relation(Some(100), REL));
    let rel_lsn = Lsn(h.lsn);
    assert!(
        matches!(&schema, Routed::Schema { message: m, .. } if *m == pgoutput::parse(&relation(Some(100), REL), true).unwrap())
    );
    let a1 = h.buffered(insert(Some(100), "a1"));
    let a2 = h.buffered(insert(Some(100), "a2"));
    h.buffered(stream_stop());
    assert_eq!(h.buf.in_stream_block(), None);

    // First block of 200.
    h.buffered(stream_start(200, true));
    let b1 = h.buffered(insert(Some(200), "b1"));
    h.buffered(stream_stop());
    assert_eq!(h.buf.open_transactions(), 2);

    // An ordinary transaction between blocks passes straight through.
    assert!(matches!(
        h.feed(begin(300)),
        Routed::Pass(PgOutputMessage::Begin { xid: 300, .. })
    ));
    assert!(matches!(
        h.feed(relation(None, REL)),
        Routed::Pass(PgOutputMessage::Relation { rel_id: REL, .. })
    ));
    match h.feed(insert(None, "n1")) {
        Routed::Pass(m) => assert_eq!(value_of(&m), "n1"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        h.feed(commit(0x6000)),
        Routed::Pass(PgOutputMessage::Commit { .. })
    ));
    // A heartbeat (non-transactional message) between blocks, too.
    let mut hb = BytesMut::new();
    hb.put_u8(b'M');
    hb.put_u8(0);
    hb.put_u64(0x6100);
    hb.put_slice(b"wal2delta.heartbeat\0");
    hb.put_u32(0);
    assert!(matches!(
        h.feed(hb.freeze()),
        Routed::Pass(PgOutputMessage::Message {
            transactional: false,
            ..
        })
    ));

    // Second blocks.
    h.buffered(stream_start(100, false));
    let a3 = h.buffered(insert(Some(100), "a3"));
    h.buffered(stream_stop());
    h.buffered(stream_start(200, false));
    let b2 = h.buffered(insert(Some(200), "b2"));
    h.buffered(stream_stop());
    assert!(h.buf.buffered_bytes() > 0);

    // 200 commits first.
    let mut tx = h.commit(200);
    assert_eq!(tx.xid, 200);
    assert_eq!(tx.commit_lsn, Lsn(0x9000));
    assert_eq!(tx.end_lsn, Lsn(0x9028));
    assert_eq!(tx.commit_ts, 777);
    assert_eq!(tx.message_count(), 2);
    let got = replay_all(&mut tx);
    assert_eq!(values(&got), ["b1", "b2"]);
    assert_eq!(got.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [b1, b2]);
    assert_eq!(h.buf.open_transactions(), 1);

    let mut tx = h.commit(100);
    let got = replay_all(&mut tx);
    assert_eq!(values(&got), ["relation 16384", "a1", "a2", "a3"]);
    assert_eq!(
        got.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        [rel_lsn, a1, a2, a3]
    );
    assert_eq!(h.buf.open_transactions(), 0);
    assert_eq!(h.buf.buffered_bytes(), 0);
    assert_eq!(h.buf.memory_bytes(), 0);
    // Replay is over: the iterator stays empty.
    assert!(tx.next_message().is_none());
}

#[test]
fn commit_replays_every_kind_of_message_exactly_as_parsed() {
    for limit in [0, 64, 1 << 20] {
        let mut h = Harness::new("kinds", limit);
        h.buffered(stream_start(42, true));
        let sent = vec![
            origin(),
            relation(Some(42), REL),
            type_message(Some(42), 99_001),
            insert(Some(42), "i"),
            update(Some(43), "u"),
            delete(Some(42), "d"),
            truncate(Some(43)),
            logical_message(Some(42), "hello"),
        ];
        let mut expected = Vec::new();
        for data in &sent {
            let routed = h.feed(data.clone());
            let parsed = pgoutput::parse(data, true).unwrap();
            match data[0] {
                b'R' | b'Y' => {
                    assert!(matches!(&routed, Routed::Schema { message: m, .. } if *m == parsed))
                }
                _ => assert!(matches!(routed, Routed::Buffered)),
            }
            expected.push((Lsn(h.lsn), parsed));
        }
        h.buffered(stream_stop());
        let mut tx = h.commit(42);
        assert_eq!(tx.message_count(), sent.len() as u64);
        assert_eq!(tx.spilled(), limit < 1 << 20, "limit {limit}");
        let got = replay_all(&mut tx);
        assert_eq!(got, expected, "limit {limit}");
        assert!(h.files().is_empty(), "file deleted after the replay");
    }
}

#[test]
fn subtransaction_abort_drops_only_that_subxids_changes() {
    let mut h = Harness::new("subxact", 1 << 20);
    h.buffered(stream_start(100, true));
    h.buffered(insert(Some(100), "a"));
    assert!(matches!(
        h.feed(relation(Some(101), 777)),
        Routed::Schema { .. }
    ));
    h.buffered(insert(Some(101), "b"));
    h.buffered(insert(Some(102), "c"));
    h.buffered(insert(Some(101), "d"));
    h.buffered(stream_stop());

    match h.feed(stream_abort(100, 101)) {
        Routed::Aborted {
            xid: 100,
            subxid: 101,
            dropped: 3,
        } => {}
        other => panic!("{other:?}"),
    }
    // A subtransaction that made no change.
    assert!(matches!(
        h.feed(stream_abort(100, 555)),
        Routed::Aborted { dropped: 0, .. }
    ));
    assert_eq!(h.buf.open_transactions(), 1);

    h.buffered(stream_start(100, false));
    h.buffered(insert(Some(100), "e"));
    // Anything still attributed to the aborted subxid is never published either.
    h.buffered(insert(Some(101), "late"));
    h.buffered(insert(Some(103), "f"));
    h.buffered(stream_stop());

    let mut tx = h.commit(100);
    assert_eq!(tx.message_count(), 4);
    assert_eq!(tx.dropped_count(), 4);
    assert_eq!(values(&replay_all(&mut tx)), ["a", "c", "e", "f"]);
}

#[test]
fn subtransaction_abort_of_spilled_records_skips_them_on_disk() {
    // Limit 0: every record goes to the file, so the skipping happens while reading it.
    let mut h = Harness::new("subxact-disk", 0);
    h.buffered(stream_start(100, true));
    for i in 0..50 {
        let xid = if i % 3 == 0 { 101 } else { 100 };
        h.buffered(insert(Some(xid), &format!("v{i}")));
    }
    h.buffered(stream_stop());
    assert_eq!(h.buf.memory_bytes(), 0);
    assert!(matches!(
        h.feed(stream_abort(100, 101)),
        Routed::Aborted { dropped: 17, .. }
    ));
    let mut tx = h.commit(100);
    let expected: Vec<String> = (0..50)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("v{i}"))
        .collect();
    assert_eq!(values(&replay_all(&mut tx)), expected);
}

#[test]
fn top_level_abort_drops_everything_and_removes_files() {
    let mut h = Harness::new("abort", 256);
    h.buffered(stream_start(100, true));
    for i in 0..100 {
        h.buffered(insert(Some(100 + i % 2), &format!("value {i}")));
    }
    h.buffered(stream_stop());
    h.buffered(stream_start(200, true));
    h.buffered(insert(Some(200), "other"));
    h.buffered(stream_stop());
    assert!(!h.files().is_empty(), "the small limit forced a spill");

    match h.feed(stream_abort(100, 100)) {
        Routed::Aborted {
            xid: 100,
            subxid: 100,
            dropped: 100,
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(h.buf.open_transactions(), 1);
    assert!(
        h.files()
            .iter()
            .all(|p| !p.to_string_lossy().contains("stream-100-")),
        "{:?}",
        h.files()
    );

    // Nothing of it can come back: a commit is now a protocol error.
    assert!(matches!(
        h.try_feed(stream_commit(100, 0x9000)),
        Err(StreamBufferError::Protocol { .. })
    ));

    match h.feed(stream_abort(200, 200)) {
        Routed::Aborted { dropped: 1, .. } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(h.buf.open_transactions(), 0);
    assert_eq!(h.buf.buffered_bytes(), 0);
    assert_eq!(h.buf.memory_bytes(), 0);
    assert!(h.files().is_empty());

    // An abort of a transaction never streamed drops nothing and is not an error.
    assert!(matches!(
        h.feed(stream_abort(999, 999)),
        Routed::Aborted { dropped: 0, .. }
    ));
    assert!(matches!(
        h.feed(stream_abort(999, 1000)),
        Routed::Aborted { dropped: 0, .. }
    ));
}

#[test]
fn memory_limit_forces_spills_and_replay_returns_everything() {
    const LIMIT: usize = 64 * 1024;
    const TOTAL: usize = 200_000;
    let mut h = Harness::new("spill", LIMIT);
    let mut expected_bytes = 0u64;
    let mut sent: HashMap<u32, u64> = HashMap::new();
    let mut first = HashSet::new();
    let mut n = 0usize;
    while n < TOTAL {
        for xid in [100u32, 200] {
            h.buffered(stream_start(xid, first.insert(xid)));
            for _ in 0..1000 {
                let seq = sent.entry(xid).or_default();
                let data = insert(Some(xid), &format!("{xid}:{seq}"));
                *seq += 1;
                expected_bytes += (HEADER_LEN + data.len()) as u64;
                h.buffered(data);
                n += 1;
                assert!(h.buf.memory_bytes() <= LIMIT, "{}", h.buf.memory_bytes());
            }
            h.buffered(stream_stop());
        }
        // Ordinary transactions keep flowing between blocks.
        assert!(matches!(h.feed(begin(1)), Routed::Pass(_)));
        assert!(matches!(h.feed(insert(None, "plain")), Routed::Pass(_)));
        assert!(matches!(h.feed(commit(0x7000)), Routed::Pass(_)));
    }
    assert_eq!(h.buf.buffered_bytes(), expected_bytes);
    assert!(h.buf.memory_bytes() <= LIMIT);
    let files = h.files();
    assert_eq!(files.len(), 2, "{files:?}");
    let on_disk: u64 = files.iter().map(|f| fs::metadata(f).unwrap().len()).sum();
    assert_eq!(on_disk + h.buf.memory_bytes() as u64, expected_bytes);
    assert!(on_disk > 10 * LIMIT as u64);

    for xid in [200u32, 100] {
        let mut tx = h.commit(xid);
        assert!(tx.spilled());
        assert_eq!(tx.message_count(), sent[&xid]);
        let mut count = 0u64;
        let mut last_lsn = Lsn::ZERO;
        for item in tx.replay() {
            let (lsn, m) = item.unwrap();
            assert!(lsn > last_lsn);
            last_lsn = lsn;
            assert_eq!(value_of(&m), format!("{xid}:{count}"));
            count += 1;
        }
        assert_eq!(count, sent[&xid]);
    }
    assert_eq!(h.buf.buffered_bytes(), 0);
    assert!(h.files().is_empty());
}

#[test]
fn a_message_larger_than_the_limit_goes_straight_to_disk() {
    let mut h = Harness::new("large", 100);
    h.buffered(stream_start(7, true));
    h.buffered(insert(Some(7), "small"));
    let before = h.buf.memory_bytes();
    assert!(before > 0 && h.files().is_empty());
    let big = "x".repeat(10_000);
    h.buffered(insert(Some(7), &big));
    h.buffered(insert(Some(7), "after"));
    h.buffered(stream_stop());
    assert!(h.buf.memory_bytes() <= 100);
    assert_eq!(h.files().len(), 1);
    let mut tx = h.commit(7);
    assert_eq!(
        values(&replay_all(&mut tx)),
        ["small", big.as_str(), "after"]
    );
}

#[test]
fn new_deletes_leftover_files_only() {
    let dir = TempDir::new("leftover");
    let nested = dir.0.join("a").join("b");
    fs::create_dir_all(&nested).unwrap();
    fs::write(nested.join("stream-7-0.w2dbuf"), b"garbage").unwrap();
    fs::write(nested.join("stream-8-3.w2dbuf"), b"").unwrap();
    fs::write(nested.join("keep.txt"), b"operator notes").unwrap();
    let buf = StreamBuffer::new(nested.clone(), 1024).unwrap();
    assert!(scratch_files(&nested).is_empty());
    assert!(nested.join("keep.txt").exists());
    assert_eq!(buf.dir(), nested.as_path());
    assert_eq!(buf.open_transactions(), 0);
    assert_eq!(buf.buffered_bytes(), 0);
    drop(buf);

    // A missing directory is created.
    let fresh = dir.0.join("new").join("dir");
    StreamBuffer::new(fresh.clone(), 1024).unwrap();
    assert!(fresh.is_dir());

    // A path that cannot be a directory is an error naming it, not a panic.
    let file = dir.0.join("plain-file");
    fs::write(&file, b"x").unwrap();
    let err = StreamBuffer::new(file.clone(), 1024).unwrap_err();
    assert!(err.to_string().contains("plain-file"), "{err}");
}

#[test]
fn files_are_removed_when_replay_ends_or_on_drop() {
    let mut h = Harness::new("cleanup", 0);
    for xid in [1u32, 2, 3, 4] {
        h.buffered(stream_start(xid, true));
        for i in 0..10 {
            h.buffered(insert(Some(xid), &format!("{i}")));
        }
        h.buffered(stream_stop());
    }
    assert_eq!(h.files().len(), 4);

    // Dropped before the replay.
    drop(h.commit(1));
    assert_eq!(h.files().len(), 3);
    // Dropped half way.
    let mut tx = h.commit(2);
    assert!(tx.next_message().unwrap().is_ok());
    drop(tx);
    assert_eq!(h.files().len(), 2);
    // Replayed to the end, still held.
    let mut tx = h.commit(3);
    assert_eq!(replay_all(&mut tx).len(), 10);
    assert_eq!(h.files().len(), 1);
    drop(tx);

    // Reset (reconnect) forgets open transactions and their files; the server then
    // streams them from their first segment again.
    h.buffered(stream_start(4, false));
    h.buf.reset();
    assert_eq!(h.buf.in_stream_block(), None);
    assert_eq!(h.buf.open_transactions(), 0);
    assert_eq!(h.buf.buffered_bytes(), 0);
    assert!(h.files().is_empty());
    assert!(matches!(
        h.try_feed(stream_start(4, false)),
        Err(StreamBufferError::Protocol { .. })
    ));
    h.buffered(stream_start(4, true));
    h.buffered(insert(Some(4), "again"));
    h.buffered(stream_stop());
    assert_eq!(h.files().len(), 1);

    // Dropping the buffer deletes the files of open transactions.
    let dir = h.dir.0.clone();
    drop(h.buf);
    assert!(scratch_files(&dir).is_empty());
}

#[test]
fn malformed_sequences_are_errors_and_change_nothing() {
    let mut h = Harness::new("malformed", 1 << 20);
    let protocol_err = |r: Result<Routed, StreamBufferError>| {
        assert!(
            matches!(r, Err(StreamBufferError::Protocol { .. })),
            "{r:?}"
        );
    };
    let malformed_err = |r: Result<Routed, StreamBufferError>| {
        assert!(
            matches!(r, Err(StreamBufferError::Malformed { .. })),
            "{r:?}"
        );
    };

    // Outside a block.
    protocol_err(h.try_feed(stream_stop()));
    protocol_err(h.try_feed(stream_commit(5, 0x10)));
    protocol_err(h.try_feed(stream_start(5, false)));
    malformed_err(h.try_feed(Bytes::new()));
    malformed_err(h.try_feed(Bytes::from_static(b"S\0\0")));
    malformed_err(h.try_feed(Bytes::from_static(b"Z")));
    assert_eq!(h.buf.open_transactions(), 0);
    assert_eq!(h.buf.in_stream_block(), None);

    // Inside a block.
    h.buffered(stream_start(5, true));
    h.buffered(insert(Some(5), "kept"));
    let bytes = h.buf.buffered_bytes();
    protocol_err(h.try_feed(stream_start(6, true)));
    protocol_err(h.try_feed(stream_start(5, false)));
    protocol_err(h.try_feed(begin(6)));
    protocol_err(h.try_feed(commit(0x20)));
    protocol_err(h.try_feed(stream_commit(5, 0x20)));
    protocol_err(h.try_feed(stream_abort(5, 5)));
    malformed_err(h.try_feed(Bytes::new()));
    malformed_err(h.try_feed(Bytes::from_static(b"I\0\0")));
    malformed_err(h.try_feed(Bytes::from_static(b"R\0\0\0\x05\0\0")));
    let err = h.try_feed(Bytes::from_static(b"Y\0\0\0\x05")).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Record);
    assert!(
        matches!(&err, StreamBufferError::Malformed { data, .. } if &data[..] == b"Y\0\0\0\x05")
    );
    assert_eq!(
        h.buf.buffered_bytes(),
        bytes,
        "rejected messages are not buffered"
    );
    assert_eq!(h.buf.in_stream_block(), Some(5));
    h.buffered(stream_stop());

    // First segment twice.
    protocol_err(h.try_feed(stream_start(5, true)));
    assert_eq!(h.buf.open_transactions(), 1);

    // The stream goes on after all that.
    let mut tx = h.commit(5);
    assert_eq!(values(&replay_all(&mut tx)), ["kept"]);
    let e = h.try_feed(stream_commit(5, 0x10)).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Operator);
    assert!(
        e.to_string().contains("StreamCommit of transaction 5"),
        "{e}"
    );
}

#[test]
fn a_malformed_buffered_message_is_reported_on_replay_and_the_replay_goes_on() {
    for limit in [0, 1 << 20] {
        let mut h = Harness::new("bad-record", limit);
        h.buffered(stream_start(9, true));
        h.buffered(insert(Some(9), "before"));
        // Right xid, but an unknown tuple column kind.
        let mut bad = BytesMut::new();
        bad.put_u8(b'I');
        bad.put_u32(9);
        bad.put_u32(REL);
        bad.put_u8(b'N');
        bad.put_u16(1);
        bad.put_u8(b'?');
        let bad = bad.freeze();
        let bad_lsn = h.buffered(bad.clone());
        // An unknown message type is kept in order and reported, too.
        let unknown_lsn = h.buffered(Bytes::from_static(b"Zfuture"));
        h.buffered(insert(Some(9), "after"));
        h.buffered(stream_stop());
        let mut tx = h.commit(9);
        let items: Vec<_> = tx.replay().collect();
        assert_eq!(items.len(), 4);
        assert_eq!(value_of(&items[0].as_ref().unwrap().1), "before");
        match &items[1] {
            Err(StreamBufferError::Malformed { lsn, data, .. }) => {
                assert_eq!(*lsn, bad_lsn);
                assert_eq!(*data, bad);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&items[2], Err(StreamBufferError::Malformed { lsn, .. }) if *lsn == unknown_lsn)
        );
        assert_eq!(value_of(&items[3].as_ref().unwrap().1), "after");
    }
}

#[test]
fn a_damaged_file_is_reported_not_trusted() {
    let mut h = Harness::new("corrupt", 0);
    h.buffered(stream_start(3, true));
    for i in 0..10 {
        h.buffered(insert(Some(3), &format!("{i}")));
    }
    h.buffered(stream_stop());
    let files = h.files();
    assert_eq!(files.len(), 1);
    let len = fs::metadata(&files[0]).unwrap().len();
    let mut tx = h.commit(3);
    // Someone cut the file short between the commit and the replay.
    OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let items: Vec<_> = tx.replay().collect();
    assert_eq!(items.len(), 10);
    assert!(items[..9].iter().all(|r| r.is_ok()));
    let err = items[9].as_ref().unwrap_err();
    assert!(matches!(err, StreamBufferError::Corrupt { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Transient);
    assert!(
        tx.next_message().is_none(),
        "the replay ends after a damaged file"
    );
    assert!(h.files().is_empty());
}

#[test]
fn random_sequences_never_panic_and_memory_stays_bounded() {
    const LIMIT: usize = 512;
    let mut h = Harness::new("fuzz", LIMIT);
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let r = next();
        let xid = (r % 4) as u32 + 1;
        let sub = xid * 10 + ((r >> 8) % 3) as u32;
        let mut data = match (r >> 16) % 12 {
            0 => stream_start(xid, (r >> 24) % 2 == 0),
            1 => stream_stop(),
            2 => stream_commit(xid, r >> 32),
            3 => stream_abort(xid, if (r >> 24) % 2 == 0 { xid } else { sub }),
            4 => begin(xid),
            5 => commit(r >> 32),
            6 => relation(Some(sub), REL),
            7 => relation(None, REL),
            _ => insert(Some(sub), &"v".repeat((r >> 40) as usize % 300)),
        }
        .to_vec();
        // Sometimes damage it.
        match (r >> 28) % 8 {
            0 => data.truncate((r >> 44) as usize % (data.len() + 1)),
            1 => {
                let i = (r >> 44) as usize % data.len();
                data[i] = (r >> 52) as u8;
            }
            _ => {}
        }
        if let Ok(Routed::Commit(mut tx)) = h.try_feed(Bytes::from(data)) {
            for item in tx.replay() {
                let _ = item;
            }
        }
        assert!(h.buf.memory_bytes() <= LIMIT);
        if h.buf.open_transactions() == 0 {
            assert_eq!(h.buf.buffered_bytes(), 0);
        }
    }
}

#[test]
fn buffer_and_committed_transactions_can_move_between_tasks() {
    fn send<T: Send>() {}
    send::<StreamBuffer>();
    send::<CommittedTx>();
    send::<Routed>();
    send::<StreamBufferError>();
}
