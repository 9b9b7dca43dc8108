//! docker-compose.yml, the Dockerfile and ops/wal2delta.service, checked statically (no
//! Docker engine here; `tests/py/compose_check.py` does the checks): the YAML parses, every
//! mounted file exists, service names, ports and wal2delta's addresses agree, Prometheus
//! and Grafana find their files. Then the daemon itself loads the mounted config with the
//! compose environment, finding it through `WAL2DELTA_CONFIG` as `docker compose run
//! wal2delta setup` does.

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use wal2delta_tests::daemon::binary;
use wal2delta_tests::lake::python;
use wal2delta_tests::repo_root;

fn check(root: &Path) -> Result<Value> {
    let out = Command::new(python()?)
        .arg(repo_root().join("tests/py/compose_check.py"))
        .arg(root)
        .output()?;
    ensure!(
        out.status.success(),
        "compose_check.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[test]
fn the_compose_file_the_image_and_the_unit_agree() -> Result<()> {
    let report = check(&repo_root())?;
    let problems = report["problems"].as_array().context("problems")?;
    ensure!(problems.is_empty(), "{problems:#?}");

    // The daemon finds the config through WAL2DELTA_CONFIG alone and accepts it with the
    // compose environment (container paths mapped to the repository's files).
    let mut cmd = Command::new(binary());
    for (k, _) in std::env::vars() {
        if k.starts_with("WAL2DELTA") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in report["wal2delta_env"].as_object().context("env")? {
        cmd.env(k, v.as_str().unwrap_or_default());
    }
    let out = cmd.arg("check-config").output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "check-config: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "kafka: kafka:9092",
        "schema registry: http://schema-registry:8081",
        "lake: s3://lake/wal2delta (storage options: aws_allow_http, aws_endpoint_url)",
        "metrics: 0.0.0.0:9187",
    ] {
        ensure!(text.contains(line), "{line:?} in {text}");
    }
    ensure!(
        !text.contains("replicator:replicator") && !text.contains("change-me-minio-secret"),
        "no password: {text}"
    );
    Ok(())
}

/// The checker finds what it is there to find: a broker address no listener advertises, a
/// lake endpoint that is not the S3 service's port, a mounted file that does not exist, a
/// short stop grace, no host listener, a setup service that does not set up, a floating
/// toolchain, a dependency layer of every member and `status` run in a new container.
#[test]
fn the_checker_names_a_wrong_address_and_a_missing_file() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("compose-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let copy = |rel: &str| -> Result<()> {
        let to = dir.join(rel);
        std::fs::create_dir_all(to.parent().context("parent")?)?;
        std::fs::copy(repo_root().join(rel), to)?;
        Ok(())
    };
    let result = (|| {
        for f in [
            "Dockerfile",
            "ops/wal2delta.example.toml",
            "ops/wal2delta.service",
            "ops/prometheus/prometheus.yml",
            "ops/prometheus/alerts.yml",
            "ops/prometheus/dashboard.json",
            "ops/grafana/datasource.yml",
            "ops/grafana/dashboards.yml",
        ] {
            copy(f)?;
        }
        std::fs::create_dir_all(dir.join("ops/models"))?;
        let compose = std::fs::read_to_string(repo_root().join("docker-compose.yml"))?
            .replace(
                "WAL2DELTA__KAFKA__BROKERS: kafka:9092",
                "WAL2DELTA__KAFKA__BROKERS: kafka:9093",
            )
            .replace(
                "AWS_ENDPOINT_URL: http://minio:9000",
                "AWS_ENDPOINT_URL: http://minio:9100",
            )
            .replace("stop_grace_period: 120s", "stop_grace_period: 10s")
            .replace("HOST://localhost:29092", "HOST://localhost:29093")
            .replace("command: [\"setup\"]", "command: [\"run\"]");
        std::fs::write(dir.join("docker-compose.yml"), compose)?;
        let docker = std::fs::read_to_string(dir.join("Dockerfile"))?
            .replace("FROM rust:1.95.0-bookworm", "FROM rust:1-bookworm")
            .replace(
                "--recipe-path recipe.json --bin wal2delta",
                "--recipe-path recipe.json",
            );
        std::fs::write(dir.join("Dockerfile"), docker)?;
        std::fs::copy(
            repo_root().join("ops/prometheus/alertmanager.yml"),
            dir.join("ops/prometheus/alertmanager.yml"),
        )?;
        std::fs::write(
            dir.join("README.md"),
            "Check it: `docker compose run --rm wal2delta status`.\n",
        )?;
        std::fs::remove_file(dir.join("ops/grafana/datasource.yml"))?;
        let report = check(&dir)?;
        let problems = report["problems"].to_string();
        for needle in [
            "broker kafka:9093",
            "datasource.yml",
            "http://minio:9100",
            "stop_grace_period is 10s",
            "no localhost listener",
            "wal2delta-setup runs",
            "not pinned",
            "not --bin wal2delta",
            "README.md runs status in a new container",
        ] {
            ensure!(problems.contains(needle), "{needle:?} in {problems}");
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
