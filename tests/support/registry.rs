//! A private development schema registry requiring HTTP basic authentication
//! (`wal2delta-dev-registry --basic-auth-file`), for `tests/registry_security.rs`. The
//! guard's `Drop` kills it and removes its directory, also when a test fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::metrics::free_port;
use crate::secrets::REGISTRY_PASSWORD;
use crate::{unique, Stack};

pub struct AuthRegistry {
    pub port: u16,
    pub user: String,
    pub password: String,
    dir: PathBuf,
    child: Child,
}

impl AuthRegistry {
    pub fn start(stack: &Stack) -> Result<AuthRegistry> {
        let bin = std::env::var("WAL2DELTA_STACK_REGISTRY_BIN")
            .context("WAL2DELTA_STACK_REGISTRY_BIN is not set: run the tests through ops/test")?;
        let dir = PathBuf::from(&stack.stack_dir)
            .join("tests")
            .join(unique("authregistry"));
        std::fs::create_dir_all(&dir)?;
        let (user, password) = ("sr-user".to_owned(), REGISTRY_PASSWORD.to_owned());
        std::fs::write(dir.join("auth"), format!("{user}:{password}\n"))?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new(bin)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-file")
            .arg(dir.join("schemas.json"))
            .arg("--basic-auth-file")
            .arg(dir.join("auth"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting wal2delta-dev-registry")?;
        let registry = AuthRegistry {
            port,
            user,
            password,
            dir,
            child,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("the registry did not listen on {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(registry)
    }
}

impl Drop for AuthRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
