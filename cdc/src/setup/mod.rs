//! `wal2delta setup`: prerequisite checks and idempotent creation of the publication and
//! the slot. Every action is reported so the operator knows what changed.

use tokio_postgres::Client;
use wal2delta_model::table::quote_ident;
use wal2delta_model::TableName;

use crate::CdcError;

mod follow;
mod privileges;

pub use follow::{follow_tables, Followed};

/// What setup found and did.
#[derive(Debug, Default)]
pub struct SetupReport {
    /// Objects created or altered.
    pub changed: Vec<String>,
    /// Things that work but should be changed.
    pub warnings: Vec<String>,
    /// Settings we recommend.
    pub recommendations: Vec<String>,
    /// Things the operator should know.
    pub notes: Vec<String>,
    /// Tables the publication covers.
    pub tables: Vec<TableName>,
}

/// A table matched by the configured patterns.
#[derive(Debug, Clone)]
pub struct CapturedTable {
    pub name: TableName,
    pub has_primary_key: bool,
    /// `d` default, `f` full, `i` index, `n` nothing.
    pub replica_identity: char,
    /// Under `REPLICA IDENTITY USING INDEX`: the index, when it does not cover every
    /// primary-key column (see [`identity_misses_key`]).
    pub identity_index_without_key: Option<String>,
}

/// The refusal for a table whose replica identity is an index that leaves out primary-key
/// columns.
///
/// Why refused: the Kafka key is the primary key, but PostgreSQL logs only the identity
/// index's columns as the old row. A DELETE then carries no primary key (capture cannot
/// say which row went), and an UPDATE that changes only the primary key carries no old
/// row at all, so the old key would stay in every key-based consumer for good.
pub fn identity_misses_key(table: &TableName, index: &str) -> String {
    format!(
        "table {table} has REPLICA IDENTITY USING INDEX {index}, which does not contain its primary key: \
         PostgreSQL then logs only the index's columns for deleted and updated rows, so deletes and primary-key changes \
         cannot be applied by key. Run ALTER TABLE {} REPLICA IDENTITY DEFAULT (logs the primary key) or REPLICA IDENTITY FULL \
         (logs the whole old row), or leave the table out of source.tables",
        table.quoted()
    )
}

/// Settings `setup` needs.
pub struct SetupOptions<'a> {
    pub slot: &'a str,
    pub publication: &'a str,
    pub table_patterns: &'a [String],
    /// `schema.table` patterns left out even when `table_patterns` match them.
    pub exclude_patterns: &'a [String],
    /// Create the slot here. False when capture creates it itself, together with the
    /// snapshot it exports for the initial snapshot.
    pub create_slot: bool,
    /// A failover slot (PostgreSQL 17's `FAILOVER`): standbys with `sync_replication_slots`
    /// keep a copy, so capture continues on the promoted standby after a failover.
    pub failover: bool,
}

/// Runs every check, then creates or updates the publication and creates the slot.
pub async fn run(client: &Client, opts: &SetupOptions<'_>) -> Result<SetupReport, CdcError> {
    let mut report = SetupReport::default();
    check_prerequisites(client, &mut report).await?;

    let tables = resolve_tables(client, opts.table_patterns, opts.exclude_patterns).await?;
    if tables.is_empty() {
        report.warnings.push(format!(
            "no table matches source.tables {:?} (less source.exclude_tables {:?}); the publication is created empty",
            opts.table_patterns, opts.exclude_patterns
        ));
    }
    let misses: Vec<String> = tables
        .iter()
        .filter_map(|t| {
            t.identity_index_without_key
                .as_deref()
                .map(|i| identity_misses_key(&t.name, i))
        })
        .collect();
    if !misses.is_empty() {
        return Err(CdcError::Check(misses.join("\n")));
    }
    for t in &tables {
        if !t.has_primary_key && t.replica_identity != 'f' {
            report.warnings.push(format!(
                "table {} has no primary key: UPDATE and DELETE on it will fail while it is published \
                 (add a primary key, or ALTER TABLE {} REPLICA IDENTITY FULL)",
                t.name,
                t.name.quoted()
            ));
        }
    }
    let change = publication_change(client, opts.publication, &tables).await?;
    // Every missing privilege at once, each with the statement that grants it, before
    // anything is changed.
    let problems = privileges::check(client, opts.publication, &tables, change.as_ref()).await?;
    if !problems.is_empty() {
        return Err(CdcError::Check(problems.join("\n")));
    }
    if let Some(change) = change {
        client.batch_execute(&change.sql).await?;
        report.changed.push(change.summary);
    }
    if opts.failover {
        failover_supported(client).await?;
    }
    if opts.create_slot {
        ensure_slot(client, opts.slot, opts.failover, &mut report).await?;
    } else if client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&opts.slot],
        )
        .await?
        .is_none()
    {
        report.notes.push(format!(
            "replication slot {} will be created by `wal2delta run`, which reads the initial snapshot in the snapshot the new slot exports",
            opts.slot
        ));
    }
    report.tables = tables.into_iter().map(|t| t.name).collect();
    Ok(report)
}

