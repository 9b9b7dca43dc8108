//! Topic and subject naming (DESIGN §3): `{prefix}.{schema}.{table}`, subjects by the
//! topic-name strategy (`{topic}-key`, `{topic}-value`).

use wal2delta_model::TableName;

/// The Kafka topic of a table. Characters Kafka does not allow in topic names become `_`.
pub fn table_topic(prefix: &str, table: &TableName) -> String {
    format!(
        "{}.{}.{}",
        prefix,
        sanitize(&table.schema),
        sanitize(&table.name)
    )
}

pub fn key_subject(topic: &str) -> String {
    format!("{topic}-key")
}

pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
}

fn sanitize(part: &str) -> String {
    part.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
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
            "cdc.My_Schema.a_b"
        );
    }
}
