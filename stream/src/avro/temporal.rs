//! How `date`, `time`, `timestamp` and `timestamptz` travel in Avro, and how the lake reads
//! them (`docs/types.md`, "Reading events from other languages").
//!
//! **On the wire: plain integers with a semantic name.** PostgreSQL's temporal ranges are
//! wider than the calendars of Avro clients: dates go to 5874897-12-31, timestamps to
//! 294276, `time` holds 24:00:00, and `±infinity` travels as the `i32`/`i64` extremes. A
//! client that honours Avro's `date` / `time-micros` / `timestamp-micros` logical types
//! turns the integer into its language's date type and fails on those values (Python's
//! fastavro, as used by confluent-kafka's `AvroDeserializer`, raises on anything past year
//! 9999 or on 24:00:00). So these columns carry no `logicalType`: every Avro client reads a
//! plain `int` / `long`, and the schema names the meaning the way Debezium does, with
//! `"connect.name"` (and `"connect.version": 1`):
//!
//! | PostgreSQL | Avro | `connect.name` |
//! | --- | --- | --- |
//! | `date` | `int`, days since 1970-01-01 | `io.debezium.time.Date` |
//! | `time` | `long`, µs since midnight | `io.debezium.time.MicroTime` |
//! | `timestamp` | `long`, µs since 1970-01-01 (no zone) | `io.debezium.time.MicroTimestamp` |
//! | `timestamptz` | `long`, µs since 1970-01-01 UTC | [`MICRO_TIMESTAMP_UTC`] |
//!
//! Debezium sends `timestamptz` as an ISO-8601 string (`io.debezium.time.ZonedTimestamp`);
//! wal2delta keeps the exact integer, so it uses a name of its own rather than give a
//! Debezium name to a different representation.
//!
//! **In the lake: the logical types back.** apache-avro drops custom properties of
//! primitive schemas when it parses, so the Arrow mapping cannot see `connect.name`. Every
//! schema the lake reads events with is therefore first passed through
//! [`with_logical_types`], which adds the logical type each semantic name stands for. A
//! logical type does not change the binary encoding, so the same bytes decode to the same
//! numbers, now as `Value::Date` / `TimeMicros` / `LocalTimestampMicros` /
//! `TimestampMicros`: exactly what events written before this encoding (whose registered
//! schemas carry the logical types themselves) decode to. Bronze thus has one path for old
//! and new events and produces the same Arrow types for both (`Date32`, `Int64`,
//! `Timestamp(µs)`, `Timestamp(µs, UTC)`), so its schema-evolution-by-merge sees no change.

use serde_json::{json, Value as Json};

/// `connect.name` of a `date`: days since 1970-01-01 in an `int` (Debezium's name).
pub const DATE: &str = "io.debezium.time.Date";
/// `connect.name` of a `time`: microseconds since midnight in a `long` (Debezium's name).
pub const MICRO_TIME: &str = "io.debezium.time.MicroTime";
/// `connect.name` of a `timestamp`: microseconds since 1970-01-01 00:00, no time zone, in a
/// `long` (Debezium's name).
pub const MICRO_TIMESTAMP: &str = "io.debezium.time.MicroTimestamp";
/// `connect.name` of a `timestamptz`: microseconds since 1970-01-01 00:00 UTC in a `long`.
/// wal2delta's own name: Debezium has none for an instant as an integer.
pub const MICRO_TIMESTAMP_UTC: &str = "wal2delta.time.MicroTimestampUtc";

/// (semantic name, Avro primitive, logical type the lake reads it with).
const NAMES: [(&str, &str, &str); 4] = [
    (DATE, "int", "date"),
    (MICRO_TIME, "long", "time-micros"),
    (MICRO_TIMESTAMP, "long", "local-timestamp-micros"),
    (MICRO_TIMESTAMP_UTC, "long", "timestamp-micros"),
];

/// The schema of a temporal column named `name` (one of the constants above).
///
/// # Panics
/// Never for the four constants of this module; any other name is a programming error.
pub fn schema(name: &str) -> Json {
    let (_, primitive, _) = NAMES
        .iter()
        .find(|(n, _, _)| *n == name)
        .expect("a temporal semantic name of this module");
    json!({"type": primitive, "connect.name": name, "connect.version": 1})
}

