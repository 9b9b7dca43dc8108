//! Parsing submitted Avro schemas and deciding when two submissions are the same schema.

use std::panic::{catch_unwind, AssertUnwindSafe};

use apache_avro::Schema;
use serde_json::{Map, Value};

/// A submitted schema that parsed as Avro.
#[derive(Debug, Clone)]
pub struct ParsedSchema {
    /// The text as the client sent it; this is what the registry hands back.
    pub text: String,
    pub schema: Schema,
    pub identity: SchemaIdentity,
}

/// What makes two schemas "the same schema" for registration and lookup.
///
/// The primary key is apache-avro's Parsing Canonical Form, so whitespace, attribute order and
/// unqualified names do not matter. The canonical form also strips `default`, `doc`,
/// `aliases`, `logicalType` and custom properties, which change how a consumer reads the data
/// (a field default is what a reader fills in). So the identity also keeps the parsed
/// schema's full form (apache-avro's own serialization, keys sorted): two schemas that differ
/// only there get different ids, as they would in Confluent's registry, instead of silently
/// sharing the first one's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaIdentity {
    canonical: String,
    full: String,
}

impl SchemaIdentity {
    /// The Parsing Canonical Form.
    pub fn canonical(&self) -> &str {
        &self.canonical
    }
}

/// Why a submitted schema was refused; the text is the parser's reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSchema(pub String);

/// Parses `text` as an Avro schema and computes its identity.
pub fn parse(text: &str) -> Result<ParsedSchema, InvalidSchema> {
    let schema = Schema::parse_str(text).map_err(|e| InvalidSchema(e.to_string()))?;
    let identity = identity_of(&schema)?;
    Ok(ParsedSchema {
        text: text.to_owned(),
        schema,
        identity,
    })
}

fn identity_of(schema: &Schema) -> Result<SchemaIdentity, InvalidSchema> {
    let full = serde_json::to_value(schema)
        .map_err(|e| InvalidSchema(format!("cannot serialize the parsed schema: {e}")))?;
    // apache-avro's canonical_form panics on schemas it cannot serialize; the serialization
    // above has just succeeded, and the guard keeps a library bug from taking a request down.
    let canonical = catch_unwind(AssertUnwindSafe(|| schema.canonical_form()))
        .map_err(|_| InvalidSchema("cannot compute the canonical form".to_owned()))?;
    Ok(SchemaIdentity {
        canonical,
        full: sorted(&full).to_string(),
    })
}

/// The same JSON with every object's keys in sorted order.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for key in keys {
                if let Some(v) = map.get(key) {
                    out.insert(key.clone(), sorted(v));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: &str =
        r#"{"type":"record","name":"User","namespace":"t","fields":[{"name":"id","type":"long"}]}"#;

    #[test]
    fn formatting_and_key_order_do_not_change_identity() {
        let a = parse(USER).unwrap();
        let b = parse(
            r#"{ "fields": [ {"type": "long", "name": "id"} ],
                 "name": "User", "namespace": "t", "type": "record" }"#,
        )
        .unwrap();
        assert_eq!(a.identity, b.identity);
        assert_eq!(
            a.identity.canonical(),
            r#"{"name":"t.User","type":"record","fields":[{"name":"id","type":"long"}]}"#
        );
    }

    #[test]
    fn default_changes_identity_though_canonical_form_is_equal() {
        let field = |extra: &str| {
            parse(&format!(
                r#"{{"type":"record","name":"User","namespace":"t","fields":[
                    {{"name":"id","type":"long"}},{{"name":"n","type":"int"{extra}}}]}}"#
            ))
            .unwrap()
        };
        let none = field("");
        let zero = field(r#","default":0"#);
        let one = field(r#","default":1"#);
        assert_eq!(none.identity.canonical(), zero.identity.canonical());
        assert_eq!(zero.identity.canonical(), one.identity.canonical());
        assert_ne!(none.identity, zero.identity);
        assert_ne!(zero.identity, one.identity);
        assert_eq!(zero.identity, field(r#", "default": 0"#).identity);
    }

    #[test]
    fn unparseable_schema_reports_the_parsers_reason() {
        let err = parse(r#"{"type":"record","name":"X","fields":[{"name":"a","type":"nope"}]}"#)
            .unwrap_err();
        assert!(err.0.contains("nope"), "{err}");
        assert!(parse("not json").is_err());
    }
}
