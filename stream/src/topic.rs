//! Topic and subject naming (docs/architecture.md, interfaces): `{prefix}.{schema}.{table}`, subjects by the
//! topic-name strategy (`{topic}-key`, `{topic}-value`).

use wal2delta_model::TableName;

/// The Kafka topic of a table: `{prefix}.{identity}`, the name escaped one-to-one
/// ([`wal2delta_model::names`]), so two tables never share a topic.
pub fn table_topic(prefix: &str, table: &TableName) -> String {
    format!("{prefix}.{}", table.ident())
}

/// The `(schema, table)` parts of a table topic `{prefix}.{schema}.{table}`, as they are
/// in the topic name (the table's identity, also its lake path); `None` for any other
/// topic (positions, snapshots, DLQ).
pub fn table_of_topic<'t>(prefix: &str, topic: &'t str) -> Option<(&'t str, &'t str)> {
    let rest = topic.strip_prefix(prefix)?.strip_prefix('.')?;
    let (schema, table) = rest.split_once('.')?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    (ok(schema) && ok(table)).then_some((schema, table))
}

/// The librdkafka subscription pattern matching every table topic of `prefix`.
pub fn table_topic_pattern(prefix: &str) -> String {
    let escaped: String = prefix
        .chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect();
    format!("^{escaped}\\.[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]+$")
}

pub fn key_subject(topic: &str) -> String {
    format!("{topic}-key")
}

pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_design() {
        let t = TableName::new("public", "transactions");
        assert_eq!(table_topic("cdc", &t), "cdc.public.transactions");
        assert_eq!(
            value_subject("cdc.public.transactions"),
            "cdc.public.transactions-value"
        );
        assert_eq!(
            table_topic("cdc", &TableName::new("My Schema", "a.b")),
            "cdc.-4dy-20-53chema.a-2eb"
        );
        assert_ne!(
            table_topic("cdc", &TableName::new("public", "a b")),
            table_topic("cdc", &TableName::new("public", "a_b"))
        );
        let t = table_topic("cdc", &TableName::new("public", "Order Items"));
        let (s, n) = table_of_topic("cdc", &t).unwrap();
        assert_eq!(
            TableName::from_ident(&format!("{s}.{n}")),
            Some(TableName::new("public", "Order Items"))
        );
    }

    #[test]
    fn table_topics_are_told_from_internal_topics() {
        assert_eq!(
            table_of_topic("cdc", "cdc.public.transactions"),
            Some(("public", "transactions"))
        );
        assert_eq!(table_of_topic("cdc", "cdc.positions"), None);
        assert_eq!(table_of_topic("cdc", "cdcx.public.t"), None);
        assert_eq!(table_of_topic("my.cdc", "my.cdc.s.t"), Some(("s", "t")));
        assert_eq!(table_of_topic("cdc", "cdc.a.b.c"), None);
        assert_eq!(
            table_topic_pattern("my.cdc"),
            "^my\\.cdc\\.[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]+$"
        );
    }
}
