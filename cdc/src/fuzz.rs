//! Entry points of the fuzz targets (`fuzz/`, cargo-fuzz on nightly) and of the corpus
//! regression test (`cdc/tests/fuzz_corpus.rs`, stable): both feed bytes through these
//! functions, so the committed corpus guards the same code the fuzzer explores.
//!
//! Each function accepts any bytes and must return without panicking, hanging or
//! allocating more than a small multiple of its input. They panic only when an invariant
//! of the decoder is broken (that is a finding).

use std::sync::Arc;

use bytes::Bytes;
use wal2delta_model::{
    BaseType, Column, ColumnType, Lsn, ReplicaIdentity, TableName, TableSchema, TypeKind,
};

use crate::decoder::{Decoded, Decoder};
use crate::pgoutput::{self, PgOutputMessage, RelationColumn};
use crate::value::{parse_text, render_text};

/// The OIDs of every built-in type with a native mapping, in `BaseType` order.
pub const BASE_OIDS: [u32; 31] = [
    16, 21, 23, 20, 26, 700, 701, 1700, 25, 1043, 1042, 19, 18, 17, 2950, 114, 3802, 1082, 1083,
    1266, 1114, 1184, 1186, 869, 650, 829, 774, 790, 1560, 1562, 142,
];

/// Built-in array type OIDs and their element OIDs.
const ARRAY_OIDS: [(u32, u32); 20] = [
    (1000, 16),
    (1001, 17),
    (1005, 21),
    (1007, 23),
    (1016, 20),
    (1009, 25),
    (1015, 1043),
    (1014, 1042),
    (1021, 700),
    (1022, 701),
    (1231, 1700),
    (1182, 1082),
    (1183, 1083),
    (1270, 1266),
    (1115, 1114),
    (1185, 1184),
    (1187, 1186),
    (2951, 2950),
    (199, 114),
    (3807, 3802),
];

/// A type resolved without a catalog: built-in scalars and their arrays; any other OID
/// is `Other` (travels as text), as the catalog makes of extension types.
pub fn offline_type(oid: u32, typmod: i32) -> ColumnType {
    let kind = if let Some(base) = BaseType::from_oid(oid) {
        TypeKind::Base(base)
    } else if let Some((_, elem)) = ARRAY_OIDS.iter().find(|(a, _)| *a == oid) {
        TypeKind::Array {
            element: Box::new(offline_type(*elem, typmod)),
        }
    } else {
        TypeKind::Other
    };
    let name = match &kind {
        TypeKind::Base(b) => format!("{b:?}").to_ascii_lowercase(),
        TypeKind::Array { element } => format!("{}[]", element.name),
        _ => format!("oid:{oid}"),
    };
    ColumnType {
        oid,
        typmod,
        name,
        kind,
    }
}

fn offline_relation(
    rel_id: u32,
    namespace: String,
    name: String,
    replica_identity: u8,
    columns: Vec<RelationColumn>,
) -> TableSchema {
    TableSchema {
        relation_oid: rel_id,
        table: TableName::new(namespace, name),
        columns: columns
            .into_iter()
            .map(|c| Column {
                ty: offline_type(c.type_oid, c.typmod),
                name: c.name,
                is_key: c.is_key,
            })
            .collect(),
        replica_identity: ReplicaIdentity::from_code(replica_identity),
    }
}

/// Splits a pgoutput fuzz input into messages: byte 0 holds flags (bit 0: the messages
/// are inside a stream block, protocol version 2), then each message is a big-endian u16
/// length and that many bytes; a final frame that is cut short is taken as it is.
pub fn split_messages(data: &[u8]) -> (bool, Vec<Bytes>) {
    let Some((&flags, mut rest)) = data.split_first() else {
        return (false, Vec::new());
    };
    let mut out = Vec::new();
    while !rest.is_empty() {
        if rest.len() < 2 {
            out.push(Bytes::copy_from_slice(rest));
            break;
        }
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let body = &rest[2..];
        let n = len.min(body.len());
        out.push(Bytes::copy_from_slice(&body[..n]));
        rest = &body[n..];
    }
    (flags & 1 == 1, out)
}

