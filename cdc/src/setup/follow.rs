//! Tables created after `setup`: capture adds those matching `[source] tables` (and not
//! `[source] exclude_tables`) to the publication while it runs, and removes the tables
//! that no longer match them (the patterns changed in the config), as `setup` would
//! (docs/capture.md, "Tables created later").
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
    /// Tables removed from the publication: they no longer match the patterns.
    pub removed: Vec<TableName>,
    /// Tables that no longer match but could not be removed, with the reason.
    pub not_removed: Vec<(TableName, String)>,
}

/// Adds every table matching `patterns` but not `exclude` that `publication` lacks, and
/// removes every table it holds that does not (so the publication holds what `setup`
/// would make it hold). One statement per table, so a table the role may not add or
/// remove (another owner) holds up none of the others. Errors only when the catalog
/// cannot be read.
pub async fn follow_tables(
    client: &Client,
    publication: &str,
    patterns: &[String],
    exclude: &[String],
) -> Result<Followed, CdcError> {
    // A publication FOR ALL TABLES (made by hand) publishes every table already and can
    // neither add nor drop one.
    let all_tables = client
        .query_opt(
            "SELECT puballtables FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await?
        .is_some_and(|r| r.get::<_, bool>(0));
    if all_tables {
        return Ok(Followed::default());
    }
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
    let wanted = resolve_tables(client, patterns, exclude).await?;
    let pubname = quote_ident(publication);
    // Patterns that match nothing leave the publication as it is, as `setup` does: an
    // empty publication is a mistake to report, not to make.
    for t in published
        .iter()
        .filter(|p| !wanted.is_empty() && !wanted.iter().any(|w| &w.name == *p))
    {
        // Its changes stop at the commit of this statement; its lake tables stay.
        let sql = format!("ALTER PUBLICATION {pubname} DROP TABLE {}", t.quoted());
        match client.batch_execute(&sql).await {
            Ok(()) => out.removed.push(t.clone()),
            Err(e) => out
                .not_removed
                .push((t.clone(), refusal(&e, &sql, "remove"))),
        }
    }
    for t in wanted {
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
        let sql = format!("ALTER PUBLICATION {pubname} ADD TABLE {}", t.name.quoted());
        match client.batch_execute(&sql).await {
            Ok(()) => out.added.push(t.name),
            Err(e) => out.refused.push((t.name, refusal(&e, &sql, "add"))),
        }
    }
    Ok(out)
}

/// Why `sql` (adding or removing a table, `what`) failed, with the fix.
fn refusal(e: &tokio_postgres::Error, sql: &str, what: &str) -> String {
    match e.as_db_error() {
        // 42501: not the table's owner (or not the publication's).
        Some(db) if db.code().code() == "42501" => format!(
            "{}: the capture role may not {what} it; as the table's owner run {sql}, or `wal2delta setup` as a role that owns it",
            db.message()
        ),
        // 42P01 (dropped meanwhile) and the like: looked at again next time.
        Some(db) => format!("{}: {sql} failed; it is tried again", db.message()),
        None => format!("{e}: {sql} failed; it is tried again"),
    }
}
