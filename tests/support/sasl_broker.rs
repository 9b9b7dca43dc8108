//! A private tansu broker that requires SASL/SCRAM (`tansu broker --authentication`), for the
//! Kafka security tests (docs/security.md). Its user is created before authentication is
//! switched on, because tansu's `user create` speaks to the broker without credentials.
//! The guard's `Drop` kills the broker and removes its directory, also when a test fails.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::metrics::free_port;
use crate::{unique, Stack};

pub struct SaslBroker {
    /// The port tansu listens on (127.0.0.1).
    pub port: u16,
    pub user: String,
    pub password: String,
    dir: PathBuf,
    child: Child,
}

impl SaslBroker {
    /// Starts a broker with one SCRAM-SHA-512 user that advertises `advertised_port` (a
    /// proxy in front of it) or its own port.
    pub fn start(stack: &Stack, advertised_port: Option<u16>) -> Result<SaslBroker> {
        let bin = std::env::var("WAL2DELTA_STACK_TANSU")
            .context("WAL2DELTA_STACK_TANSU is not set: run the tests through ops/test")?;
        let name = unique("saslbroker");
        let dir = PathBuf::from(&stack.stack_dir).join("tests").join(&name);
        std::fs::create_dir_all(&dir)?;
        let port = free_port()?;
        let (user, password) = ("w2d".to_owned(), crate::secrets::KAFKA_PASSWORD.to_owned());
        // Phase one, no authentication: create the user.
        let mut setup = spawn(&bin, &dir, port, port, false)?;
        let created = wait_port(port).and_then(|_| {
            let out = Command::new(&bin)
                .args(["user", "create", "--mechanism", "scram512"])
                .arg("--broker")
                .arg(format!("tcp://127.0.0.1:{port}"))
                .args([&user, &password])
                .output()?;
            if !out.status.success() {
                bail!(
                    "tansu user create failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        });
        let _ = setup.kill();
        let _ = setup.wait();
        created?;
        // Phase two: the same storage, authentication required.
        let child = spawn(&bin, &dir, port, advertised_port.unwrap_or(port), true)?;
        let broker = SaslBroker {
            port,
            user,
            password,
            dir,
            child,
        };
        wait_port(port)?;
        Ok(broker)
    }

    /// The broker's log (tansu logs refused authentications there).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
    }
}

fn spawn(bin: &str, dir: &PathBuf, port: u16, advertised: u16, auth: bool) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("broker.log"))?;
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir)
        .arg("broker")
        .args(["--storage-engine", "sqlite://tansu.db"])
        .arg("--listener-url")
        .arg(format!("tcp://127.0.0.1:{port}"))
        .arg("--advertised-listener-url")
        .arg(format!("tcp://localhost:{advertised}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if auth {
        cmd.arg("--authentication");
    }
    cmd.spawn().context("starting tansu")
}

fn wait_port(port: u16) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("tansu did not listen on {port} within 30 s")
}

impl Drop for SaslBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