/// `schema` with the Avro logical type added to every primitive whose `connect.name` is one
/// of the temporal names above (and whose type matches it), everywhere in the schema: the
/// schema the lake decodes events with (see the module doc). Anything else, including a
/// schema that already carries logical types, is returned unchanged.
pub fn with_logical_types(schema: &Json) -> Json {
    match schema {
        Json::Object(obj) => {
            let mut out = serde_json::Map::with_capacity(obj.len() + 1);
            for (k, v) in obj {
                out.insert(k.clone(), with_logical_types(v));
            }
            let named = obj.get("connect.name").and_then(Json::as_str);
            let ty = obj.get("type").and_then(Json::as_str);
            if let (Some(named), Some(ty), None) = (named, ty, obj.get("logicalType")) {
                if let Some((_, _, logical)) =
                    NAMES.iter().find(|(n, p, _)| *n == named && *p == ty)
                {
                    out.insert("logicalType".into(), json!(logical));
                }
            }
            Json::Object(out)
        }
        Json::Array(items) => Json::Array(items.iter().map(with_logical_types).collect()),
        other => other.clone(),
    }
}

/// [`with_logical_types`] of a schema's text; `None` when the text names no temporal
/// semantic type (nothing to add) or is not JSON (the caller's parser reports that).
pub fn with_logical_types_text(text: &str) -> Option<String> {
    if !NAMES.iter().any(|(n, _, _)| text.contains(n)) {
        return None;
    }
    let json: Json = serde_json::from_str(text).ok()?;
    Some(with_logical_types(&json).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::Schema;

    #[test]
    fn names_become_logical_types_in_every_position() {
        let plain = json!({"type": "record", "name": "R", "fields": [
            {"name": "d", "type": ["null", schema(DATE)]},
            {"name": "ds", "type": {"type": "array", "items": ["null", schema(DATE)]}},
            {"name": "t", "type": schema(MICRO_TIME)},
            {"name": "ts", "type": schema(MICRO_TIMESTAMP)},
            {"name": "tz", "type": schema(MICRO_TIMESTAMP_UTC)},
            {"name": "n", "type": {"type": "long", "pg.type": "bigint"}},
        ]});
        let lake = Schema::parse(&with_logical_types(&plain)).unwrap();
        let Schema::Record(r) = lake else { panic!() };
        let kinds: Vec<String> = r
            .fields
            .iter()
            .map(|f| format!("{:?}", apache_avro::schema::SchemaKind::from(&f.schema)))
            .collect();
        assert_eq!(
            kinds,
            [
                "Union",
                "Array",
                "TimeMicros",
                "LocalTimestampMicros",
                "TimestampMicros",
                "Long"
            ]
        );
        let Schema::Union(u) = &r.fields[0].schema else {
            panic!()
        };
        assert_eq!(u.variants()[1], Schema::Date);
        let Schema::Array(a) = &r.fields[1].schema else {
            panic!()
        };
        let Schema::Union(u) = a.items.as_ref() else {
            panic!()
        };
        assert_eq!(u.variants()[1], Schema::Date);
        // The wire schema itself has no logical type at all.
        assert_eq!(Schema::parse(&schema(DATE)).unwrap(), Schema::Int);
        assert_eq!(
            Schema::parse(&schema(MICRO_TIMESTAMP_UTC)).unwrap(),
            Schema::Long
        );
    }

    #[test]
    fn other_schemas_are_left_alone() {
        let old = json!({"type": "int", "logicalType": "date", "pg.type": "date"});
        assert_eq!(with_logical_types(&old), old);
        // A name on the wrong primitive is not ours: no logical type is invented.
        let odd = json!({"type": "string", "connect.name": DATE});
        assert_eq!(with_logical_types(&odd), odd);
        assert_eq!(with_logical_types_text(r#"{"type":"long"}"#), None);
        let text = schema(MICRO_TIME).to_string();
        assert_eq!(
            Schema::parse_str(&with_logical_types_text(&text).unwrap()).unwrap(),
            Schema::TimeMicros
        );
    }
}
