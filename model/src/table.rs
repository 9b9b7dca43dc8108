//! Qualified table names.

use std::fmt;

/// A schema-qualified PostgreSQL table name, as captured.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl TableName {
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> Self {
        TableName {
            schema: schema.into(),
            name: name.into(),
        }
    }

    /// The SQL spelling with both parts quoted, safe to splice into a statement.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// Quotes an SQL identifier the way PostgreSQL's `quote_ident` does for every input.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_embedded_quotes() {
        assert_eq!(
            TableName::new("public", "we\"ird").quoted(),
            "\"public\".\"we\"\"ird\""
        );
    }
}
