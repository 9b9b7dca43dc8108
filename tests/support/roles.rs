//! Login roles a test creates for itself (least-privilege and secrets tests).

use anyhow::{bail, Result};

use crate::daemon::psql;
use crate::{unique, Stack};

/// A login role of the test's own, dropped with everything granted to it in `Drop`
/// (declare it before the daemon guard, so it goes after the slot and publication).
pub struct TempRole {
    pub name: String,
    password: String,
    admin_dsn: String,
}

impl TempRole {
    /// `CREATE ROLE {unique(prefix)} LOGIN {attributes} PASSWORD '{password}'`.
    pub fn new(stack: &Stack, prefix: &str, attributes: &str, password: &str) -> Result<TempRole> {
        let name = unique(prefix);
        let sql = format!("CREATE ROLE {name} LOGIN {attributes} PASSWORD '{password}'");
        if psql(&stack.admin_dsn, &sql).is_none() {
            bail!("could not create role {name}");
        }
        Ok(TempRole {
            name,
            password: password.to_owned(),
            admin_dsn: stack.admin_dsn.clone(),
        })
    }

    /// The stack's `app` database as this role, on `host`, with `query` appended.
    pub fn dsn(&self, stack: &Stack, host: &str, query: &str) -> String {
        let cfg: tokio_postgres::Config = stack.dsn.parse().expect("stack DSN");
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        format!(
            "postgres://{}:{}@{host}:{port}/app{query}",
            self.name, self.password
        )
    }

    /// Runs `sql` as the stack's superuser.
    pub fn admin(&self, sql: &str) -> Result<()> {
        if psql(&self.admin_dsn, sql).is_none() {
            bail!("as admin: {sql} failed");
        }
        Ok(())
    }
}

impl Drop for TempRole {
    fn drop(&mut self) {
        let sql = format!("DROP OWNED BY {r}; DROP ROLE IF EXISTS {r}", r = self.name);
        for _ in 0..50 {
            if psql(&self.admin_dsn, &sql).is_some() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        eprintln!("could not drop role {} after the test", self.name);
    }
}
