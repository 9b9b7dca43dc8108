//! Resolving type OIDs into [`ColumnType`]s from the source's catalog, and the published
//! tables' column names.
//!
//! Only `pg_type`, `pg_enum` and `pg_range` are read, never product tables. Results are
//! cached per OID; a `Type` message from pgoutput (sent when a user type is first used
//! or changed) drops the cached entry so an altered enum is re-read.
//!
//! The catalog is read on an ordinary connection, which sees only committed types. A type
//! created by the transaction being decoded may not be visible yet: the walsender can
//! send a commit a moment before the committing backend makes it visible to other
//! sessions. Such an OID is looked up again a few times, and when it stays missing (a type
//! dropped since) the column is decoded as text for now, but that answer is never cached,
//! so the next Relation message resolves it afresh.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio_postgres::Client;
use wal2delta_model::{BaseType, ColumnType, TableName, TypeKind};

use crate::CdcError;

/// Nesting deeper than this (domain of array of domain ...) is treated as text.
const MAX_DEPTH: usize = 8;
/// Pauses before looking up again a type `pg_type` does not (yet) show.
const MISSING_RETRIES: [Duration; 3] = [
    Duration::from_millis(20),
    Duration::from_millis(100),
    Duration::from_millis(400),
];

#[derive(Default)]
pub struct TypeCatalog {
    cache: HashMap<u32, ColumnType>,
}

struct TypeRow {
    typtype: String,
    category: String,
    name: String,
    elem: u32,
    base: u32,
    labels: Option<Vec<String>>,
    range_subtype: Option<u32>,
}

impl TypeCatalog {
    pub fn invalidate(&mut self, oid: u32) {
        self.cache.remove(&oid);
    }

    /// The column type for an OID and typmod (the typmod is per column, not cached).
    pub async fn resolve(
        &mut self,
        client: &Client,
        oid: u32,
        typmod: i32,
    ) -> Result<ColumnType, CdcError> {
        let mut ty = match self.cache.get(&oid) {
            Some(t) => t.clone(),
            None => {
                let mut missing = false;
                let mut t = Box::pin(self.lookup(client, oid, 0, &mut missing)).await?;
                for pause in MISSING_RETRIES {
                    if !missing {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                    missing = false;
                    t = Box::pin(self.lookup(client, oid, 0, &mut missing)).await?;
                }
                if missing {
                    tracing::warn!(oid, type_name = %t.name, "a type of this column is not in pg_type (dropped since, or not yet visible): decoded as text until the next Relation message");
                } else {
                    self.cache.insert(oid, t.clone());
                }
                t
            }
        };
        set_typmod(&mut ty, typmod);
        Ok(ty)
    }

    async fn lookup(
        &mut self,
        client: &Client,
        oid: u32,
        depth: usize,
        missing: &mut bool,
    ) -> Result<ColumnType, CdcError> {
        let row = fetch(client, oid).await?;
        let Some(row) = row else {
            *missing = true;
            return Ok(ColumnType {
                oid,
                typmod: -1,
                name: format!("oid:{oid}"),
                kind: TypeKind::Other,
            });
        };
        let kind = if depth >= MAX_DEPTH {
            TypeKind::Other
        } else if let Some(base) = BaseType::from_oid(oid) {
            TypeKind::Base(base)
        } else {
            match &row.typtype[..] {
                "e" => TypeKind::Enum {
                    labels: row.labels.clone().unwrap_or_default(),
                },
                "d" => TypeKind::Domain {
                    base: Box::new(
                        Box::pin(self.lookup(client, row.base, depth + 1, missing)).await?,
                    ),
                },
                "r" => match row.range_subtype {
                    Some(sub) => TypeKind::Range {
                        subtype: Box::new(
                            Box::pin(self.lookup(client, sub, depth + 1, missing)).await?,
                        ),
                    },
                    None => TypeKind::Other,
                },
                "c" => TypeKind::Composite,
                "b" if row.category == "A" && row.elem != 0 => TypeKind::Array {
                    element: Box::new(
                        Box::pin(self.lookup(client, row.elem, depth + 1, missing)).await?,
                    ),
                },
                _ => TypeKind::Other,
            }
        };
        Ok(ColumnType {
            oid,
            typmod: -1,
            name: row.name,
            kind,
        })
    }
}

/// Names of the primary-key columns of a relation, empty when it has none.
pub async fn primary_key_columns(client: &Client, rel_id: u32) -> Result<Vec<String>, CdcError> {
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = $1 AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
            &[&rel_id],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The tables of `publication` with the names of their published columns in the order
/// the stream sends them (by `attnum`; dropped and generated columns left out, as
/// pgoutput does; a publication's column list respected). Only the catalog is read.
/// Used to check that the policies of the config name real tables and columns.
pub async fn published_columns(
    client: &Client,
    publication: &str,
) -> Result<BTreeMap<TableName, Vec<String>>, CdcError> {
    let rows = client
        .query(
            "SELECT pt.schemaname::text, pt.tablename::text, a.attname::text              FROM pg_publication_tables pt              JOIN pg_namespace n ON n.nspname = pt.schemaname              JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename              JOIN pg_attribute a ON a.attrelid = c.oid              WHERE pt.pubname = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''                AND a.attname = ANY(pt.attnames)              ORDER BY 1, 2, a.attnum",
            &[&publication],
        )
        .await?;
    let mut out: BTreeMap<TableName, Vec<String>> = BTreeMap::new();
    for r in rows {
        out.entry(TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)))
            .or_default()
            .push(r.get(2));
    }
    Ok(out)
}

fn set_typmod(ty: &mut ColumnType, typmod: i32) {
    ty.typmod = typmod;
    match &mut ty.kind {
        TypeKind::Array { element } => set_typmod(element, typmod),
        TypeKind::Domain { .. } => {}
        _ => {}
    }
}

async fn fetch(client: &Client, oid: u32) -> Result<Option<TypeRow>, CdcError> {
    let row = client
        .query_opt(
            "SELECT t.typtype::text, t.typcategory::text, \
                    CASE WHEN n.nspname = 'pg_catalog' THEN format_type(t.oid, NULL) \
                         ELSE quote_ident(n.nspname) || '.' || quote_ident(t.typname) END, \
                    t.typelem, t.typbasetype, \
                    (SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid), \
                    (SELECT r.rngsubtype FROM pg_range r WHERE r.rngtypid = t.oid) \
             FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = $1",
            &[&oid],
        )
        .await?;
    Ok(row.map(|r| TypeRow {
        typtype: r.get(0),
        category: r.get(1),
        name: r.get(2),
        elem: r.get(3),
        base: r.get(4),
        labels: r.get(5),
        range_subtype: r.get(6),
    }))
}
