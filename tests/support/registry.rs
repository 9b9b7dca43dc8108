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
        let dir = PathBuf::from(&stack.stack_dir)
            .join("tests")
            .join(unique("authregistry"));
        std::fs::create_dir_all(&dir)?;
        let (user, password) = ("sr-user".to_owned(), REGISTRY_PASSWORD.to_owned());
        let port = free_port()?;
        let child = spawn(&dir, port, &user, &password)?;
        Ok(AuthRegistry {
            port,
            user,
            password,
            dir,
            child,
        })
    }

    /// Restarts the registry on the same port and schemas, accepting only `password`:
    /// a credential rotation that clients still holding the old one meet.
    pub fn rotate_password(&mut self, password: &str) -> Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(&self.dir, self.port, &self.user, password)?;
        self.password = password.to_owned();
        Ok(())
    }
}

/// Starts the registry in `dir` on `port`, and waits until it listens.
fn spawn(dir: &std::path::Path, port: u16, user: &str, password: &str) -> Result<Child> {
    let bin = std::env::var("WAL2DELTA_STACK_REGISTRY_BIN")
        .context("WAL2DELTA_STACK_REGISTRY_BIN is not set: run the tests through ops/test")?;
    std::fs::write(dir.join("auth"), format!("{user}:{password}\n"))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("registry.log"))?;
    let mut child = Command::new(bin)
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
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            bail!("the registry did not listen on {port} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(child)
}

impl Drop for AuthRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
