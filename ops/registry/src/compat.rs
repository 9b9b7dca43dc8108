//! Compatibility levels and the checks behind them.
//!
//! BACKWARD: the new schema (reader) can read data written with an earlier schema (writer).
//! FORWARD: data written with the new schema can be read with an earlier schema.
//! FULL: both. The `_TRANSITIVE` levels check every live version, the others only the latest.

use std::error::Error as _;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;

use apache_avro::schema_compatibility::{self, SchemaCompatibility};
use apache_avro::Schema;
use serde::{Deserialize, Serialize};

/// A subject's (or the registry's) compatibility level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Compatibility {
    None,
    #[default]
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
}

impl Compatibility {
    pub const NAMES: [&'static str; 7] = [
        "NONE",
        "BACKWARD",
        "BACKWARD_TRANSITIVE",
        "FORWARD",
        "FORWARD_TRANSITIVE",
        "FULL",
        "FULL_TRANSITIVE",
    ];
    const ALL: [Compatibility; 7] = [
        Compatibility::None,
        Compatibility::Backward,
        Compatibility::BackwardTransitive,
        Compatibility::Forward,
        Compatibility::ForwardTransitive,
        Compatibility::Full,
        Compatibility::FullTransitive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Compatibility::None => "NONE",
            Compatibility::Backward => "BACKWARD",
            Compatibility::BackwardTransitive => "BACKWARD_TRANSITIVE",
            Compatibility::Forward => "FORWARD",
            Compatibility::ForwardTransitive => "FORWARD_TRANSITIVE",
            Compatibility::Full => "FULL",
            Compatibility::FullTransitive => "FULL_TRANSITIVE",
        }
    }

    /// Whether every live version is checked rather than only the latest.
    pub fn is_transitive(self) -> bool {
        matches!(
            self,
            Compatibility::BackwardTransitive
                | Compatibility::ForwardTransitive
                | Compatibility::FullTransitive
        )
    }

    fn checks_backward(self) -> bool {
        matches!(
            self,
            Compatibility::Backward
                | Compatibility::BackwardTransitive
                | Compatibility::Full
                | Compatibility::FullTransitive
        )
    }

    fn checks_forward(self) -> bool {
        matches!(
            self,
            Compatibility::Forward
                | Compatibility::ForwardTransitive
                | Compatibility::Full
                | Compatibility::FullTransitive
        )
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The text is not a known level.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown compatibility level '{0}'")]
pub struct UnknownCompatibility(pub String);

impl FromStr for Compatibility {
    type Err = UnknownCompatibility;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Compatibility::ALL
            .into_iter()
            .find(|level| level.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownCompatibility(s.to_owned()))
    }
}

/// One earlier version to check a new schema against.
pub struct Earlier<'a> {
    pub version: u32,
    pub schema: &'a Schema,
}

/// Checks `new` against the subject's live versions (oldest first) as `level` demands:
/// the latest one, or all of them for a transitive level. Returns one message per violation;
/// empty means compatible.
pub fn check_against_history(
    level: Compatibility,
    new: &Schema,
    history: &[Earlier],
) -> Vec<String> {
    let targets = if level.is_transitive() {
        history
    } else {
        history.last().map(std::slice::from_ref).unwrap_or_default()
    };
    targets
        .iter()
        .flat_map(|earlier| check_against(level, new, earlier))
        .collect()
}

/// Checks `new` against one earlier version in the direction(s) `level` demands.
pub fn check_against(level: Compatibility, new: &Schema, earlier: &Earlier) -> Vec<String> {
    let mut messages = Vec::new();
    if level.checks_backward() {
        if let Err(reason) = can_read(earlier.schema, new) {
            messages.push(format!(
                "{level}: the new schema cannot read data written with version {}: {reason}",
                earlier.version
            ));
        }
    }
    if level.checks_forward() {
        if let Err(reason) = can_read(new, earlier.schema) {
            messages.push(format!(
                "{level}: version {} cannot read data written with the new schema: {reason}",
                earlier.version
            ));
        }
    }
    messages
}