async fn check_prerequisites(client: &Client, report: &mut SetupReport) -> Result<(), CdcError> {
    let wal_level: String = client.query_one("SHOW wal_level", &[]).await?.get(0);
    if wal_level != "logical" {
        return Err(CdcError::Check(format!(
            "wal_level is {wal_level:?}, logical replication needs \"logical\": run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL"
        )));
    }
    let keep: i64 = client
        .query_one(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'",
            &[],
        )
        .await?
        .get(0);
    if keep < 0 {
        report.recommendations.push(
            "max_slot_wal_keep_size is unlimited (-1): a stalled slot can fill the primary's disk. \
             Set it to what the disk can spare, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();"
                .into(),
        );
    }
    let senders: i64 = client
        .query_one(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'max_wal_senders'",
            &[],
        )
        .await?
        .get(0);
    let slots: i64 = client
        .query_one(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'max_replication_slots'",
            &[],
        )
        .await?
        .get(0);
    if senders < 1 || slots < 1 {
        return Err(CdcError::Check(format!(
            "max_wal_senders ({senders}) and max_replication_slots ({slots}) must both be at least 1; raise them and restart PostgreSQL"
        )));
    }
    Ok(())
}

/// Turns `schema.table` patterns with `*` into SQL LIKE patterns.
fn like_pattern(part: &str) -> String {
    part.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
        .replace('*', "%")
}

/// Whether `name` matches `pattern`, a `schema.table` pattern where `*` matches any run
/// of characters (a pattern without a dot names a table of `public`), as `resolve_tables`
/// matches them.
pub fn matches_pattern(pattern: &str, name: &TableName) -> bool {
    let (schema, table) = pattern.split_once('.').unwrap_or(("public", pattern));
    glob(schema, &name.schema) && glob(table, &name.name)
}

/// `*` matches any run of characters, everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let [first, middle @ .., last] = parts.as_slice() else {
        return pattern == text;
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The ordinary and partitioned tables matching the patterns and none of `exclude`
/// (partitions themselves are published through their root).
pub async fn resolve_tables(
    client: &Client,
    patterns: &[String],
    exclude: &[String],
) -> Result<Vec<CapturedTable>, CdcError> {
    let mut out: Vec<CapturedTable> = Vec::new();
    for p in patterns {
        let (schema, table) = p.split_once('.').unwrap_or(("public", p));
        let rows = client
            .query(
                "SELECT n.nspname::text, c.relname::text, \
                        EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), \
                        c.relreplident::text, \
                        (SELECT i.indexrelid::regclass::text FROM pg_index i \
                          WHERE i.indrelid = c.oid AND i.indisreplident AND c.relreplident = 'i' \
                            AND EXISTS (SELECT 1 FROM pg_index p WHERE p.indrelid = c.oid AND p.indisprimary \
                                          AND NOT (p.indkey::int2[] <@ i.indkey::int2[]))) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
                   AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%' \
                   AND n.nspname LIKE $1 AND c.relname LIKE $2 \
                 ORDER BY 1, 2",
                &[&like_pattern(schema), &like_pattern(table)],
            )
            .await?;
        for r in rows {
            let name = TableName::new(r.get::<_, String>(0), r.get::<_, String>(1));
            if out.iter().any(|t| t.name == name)
                || exclude.iter().any(|x| matches_pattern(x, &name))
            {
                continue;
            }
            let ident: String = r.get(3);
            out.push(CapturedTable {
                name,
                has_primary_key: r.get(2),
                replica_identity: ident.chars().next().unwrap_or('d'),
                identity_index_without_key: r.get(4),
            });
        }
    }
    Ok(out)
}

/// What it takes to bring the publication to the captured tables.
pub struct PublicationChange {
    /// `CREATE PUBLICATION ...` or `ALTER PUBLICATION ... SET TABLE ...`.
    pub sql: String,
    /// True for CREATE (needs CREATE on the database), false for ALTER (needs ownership of
    /// the publication).
    pub creates: bool,
    /// What the report says once it ran.
    pub summary: String,
}

