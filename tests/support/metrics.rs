//! Reading a running daemon's Prometheus endpoint (`[metrics] listen`).

use anyhow::Result;

/// A free loopback port for a daemon's metrics listener.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The text of `/metrics` on `port`.
pub async fn text(port: u16) -> Result<String> {
    Ok(reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await?
        .text()
        .await?)
}

/// The value of the series `name{table="..."}` in `text`.
pub fn of_table(text: &str, name: &str, table: &str) -> Option<f64> {
    of(text, name, "table", table)
}

/// The value of the series `name{label="value"}` (its only label) in `text`.
pub fn of(text: &str, name: &str, label: &str, value: &str) -> Option<f64> {
    let series = format!("{name}{{{label}=\"{value}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}
