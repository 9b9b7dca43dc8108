//! Shared helpers: run the real server in-process on an ephemeral port and talk HTTP to it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// A fresh, empty directory for one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "dev-registry-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A record schema `R` in namespace `test` with the given fields.
pub fn record(fields: &str) -> String {
    format!(r#"{{"type":"record","name":"R","namespace":"test","fields":[{fields}]}}"#)
}

pub fn body(schema: &str) -> Value {
    json!({ "schema": schema })
}

/// A running server.
pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Starts the server on 127.0.0.1:0 with `data_file`.
    pub async fn start(data_file: &Path) -> Server {
        let state = wal2delta_dev_registry::open(data_file).expect("open the data file");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(wal2delta_dev_registry::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Server {
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server and waits until it has.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server result");
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        read(self.client.get(self.url(path)).send().await).await
    }

    pub async fn post(&self, path: &str, json: &Value) -> (u16, Value) {
        read(
            self.client
                .post(self.url(path))
                .header("content-type", CONTENT_TYPE)
                .body(json.to_string())
                .send()
                .await,
        )
        .await
    }

    pub async fn put(&self, path: &str, json: &Value) -> (u16, Value) {
        read(self.client.put(self.url(path)).json(json).send().await).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        read(self.client.delete(self.url(path)).send().await).await
    }

    /// Registers `schema` under `subject` and returns its id; panics on any error.
    pub async fn register(&self, subject: &str, schema: &str) -> u64 {
        let (status, reply) = self
            .post(&format!("/subjects/{subject}/versions"), &body(schema))
            .await;
        assert_eq!(status, 200, "registering under {subject}: {reply}");
        reply["id"].as_u64().expect("id in reply")
    }
}

async fn read(response: reqwest::Result<reqwest::Response>) -> (u16, Value) {
    let response = response.expect("request sent");
    let status = response.status().as_u16();
    let text = response.text().await.expect("response body");
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("response is not JSON ({e}): {text}"));
    (status, value)
}

/// Asserts a Confluent-shaped error.
pub fn assert_error(reply: &(u16, Value), status: u16, code: u64) {
    assert_eq!(reply.0, status, "{}", reply.1);
    assert_eq!(reply.1["error_code"].as_u64(), Some(code), "{}", reply.1);
    assert!(reply.1["message"].is_string(), "{}", reply.1);
}