/// The statement that makes the publication cover `tables`, or `None` when it does.
async fn publication_change(
    client: &Client,
    publication: &str,
    tables: &[CapturedTable],
) -> Result<Option<PublicationChange>, CdcError> {
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await?
        .is_some();
    let list: Vec<String> = tables.iter().map(|t| t.name.quoted()).collect();
    let pubname = quote_ident(publication);
    if !exists {
        let sql = if list.is_empty() {
            format!("CREATE PUBLICATION {pubname} WITH (publish_via_partition_root = true)")
        } else {
            format!("CREATE PUBLICATION {pubname} FOR TABLE {} WITH (publish_via_partition_root = true)", list.join(", "))
        };
        return Ok(Some(PublicationChange {
            sql,
            creates: true,
            summary: format!(
                "created publication {publication} for {} table(s)",
                list.len()
            ),
        }));
    }
    let current: Vec<String> = client
        .query("SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2", &[&publication])
        .await?
        .iter()
        .map(|r| TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)).quoted())
        .collect();
    let mut wanted = list.clone();
    wanted.sort();
    let mut have = current.clone();
    have.sort();
    if wanted == have || list.is_empty() {
        return Ok(None);
    }
    Ok(Some(PublicationChange {
        sql: format!("ALTER PUBLICATION {pubname} SET TABLE {}", list.join(", ")),
        creates: false,
        summary: format!(
            "updated publication {publication}: now {} table(s), was {}",
            list.len(),
            current.len()
        ),
    }))
}

/// Failover slots exist from PostgreSQL 17 on.
async fn failover_supported(client: &Client) -> Result<(), CdcError> {
    let v: String = client
        .query_one("SELECT current_setting('server_version_num')", &[])
        .await?
        .get(0);
    let num: i32 = v.trim().parse().unwrap_or(0);
    if num < 170_000 {
        return Err(CdcError::Check(format!(
            "[source] failover_slot needs PostgreSQL 17 or later (this server is {}.{}): set failover_slot = false, or upgrade to keep the slot across a failover",
            num / 10_000,
            num % 10_000 / 100
        )));
    }
    Ok(())
}

async fn ensure_slot(
    client: &Client,
    slot: &str,
    failover: bool,
    report: &mut SetupReport,
) -> Result<(), CdcError> {
    let row = client
        .query_opt(
            "SELECT plugin::text, wal_status FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    match row {
        Some(r) => {
            let plugin: Option<String> = r.get(0);
            let status: Option<String> = r.get(1);
            if plugin.as_deref() != Some("pgoutput") {
                return Err(CdcError::Check(format!(
                    "slot {slot:?} exists with plugin {plugin:?}, not pgoutput: choose another [source] slot or drop it"
                )));
            }
            if status.as_deref() == Some("lost") {
                return Err(CdcError::Check(format!(
                    "slot {slot:?} is invalidated (wal_status = lost): changes were lost on the server; drop it and re-snapshot"
                )));
            }
            if failover {
                let is_failover: Option<bool> = client
                    .query_one(
                        "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
                        &[&slot],
                    )
                    .await?
                    .get(0);
                if is_failover != Some(true) {
                    report.warnings.push(format!(
                        "slot {slot} is not a failover slot: run `ALTER_REPLICATION_SLOT {slot} (FAILOVER true)` on a replication connection while capture is stopped"
                    ));
                }
            }
        }
        None => {
            // The five-argument form (with `failover`) exists from PostgreSQL 17 on, which
            // `failover_supported` has checked.
            let row = if failover {
                client
                    .query_one(
                        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)",
                        &[&slot],
                    )
                    .await?
            } else {
                client
                    .query_one(
                        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                        &[&slot],
                    )
                    .await?
            };
            let lsn: String = row.get(0);
            report
                .changed
                .push(format!("created replication slot {slot} at {lsn}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_escape_like_metacharacters() {
        assert_eq!(like_pattern("*"), "%");
        assert_eq!(like_pattern("my_table"), "my\\_table");
        assert_eq!(like_pattern("tx_*"), "tx\\_%");
    }

    #[test]
    fn patterns_match_as_documented() {
        let t = |s: &str, n: &str| TableName::new(s, n);
        for (pattern, name, want) in [
            ("public.*", t("public", "orders"), true),
            ("public.*", t("sales", "orders"), false),
            ("*.orders", t("sales", "orders"), true),
            ("public.tmp_*", t("public", "tmp_1"), true),
            ("public.tmp_*", t("public", "orders_tmp_"), false),
            ("public.*_old", t("public", "orders_old"), true),
            ("public.*_old", t("public", "_old"), true),
            ("public.a*b*c", t("public", "axxbyyc"), true),
            ("public.a*b*c", t("public", "acb"), false),
            ("public.a*a", t("public", "a"), false),
            ("public.Orders", t("public", "orders"), false),
            ("orders", t("public", "orders"), true),
            ("public.Ünïcode *", t("public", "Ünïcode table"), true),
        ] {
            assert_eq!(matches_pattern(pattern, &name), want, "{pattern} vs {name}");
        }
    }
}