/// Whether all data written with `writer` can be read with `reader`; the error is the
/// reason, with the checker's nested causes. apache-avro's "partial" answer (only some values
/// resolve: an enum symbol or a union branch is missing on the reader's side) counts as
/// incompatible, as it does for Confluent.
fn can_read(writer: &Schema, reader: &Schema) -> Result<(), String> {
    let (writer, reader) = (without_decimals(writer), without_decimals(reader));
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        SchemaCompatibility::can_read(&writer, &reader)
    }))
    .map_err(|_| "the compatibility checker failed on these schemas".to_owned())?;
    match outcome {
        Ok(schema_compatibility::Compatibility::Full) => Ok(()),
        Ok(schema_compatibility::Compatibility::Partial) => Err(
            "only some values can be read: an enum symbol or a union branch of the writer \
             is missing from the reader"
                .to_owned(),
        ),
        Err(err) => {
            let mut reason = err.to_string();
            let mut source = err.source();
            while let Some(cause) = source {
                reason.push_str(": ");
                reason.push_str(&cause.to_string());
                source = cause.source();
            }
            Err(reason)
        }
    }
}

/// `schema` with each `decimal` logical type replaced by its `bytes` or `fixed`: Confluent's
/// checker (Avro's Java `SchemaCompatibility`) compares the underlying types only, so a
/// decimal whose precision or scale grew (`numeric(10,2)` → `numeric(14,4)`) is
/// compatible, while apache-avro's checker would refuse it. Unchanged when the result
/// does not parse.
fn without_decimals(schema: &Schema) -> Schema {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                if m.get("logicalType").and_then(|t| t.as_str()) == Some("decimal") {
                    m.remove("logicalType");
                    m.remove("precision");
                    m.remove("scale");
                }
                m.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let Ok(mut json) = serde_json::to_value(schema) else {
        return schema.clone();
    };
    strip(&mut json);
    Schema::parse(&json).unwrap_or_else(|_| schema.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: &str) -> Schema {
        Schema::parse_str(&format!(
            r#"{{"type":"record","name":"R","fields":[{fields}]}}"#
        ))
        .unwrap()
    }

    #[test]
    fn levels_parse_case_insensitively_and_round_trip() {
        for name in Compatibility::NAMES {
            let level: Compatibility = name.parse().unwrap();
            assert_eq!(level.name(), name);
            assert_eq!(name.to_lowercase().parse::<Compatibility>().unwrap(), level);
        }
        assert!("SIDEWAYS".parse::<Compatibility>().is_err());
    }

    #[test]
    fn added_field_without_default_breaks_backward_but_not_forward() {
        let v1 = schema(r#"{"name":"a","type":"int"}"#);
        let v2 = schema(r#"{"name":"a","type":"int"},{"name":"b","type":"string"}"#);
        let earlier = [Earlier {
            version: 1,
            schema: &v1,
        }];
        let backward = check_against_history(Compatibility::Backward, &v2, &earlier);
        assert_eq!(backward.len(), 1);
        assert!(backward[0].contains("'b'"), "{backward:?}");
        assert!(backward[0].contains("default"), "{backward:?}");
        assert!(check_against_history(Compatibility::Forward, &v2, &earlier).is_empty());
        assert_eq!(
            check_against_history(Compatibility::Full, &v2, &earlier).len(),
            1
        );
        assert!(check_against_history(Compatibility::None, &v2, &earlier).is_empty());
    }

    #[test]
    fn transitive_levels_check_every_version_others_only_the_latest() {
        let v1 = schema(r#"{"name":"a","type":"int"}"#);
        let v2 = schema(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#);
        let history = [
            Earlier {
                version: 1,
                schema: &v1,
            },
            Earlier {
                version: 2,
                schema: &v2,
            },
        ];
        // Reads v2's data, but not v1's: v1 has no `b` and the reader gives it no default.
        let reader = schema(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#);
        assert!(check_against_history(Compatibility::Backward, &reader, &history).is_empty());
        let transitive =
            check_against_history(Compatibility::BackwardTransitive, &reader, &history);
        assert_eq!(transitive.len(), 1);
        assert!(transitive[0].contains("version 1"), "{transitive:?}");
    }

    #[test]
    fn a_missing_enum_symbol_is_incompatible() {
        let enum_of = |symbols: &str| {
            schema(&format!(
                r#"{{"name":"e","type":{{"type":"enum","name":"E","symbols":[{symbols}]}}}}"#
            ))
        };
        let v1 = enum_of(r#""A","B""#);
        let fewer = enum_of(r#""A""#);
        let earlier = [Earlier {
            version: 1,
            schema: &v1,
        }];
        let messages = check_against_history(Compatibility::Backward, &fewer, &earlier);
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].contains("enum symbol"), "{messages:?}");
        assert!(check_against_history(Compatibility::Forward, &fewer, &earlier).is_empty());
    }

    #[test]
    fn type_change_reports_the_nested_reason() {
        let v1 = schema(r#"{"name":"a","type":"string"}"#);
        let v2 = schema(r#"{"name":"a","type":"int"}"#);
        let earlier = [Earlier {
            version: 1,
            schema: &v1,
        }];
        let messages = check_against_history(Compatibility::Backward, &v2, &earlier);
        assert_eq!(messages.len(), 1);
        assert!(messages[0].contains("'a'"), "{messages:?}");
    }
    /// wal2delta's temporal columns dropped their Avro logical types for a plain `int` /
    /// `long` with a `connect.name` (`docs/types.md`): the new version of a table's subject
    /// must be accepted. As in Confluent's checker (Avro's `SchemaCompatibility`, which
    /// compares the primitive types only), logical types do not matter, in either
    /// direction, so FULL accepts the change too.
    #[test]
    fn dropping_temporal_logical_types_is_compatible_both_ways() {
        let old = schema(
            r#"{"name":"d","type":["null",{"type":"int","logicalType":"date","pg.type":"date"}],"default":null},
               {"name":"t","type":["null",{"type":"long","logicalType":"time-micros"}],"default":null},
               {"name":"ts","type":["null",{"type":"long","logicalType":"local-timestamp-micros"}],"default":null},
               {"name":"tz","type":["null",{"type":"long","logicalType":"timestamp-micros"}],"default":null},
               {"name":"ds","type":{"type":"array","items":["null",{"type":"int","logicalType":"date"}]}}"#,
        );
        let new = schema(
            r#"{"name":"d","type":["null",{"type":"int","connect.name":"io.debezium.time.Date","connect.version":1,"pg.type":"date"}],"default":null},
               {"name":"t","type":["null",{"type":"long","connect.name":"io.debezium.time.MicroTime","connect.version":1}],"default":null},
               {"name":"ts","type":["null",{"type":"long","connect.name":"io.debezium.time.MicroTimestamp","connect.version":1}],"default":null},
               {"name":"tz","type":["null",{"type":"long","connect.name":"wal2delta.time.MicroTimestampUtc","connect.version":1}],"default":null},
               {"name":"ds","type":{"type":"array","items":["null",{"type":"int","connect.name":"io.debezium.time.Date","connect.version":1}]}}"#,
        );
        let earlier = [Earlier {
            version: 1,
            schema: &old,
        }];
        for level in [Compatibility::Backward, Compatibility::Full] {
            let messages = check_against_history(level, &new, &earlier);
            assert!(messages.is_empty(), "{level}: {messages:?}");
        }
    }

    /// A bounded numeric whose precision or scale grew: its decimal's parameters change,
    /// the bytes do not. Confluent's checker accepts it; so does this registry.
    #[test]
    fn a_decimal_whose_precision_or_scale_grew_is_compatible_both_ways() {
        let dec = |p: u32, s: u32| {
            schema(&format!(
                r#"{{"name":"amount","type":["null",{{"type":"bytes","logicalType":"decimal","precision":{p},"scale":{s}}}],"default":null}}"#
            ))
        };
        let (old, new) = (dec(10, 2), dec(14, 4));
        let earlier = [Earlier {
            version: 1,
            schema: &old,
        }];
        for level in [Compatibility::Backward, Compatibility::Full] {
            let messages = check_against_history(level, &new, &earlier);
            assert!(messages.is_empty(), "{level}: {messages:?}");
        }
        // The underlying type still counts.
        let text = schema(r#"{"name":"amount","type":["null","int"],"default":null}"#);
        assert!(!check_against_history(Compatibility::Backward, &text, &earlier).is_empty());
    }
}
