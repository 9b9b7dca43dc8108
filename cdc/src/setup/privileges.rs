//! The capture role's privileges, checked by `wal2delta setup` before it changes anything.
//!
//! What the role needs (migrations/least_privilege.sql grants exactly this):
//! - `LOGIN` and `REPLICATION` (on RDS, membership in `rds_replication`): the walsender
//!   connection and the slot;
//! - `USAGE` on each captured schema and `SELECT` on each captured table: the initial
//!   snapshot and `reconcile` read them (streaming itself reads no table);
//! - to create or change the publication: on PostgreSQL 15 and later only a table's owner
//!   (or a superuser) may add it to a publication, `CREATE` on the database creates one and
//!   only the publication's owner alters it. A least-privilege role owns none of these,
//!   so the tables' owner runs that one step and `setup` then finds the publication in
//!   place and needs none of it.
//!
//! Each problem names the role, the object and the statement that fixes it.

use tokio_postgres::Client;
use wal2delta_model::table::quote_ident;

use super::{CapturedTable, PublicationChange};
use crate::CdcError;

/// Every missing privilege, one sentence each; empty when the role has what it needs.
pub(super) async fn check(
    client: &Client,
    publication: &str,
    tables: &[CapturedTable],
    change: Option<&PublicationChange>,
) -> Result<Vec<String>, CdcError> {
    let row = client
        .query_one(
            "SELECT current_user::text, r.rolsuper, r.rolreplication, \
                    EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication') \
                      AND pg_has_role(current_user, 'rds_replication', 'MEMBER'), \
                    has_database_privilege(current_database(), 'CREATE'), \
                    current_database()::text \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await?;
    let user: String = row.get(0);
    let (superuser, replication, rds_replication, create_db): (bool, bool, bool, bool) =
        (row.get(1), row.get(2), row.get(3), row.get(4));
    let database: String = row.get(5);
    let role = quote_ident(&user);
    let mut problems = Vec::new();
    if !(superuser || replication || rds_replication) {
        problems.push(format!(
            "role {user:?} lacks the REPLICATION attribute, which the replication connection and the slot need: \
             run ALTER ROLE {role} REPLICATION as a superuser (on RDS: GRANT rds_replication TO {role})"
        ));
    }
    if superuser {
        return Ok(problems);
    }
    let mut schemas_without_usage: Vec<&str> = Vec::new();
    let mut not_owned: Vec<(String, String)> = Vec::new();
    for t in tables {
        let row = client
            .query_one(
                "SELECT has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT'), \
                        pg_has_role(c.relowner, 'USAGE'), pg_get_userbyid(c.relowner)::text \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&t.name.schema, &t.name.name],
            )
            .await?;
        let (usage, select, owns, owner): (bool, bool, bool, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if !usage && !schemas_without_usage.contains(&&t.name.schema[..]) {
            schemas_without_usage.push(&t.name.schema);
            problems.push(format!(
                "role {user:?} has no USAGE on schema {:?}, so it cannot read its tables: run GRANT USAGE ON SCHEMA {} TO {role}",
                t.name.schema,
                quote_ident(&t.name.schema)
            ));
        }
        if !select {
            problems.push(format!(
                "role {user:?} has no SELECT on table {} (the initial snapshot and reconcile read it): run GRANT SELECT ON {} TO {role}",
                t.name,
                t.name.quoted()
            ));
        }
        if !owns {
            not_owned.push((t.name.to_string(), owner));
        }
    }
    let Some(change) = change else {
        return Ok(problems);
    };
    let owns_publication = change.creates
        || client
            .query_one(
                "SELECT pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await?
            .get::<_, bool>(0);
    if !not_owned.is_empty() || (change.creates && !create_db) || !owns_publication {
        let mut why = Vec::new();
        if !not_owned.is_empty() {
            let list: Vec<String> = not_owned
                .iter()
                .map(|(t, o)| format!("{t} (owner {o})"))
                .collect();
            why.push(format!(
                "only a table's owner may add it to a publication, and {user:?} does not own {}",
                list.join(", ")
            ));
        }
        if change.creates && !create_db {
            why.push(format!(
                "creating a publication needs CREATE on database {database:?}"
            ));
        }
        if !owns_publication {
            why.push(format!(
                "only the owner of publication {publication:?} may change it"
            ));
        }
        problems.push(format!(
            "role {user:?} cannot {} publication {publication:?}: {}. Have the tables' owner (or a superuser) run:\n    {};\n  then run `wal2delta setup` again (migrations/least_privilege.sql does this step)",
            if change.creates { "create" } else { "change" },
            why.join("; "),
            change.sql
        ));
    }
    Ok(problems)
}
