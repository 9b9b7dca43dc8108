//! Qualified table names.

use std::fmt;

use crate::names::{ident_part, name_of_ident_part};

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

    /// The table's identity outside PostgreSQL, `(schema, table)` escaped one-to-one
    /// ([`crate::names::ident_part`]): the parts of its topic name and registry subjects,
    /// its lake path segments, and its spelling in END records.
    pub fn ident_parts(&self) -> (String, String) {
        (ident_part(&self.schema), ident_part(&self.name))
    }

    /// [`TableName::ident_parts`] joined by `.` (a `.` inside a part is escaped, so the
    /// join is still one-to-one).
    pub fn ident(&self) -> String {
        let (s, t) = self.ident_parts();
        format!("{s}.{t}")
    }

    /// The table an identity `schema.table` stands for; `None` when a part was shortened
    /// (its name cannot be read back) or the string is no identity.
    pub fn from_ident(ident: &str) -> Option<TableName> {
        let (s, t) = ident.split_once('.')?;
        Some(TableName::new(
            name_of_ident_part(s)?,
            name_of_ident_part(t)?,
        ))
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

    #[test]
    fn identities_read_back() {
        let t = TableName::new("public", "Order Items");
        assert_eq!(t.ident(), "public.-4frder-20-49tems");
        assert_eq!(TableName::from_ident(&t.ident()), Some(t));
        let dotted = TableName::new("a.b", "c");
        assert_eq!(TableName::from_ident(&dotted.ident()), Some(dotted));
        assert_eq!(TableName::from_ident("public.Orders"), None);
    }
}
