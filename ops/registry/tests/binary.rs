//! The real binary, as `ops/stack` runs it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{record, scratch_dir};
use serde_json::json;

fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wal2delta-dev-registry"))
}

/// Starts the binary on an ephemeral port and returns it with its base URL, read from the
/// "listening on" log line.
fn start(data_file: &std::path::Path) -> (Child, String) {
    let mut child = binary()
        .args(["--listen", "127.0.0.1:0", "--data-file"])
        .arg(data_file)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (found, wait) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("http://") {
                let url: String = line[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || ":/.".contains(*c))
                    .collect();
                let _ = found.send(url);
            }
        }
    });
    match wait.recv_timeout(Duration::from_secs(30)) {
        Ok(url) => (child, url),
        Err(_) => {
            let _ = child.kill();
            panic!("the registry never said where it listens");
        }
    }
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for _ in 0..100 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("the registry did not stop on SIGTERM");
}

#[tokio::test]
async fn serves_readiness_and_registrations_and_stops_cleanly_on_sigterm() {
    let dir = scratch_dir("binary");
    let data_file = dir.join("schemas.json");
    let (mut child, base) = start(&data_file);
    let client = reqwest::Client::new();

    let ready = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    assert_eq!(ready.json::<serde_json::Value>().await.unwrap(), json!({}));

    let schema = record(r#"{"name":"id","type":"long"}"#);
    let registered = client
        .post(format!("{base}/subjects/s/versions"))
        .header("content-type", "application/vnd.schemaregistry.v1+json")
        .body(json!({ "schema": schema }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(registered.status().as_u16(), 200);
    assert_eq!(
        registered.json::<serde_json::Value>().await.unwrap(),
        json!({"id": 1})
    );

    assert!(terminate(&mut child).success());
    let on_disk = std::fs::read_to_string(&data_file).unwrap();
    assert!(on_disk.contains("\"s\""), "{on_disk}");
}

#[test]
fn refuses_to_start_on_a_corrupt_data_file() {
    let dir = scratch_dir("corrupt-bin");
    let path = dir.join("schemas.json");
    std::fs::write(&path, "not json at all").unwrap();
    let output = binary()
        .args(["--listen", "127.0.0.1:0", "--data-file"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(stderr.contains("corrupt"), "{stderr}");
    // The file is left as it was, for the operator to look at.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not json at all");
}

#[test]
fn help_says_it_is_a_development_tool() {
    let output = binary().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("DEVELOPMENT"), "{help}");
    assert!(help.contains("NOT FOR PRODUCTION"), "{help}");
    assert!(help.contains("--data-file"), "{help}");
    assert!(help.contains("--listen"), "{help}");
}
