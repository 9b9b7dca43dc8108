//! Tables created after `setup`: capture adds those matching `[source] tables` (and not
//! `[source] exclude_tables`) to the publication while it runs (docs/capture.md, "Tables
//! created later").
//!
//! Why adding is enough for nothing to be lost: pgoutput decides per change, with the
//! catalog as of that change's commit, whether the table is published, so every change
//! committed after the `ALTER PUBLICATION ... ADD TABLE` is streamed. The rows committed
//! before it (the creating transaction's among them) are read by the snapshot task, which
//! snapshots a newly published table in chunks whose snapshots are taken after the add;
//! Silver orders the two by position, as for any table added later.

use std::collections::BTreeSet;

use tokio_postgres::Client;
use wal2delta_model::table::quote_ident;
use wal2delta_model::TableName;

use super::{identity_misses_key, resolve_tables};
use crate::CdcError;

/// What one look at the catalog did.
#[derive(Debug, Default)]
pub struct Followed {
    /// Tables added to the publication.
    pub added: Vec<TableName>,
    /// Tables that match but could not be added, with the reason and the fix.
    pub refused: Vec<(TableName, String)>,
}

/// Adds every table matching `patterns` but not `exclude` that `publication` lacks. One
/// statement per table, so a table the role may not add (another owner) keeps none of
/// the others out. Errors only when the catalog cannot be read.
pub async fn add_new_tables(
    client: &Client,
    publication: &str,
    patterns: &[String],
    exclude: &[String],
) -> Result<Followed, CdcError> {
    let published: BTreeSet<TableName> = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1",
            &[&publication],
        )
        .await?
        .iter()
        .map(|r| TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect();
    let mut out = Followed::default();
    for t in resolve_tables(client, patterns, exclude).await? {
        if published.contains(&t.name) {
            continue;
        }
        if let Some(index) = &t.identity_index_without_key {
            out.refused
                .push((t.name.clone(), identity_misses_key(&t.name, index)));
            continue;
        }
        // Published without a replica identity, the table would refuse its own UPDATEs
        // and DELETEs ("cannot update table ... because it does not have a replica
        // identity"): the application's writes would break. Left out until it has one.
        if t.replica_identity == 'n' || (t.replica_identity == 'd' && !t.has_primary_key) {
            out.refused.push((
                t.name.clone(),
                format!(
                    "it has no primary key or replica identity, and published as it is its UPDATEs and DELETEs would fail at the source; add a primary key, or run ALTER TABLE {} REPLICA IDENTITY FULL, and capture adds it at its next look",
                    t.name.quoted()
                ),
            ));
            continue;
        }
        let sql = format!(
            "ALTER PUBLICATION {} ADD TABLE {}",
            quote_ident(publication),
            t.name.quoted()
        );
        match client.batch_execute(&sql).await {
            Ok(()) => out.added.push(t.name),
            Err(e) => {
                let reason = match e.as_db_error() {
                    // 42501: not the table's owner (or not the publication's).
                    Some(db) if db.code().code() == "42501" => format!(
                        "{}: the capture role may not add it; as the table's owner run {sql}, or `wal2delta setup` as a role that owns it",
                        db.message()
                    ),
                    // 42P01 (dropped meanwhile) and the like: looked at again next time.
                    Some(db) => format!("{}: {sql} failed; it is tried again", db.message()),
                    None => format!("{e}: {sql} failed; it is tried again"),
                };
                out.refused.push((t.name, reason));
            }
        }
    }
    Ok(out)
}