/// The inverse of [`split_messages`], for building corpus files.
pub fn join_messages(in_stream: bool, messages: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![u8::from(in_stream)];
    for m in messages {
        let len = u16::try_from(m.len()).expect("a corpus message under 64 KiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(m);
    }
    out
}

/// The pgoutput target: parses each message ([`pgoutput::parse`], [`pgoutput::stream_xid`])
/// and runs the parsed ones through one [`Decoder`] (Relation messages are resolved with
/// [`offline_type`]), rendering every dead letter as capture does.
pub fn pgoutput(data: &[u8]) {
    let (in_stream, messages) = split_messages(data);
    let mut decoder = Decoder::new();
    for (i, msg) in messages.iter().enumerate() {
        let _ = pgoutput::stream_xid(msg);
        // Both protocol readings of every message.
        let _ = pgoutput::parse(msg, !in_stream);
        let parsed = match pgoutput::parse(msg, in_stream) {
            Ok(m) => m,
            Err(e) => {
                let _ = e.to_string();
                continue;
            }
        };
        let lsn = Lsn(i as u64);
        let decoded = match parsed {
            PgOutputMessage::Relation {
                rel_id,
                namespace,
                name,
                replica_identity,
                columns,
            } => {
                let schema = offline_relation(rel_id, namespace, name, replica_identity, columns);
                decoder.insert_relation(Arc::new(schema));
                continue;
            }
            m => decoder.decode_cached(m, lsn),
        };
        match decoded {
            Ok(Decoded::Undecodable { reason, raw, .. }) => {
                let _ = raw.render(|_, t| t.len().to_string());
                let _ = reason;
            }
            Ok(Decoded::Change { schema, change }) => {
                for row in change.before.iter().chain(change.after.iter()) {
                    assert_eq!(row.values.len(), schema.columns.len());
                }
            }
            Ok(_) => {}
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// The column type a text-value input names with its first byte: the low five bits pick
/// a built-in type (`BASE_OIDS`, wrapping), bits 5-6 pick the shape (0 and 3: the type,
/// 1: an array of it, 2: a domain over it); bit 7 gives it a typmod (`numeric(10,2)`).
pub fn text_value_type(selector: u8) -> ColumnType {
    let oid = BASE_OIDS[usize::from(selector & 0x1f) % BASE_OIDS.len()];
    let typmod = if selector & 0x80 != 0 {
        ((10 << 16) | 2) + 4
    } else {
        -1
    };
    let base = offline_type(oid, typmod);
    match (selector >> 5) & 3 {
        1 => ColumnType {
            oid: 0,
            typmod,
            name: format!("{}[]", base.name),
            kind: TypeKind::Array {
                element: Box::new(base),
            },
        },
        2 => ColumnType {
            oid: 0,
            typmod: -1,
            name: "public.fuzz_domain".into(),
            kind: TypeKind::Domain {
                base: Box::new(base),
            },
        },
        _ => base,
    }
}

/// The text-value target: byte 0 picks the type ([`text_value_type`]), the rest is the
/// text pgoutput would send. A value that decodes must render back to text that decodes
/// to a value rendering the same (the canonical form is a fixed point).
pub fn text_value(data: &[u8]) {
    let Some((&selector, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let ty = text_value_type(selector);
    match parse_text(&ty, text) {
        Ok(datum) => {
            let rendered = render_text(&ty, &datum);
            let again = parse_text(&ty, &rendered).unwrap_or_else(|e| {
                panic!(
                    "{}: the rendering of a decoded value does not decode: {e}",
                    ty.name
                )
            });
            assert_eq!(
                render_text(&ty, &again),
                rendered,
                "{}: rendering is not a fixed point",
                ty.name
            );
        }
        Err(e) => {
            let _ = (e.to_string(), e.code(), e.class());
        }
    }
}

// ---- seeds --------------------------------------------------------------------------------

fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_cstr(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(s.as_bytes());
    b.push(0);
}

/// Columns of the seed relation: (name, type OID, typmod, text of a typical value).
const SEED_COLUMNS: [(&str, u32, i32, &str); 24] = [
    ("id", 20, -1, "9223372036854775807"),
    ("b", 16, -1, "t"),
    ("i2", 21, -1, "-32768"),
    ("i4", 23, -1, "42"),
    ("f4", 700, -1, "1.2345679e+08"),
    ("f8", 701, -1, "5e-324"),
    ("n", 1700, ((12 << 16) | 2) + 4, "-123.45"),
    ("t", 25, -1, "ünïcödé \"q\" \\ {}"),
    ("c", 1042, 9, "ab   "),
    ("by", 17, -1, "\\xdeadbeef"),
    ("u", 2950, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("j", 3802, -1, "{\"a\": [1, 2]}"),
    ("d", 1082, -1, "0044-03-15 BC"),
    ("tm", 1083, -1, "24:00:00"),
    ("ttz", 1266, -1, "12:34:56.789+05:30:15"),
    ("ts", 1114, -1, "12345-01-02 03:04:05.5"),
    ("tstz", 1184, -1, "2024-01-02 03:04:05.123456+00"),
    ("iv", 1186, -1, "P1Y2M3DT4H5M6.789S"),
    ("ip", 869, -1, "10.0.0.1/8"),
    ("ia", 1007, -1, "{1,NULL,-3}"),
    ("ta", 1009, -1, "{\"a,b\",NULL,\"\\\"q\\\"\"}"),
    ("da", 1182, -1, "{infinity,-infinity,2024-02-29}"),
    ("ext", 16_500, -1, "POINT(1 2)"),
    ("x", 142, -1, "<a>1</a>"),
];

fn relation_message(in_stream: bool) -> Vec<u8> {
    let mut b = vec![b'R'];
    if in_stream {
        put_u32(&mut b, 771);
    }
    put_u32(&mut b, 16384);
    put_cstr(&mut b, "public");
    put_cstr(&mut b, "every_type");
    b.push(b'd');
    put_u16(&mut b, SEED_COLUMNS.len() as u16);
    for (i, (name, oid, typmod, _)) in SEED_COLUMNS.iter().enumerate() {
        b.push(u8::from(i == 0));
        put_cstr(&mut b, name);
        put_u32(&mut b, *oid);
        put_u32(&mut b, *typmod as u32);
    }
    b
}

fn tuple(b: &mut Vec<u8>, values: &[Option<&str>], toast_at: Option<usize>) {
    put_u16(b, values.len() as u16);
    for (i, v) in values.iter().enumerate() {
        match v {
            _ if Some(i) == toast_at => b.push(b'u'),
            None => b.push(b'n'),
            Some(t) => {
                b.push(b't');
                put_u32(b, t.len() as u32);
                b.extend_from_slice(t.as_bytes());
            }
        }
    }
}

fn typical_values() -> Vec<Option<&'static str>> {
    SEED_COLUMNS.iter().map(|c| Some(c.3)).collect()
}

fn row_message(tag: u8, in_stream: bool, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = vec![tag];
    if in_stream {
        put_u32(&mut b, 771);
    }
    put_u32(&mut b, 16384);
    body(&mut b);
    b
}

fn begin() -> Vec<u8> {
    let mut b = vec![b'B'];
    put_u64(&mut b, 0x1_6B37_5000);
    put_u64(&mut b, 754_000_000_123_456);
    put_u32(&mut b, 771);
    b
}

fn commit() -> Vec<u8> {
    let mut b = vec![b'C', 0];
    put_u64(&mut b, 0x1_6B37_5000);
    put_u64(&mut b, 0x1_6B37_5030);
    put_u64(&mut b, 754_000_000_123_456);
    b
}

/// Seed inputs of the pgoutput target: whole transactions (Begin, Relation, Insert,
/// Update with an old key and an unchanged TOAST column, a primary-key change, Delete,
/// Truncate, logical Message, Commit), a streamed transaction (protocol version 2) and
/// one file per other message kind, built the way PostgreSQL 15's pgoutput lays them out.
pub fn seed_messages() -> Vec<(String, Vec<u8>)> {
    let values = typical_values();
    let mut edge = values.clone();
    edge[1] = None;
    edge[5] = Some("-Infinity");
    edge[6] = Some("NaN");
    edge[12] = Some("infinity");
    edge[15] = Some("-infinity");
    edge[16] = Some("294247-01-10 04:00:54.775806+00");
    edge[17] = Some("P-1Y-2M3DT-4H-5M-6.789S");
    edge[19] = Some("{{1,2},{3,4}}");
    let mut moved = values.clone();
    moved[0] = Some("-1");
    let insert = |v: &[Option<&str>], s| {
        row_message(b'I', s, |b| {
            b.push(b'N');
            tuple(b, v, None);
        })
    };
    let update_toast = row_message(b'U', false, |b| {
        b.push(b'N');
        tuple(b, &edge, Some(7));
    });
    let update_key = row_message(b'U', false, |b| {
        b.push(b'K');
        let mut key = vec![None; SEED_COLUMNS.len()];
        key[0] = values[0];
        tuple(b, &key, None);
        b.push(b'N');
        tuple(b, &moved, None);
    });
    let delete = row_message(b'D', false, |b| {
        b.push(b'O');
        tuple(b, &values, None);
    });
    let mut truncate = vec![b'T'];
    put_u32(&mut truncate, 2);
    truncate.push(3);
    put_u32(&mut truncate, 16384);
    put_u32(&mut truncate, 16385);
    let mut message = vec![b'M', 1];
    put_u64(&mut message, 0x1_6B37_4000);
    put_cstr(&mut message, "wal2delta.heartbeat");
    put_u32(&mut message, 2);
    message.extend_from_slice(b"{}");
    let mut origin = vec![b'O'];
    put_u64(&mut origin, 0x1_0000_0000);
    put_cstr(&mut origin, "upstream");
    let mut ty = vec![b'Y'];
    put_u32(&mut ty, 16_500);
    put_cstr(&mut ty, "public");
    put_cstr(&mut ty, "geometry");
    let mut stream_start = vec![b'S'];
    put_u32(&mut stream_start, 771);
    stream_start.push(1);
    let mut stream_commit = vec![b'c'];
    put_u32(&mut stream_commit, 771);
    stream_commit.push(0);
    put_u64(&mut stream_commit, 0x1_6B37_5000);
    put_u64(&mut stream_commit, 0x1_6B37_5030);
    put_u64(&mut stream_commit, 754_000_000_123_456);
    let mut stream_abort = vec![b'A'];
    put_u32(&mut stream_abort, 771);
    put_u32(&mut stream_abort, 772);

    let relation = relation_message(false);
    let tx = [
        begin(),
        relation.clone(),
        insert(&values, false),
        update_toast,
        update_key,
        delete,
        truncate,
        message,
        commit(),
    ];
    let tx: Vec<&[u8]> = tx.iter().map(Vec::as_slice).collect();
    let streamed_relation = relation_message(true);
    let streamed_insert = insert(&edge, true);
    let mut out = vec![
        ("transaction".to_owned(), join_messages(false, &tx)),
        (
            "streamed".to_owned(),
            join_messages(true, &[&stream_start, &streamed_relation, &streamed_insert]),
        ),
        (
            "stream_commit".to_owned(),
            join_messages(false, &[&stream_commit]),
        ),
        (
            "stream_abort".to_owned(),
            join_messages(false, &[&stream_abort]),
        ),
        ("stream_stop".to_owned(), join_messages(false, &[b"E"])),
        ("origin".to_owned(), join_messages(false, &[&origin])),
        ("type".to_owned(), join_messages(false, &[&ty])),
        (
            "relation_then_bad_tuple".to_owned(),
            join_messages(false, &[&relation, &insert(&values[..3], false)]),
        ),
    ];
    out.sort();
    out
}

/// Seed inputs of the text-value target: (selector byte of [`text_value_type`], text),
/// typical and edge values of every type as PostgreSQL 15 prints them in the replication
/// session, and malformed ones.
pub fn seed_texts() -> Vec<(String, Vec<u8>)> {
    const ARRAY: u8 = 0x20;
    const DOMAIN: u8 = 0x40;
    const TYPMOD: u8 = 0x80;
    // Indexes into BASE_OIDS.
    let (bool_, i2, i4, i8_, oid, f4, f8, num, text, bpchar, char_, bytea, uuid, json) =
        (0u8, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 13, 14, 15);
    let (date, time, timetz, ts, tstz, interval, inet, money, bit) =
        (17u8, 18, 19, 20, 21, 22, 23, 27, 28);
    let samples: Vec<(&str, u8, &str)> = vec![
        ("bool", bool_, "t"),
        ("bool_bad", bool_, "yes"),
        ("int2_min", i2, "-32768"),
        ("int2_overflow", i2, "32768"),
        ("int4", i4, "2147483647"),
        ("int8_min", i8_, "-9223372036854775808"),
        ("oid_max", oid, "4294967295"),
        ("float4_max", f4, "3.4028235e+38"),
        ("float4_subnormal", f4, "1e-45"),
        ("float8_min", f8, "5e-324"),
        ("float8_neg_zero", f8, "-0"),
        ("float8_nan", f8, "NaN"),
        ("float8_inf", f8, "-Infinity"),
        ("numeric", num, "123.4500"),
        ("numeric_typmod", num | TYPMOD, "-99999999.99"),
        ("numeric_nan", num, "NaN"),
        ("numeric_inf", num, "-Infinity"),
        (
            "numeric_long",
            num,
            "12345678901234567890123456789012345678901234567890.000000000000000000001",
        ),
        ("text", text, "ünïcödé \"q\" \\ {}"),
        ("bpchar", bpchar, "ab   "),
        ("char_octal", char_, "\\377"),
        ("bytea", bytea, "\\xdeadbeef"),
        ("bytea_odd", bytea, "\\xabc"),
        ("uuid", uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("uuid_upper", uuid, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
        ("json", json, "{\"a\" :  1}"),
        ("date_bc", date, "0044-03-15 BC"),
        ("date_max", date, "5874897-12-31"),
        ("date_min", date, "4714-11-24 BC"),
        ("date_inf", date, "-infinity"),
        ("date_leap_bad", date, "2023-02-29"),
        ("time_24", time, "24:00:00"),
        ("time_frac", time, "23:59:59.999999"),
        ("timetz_seconds_offset", timetz, "12:34:56.789+05:30:15"),
        ("timestamp_far", ts, "294247-01-10 04:00:54.775806"),
        ("timestamp_beyond", ts, "294247-01-10 04:00:54.775807"),
        ("timestamptz", tstz, "2024-01-02 03:04:05.123456+00"),
        ("timestamptz_bc", tstz, "4714-11-24 00:00:00+00 BC"),
        ("timestamptz_inf", tstz, "infinity"),
        ("interval", interval, "P1Y2M3DT4H5M6.789S"),
        ("interval_neg", interval, "P-1Y-2M3DT-4H-5M-6.789S"),
        ("interval_zero", interval, "PT0S"),
        (
            "interval_extreme",
            interval,
            "P-178956970Y-8M-2147483648DT-2562047788H-54.775808S",
        ),
        ("inet", inet, "10.0.0.1/8"),
        ("money", money, "$12.50"),
        ("bit", bit, "101"),
        ("array_int4", i4 | ARRAY, "{1,NULL,-3}"),
        (
            "array_text",
            text | ARRAY,
            "{\"a,b\",NULL,\"\\\"q\\\"\",\"NULL\"}",
        ),
        (
            "array_date",
            date | ARRAY,
            "{infinity,-infinity,2024-02-29}",
        ),
        ("array_2d", i4 | ARRAY, "{{1,2},{3,4}}"),
        ("array_bounds", i4 | ARRAY, "[0:1]={1,2}"),
        ("array_empty", tstz | ARRAY, "{}"),
        ("array_interval", interval | ARRAY, "{P1D,PT0.000001S}"),
        ("domain_date", date | DOMAIN, "2024-01-02"),
        ("domain_bad", i4 | DOMAIN, "x"),
    ];
    samples
        .into_iter()
        .map(|(name, selector, text)| {
            let mut bytes = vec![selector];
            bytes.extend_from_slice(text.as_bytes());
            (name.to_owned(), bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed transaction exercises the decoder, not only the parser: every message
    /// parses and the rows decode (the edge row goes to the DLQ for its 2-D array).
    #[test]
    fn the_seed_transaction_decodes() {
        let (_, tx) = seed_messages()
            .into_iter()
            .find(|(n, _)| n == "transaction")
            .unwrap();
        let (in_stream, messages) = split_messages(&tx);
        let mut decoder = Decoder::new();
        let mut kinds = Vec::new();
        for m in messages {
            let parsed = pgoutput::parse(&m, in_stream).unwrap();
            if let PgOutputMessage::Relation {
                rel_id,
                namespace,
                name,
                replica_identity,
                columns,
            } = parsed
            {
                let schema = offline_relation(rel_id, namespace, name, replica_identity, columns);
                decoder.insert_relation(Arc::new(schema));
                kinds.push("relation");
                continue;
            }
            kinds.push(match decoder.decode_cached(parsed, Lsn(1)).unwrap() {
                Decoded::Begin { .. } => "begin",
                Decoded::Change { .. } => "change",
                Decoded::KeyChange { .. } => "key_change",
                Decoded::Undecodable { .. } => "undecodable",
                Decoded::Truncate(t) if t.len() == 1 => "truncate",
                Decoded::Message { .. } => "message",
                Decoded::Commit { .. } => "commit",
                _ => "other",
            });
        }
        assert_eq!(
            kinds,
            [
                "begin",
                "relation",
                "change",
                "undecodable",
                "key_change",
                "change",
                "truncate",
                "message",
                "commit"
            ]
        );
    }

    #[test]
    fn every_seed_text_of_a_valid_value_decodes() {
        for (name, bytes) in seed_texts() {
            let ty = text_value_type(bytes[0]);
            let text = std::str::from_utf8(&bytes[1..]).unwrap();
            let bad = ["bad", "overflow", "odd", "2d", "bounds", "beyond"]
                .iter()
                .any(|b| name.contains(b));
            assert_eq!(parse_text(&ty, text).is_ok(), !bad, "{name}: {text}");
        }
    }
}
