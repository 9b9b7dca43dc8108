//! The development S3 server of `ops/stack` (ops/s3): a test's lake on it, and a second
//! server that ignores conditional writes.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The stack's S3 server: address and development credentials (`ops/stack env`).
#[derive(Debug, Clone)]
pub struct S3 {
    pub endpoint: String,
    pub bucket: String,
    access_key: String,
    secret_key: String,
}

impl S3 {
    pub fn from_env() -> S3 {
        let var = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run the tests through ops/test (it starts the stack)")
            })
        };
        S3 {
            endpoint: var("WAL2DELTA_STACK_S3_ENDPOINT"),
            bucket: var("WAL2DELTA_STACK_S3_BUCKET"),
            access_key: var("WAL2DELTA_STACK_S3_ACCESS_KEY"),
            secret_key: var("WAL2DELTA_STACK_S3_SECRET_KEY"),
        }
    }

    /// The daemon's environment for a lake at `uri` on this server, configured the way
    /// the docs tell users to: the endpoint in `[lake] storage_options`, the credentials
    /// in the standard AWS variables.
    pub fn daemon_env(&self, uri: &str) -> Vec<(String, String)> {
        vec![
            ("WAL2DELTA__LAKE__URI".into(), uri.into()),
            (
                "WAL2DELTA__LAKE__STORAGE_OPTIONS__AWS_ENDPOINT_URL".into(),
                self.endpoint.clone(),
            ),
            (
                "WAL2DELTA__LAKE__STORAGE_OPTIONS__AWS_ALLOW_HTTP".into(),
                "true".into(),
            ),
            ("AWS_ACCESS_KEY_ID".into(), self.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), self.secret_key.clone()),
            ("AWS_REGION".into(), "us-east-1".into()),
        ]
    }

    /// A second server on a free port that ignores `If-None-Match` (like S3-compatible
    /// servers without conditional writes), its objects under `dir`; stopped on drop.
    pub fn without_conditional_writes(&self, dir: &std::path::Path) -> Result<S3Server> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let bin = std::env::var("WAL2DELTA_STACK_S3_BIN")
            .context("WAL2DELTA_STACK_S3_BIN is not set (ops/stack env)")?;
        let child = Command::new(bin)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--root")
            .arg(dir)
            .args(["--bucket", &self.bucket, "--ignore-preconditions"])
            .env("WAL2DELTA_DEV_S3_ACCESS_KEY", &self.access_key)
            .env("WAL2DELTA_DEV_S3_SECRET_KEY", &self.secret_key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting wal2delta-dev-s3")?;
        let server = S3Server {
            s3: S3 {
                endpoint: format!("http://127.0.0.1:{port}"),
                ..self.clone()
            },
            child,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                bail!("the second S3 server did not listen on port {port}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }
}

/// A server started by a test; killed when dropped.
pub struct S3Server {
    pub s3: S3,
    child: Child,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
