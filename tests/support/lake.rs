//! Independent checks of the lake with DuckDB's delta extension and the `deltalake`
//! Python package (through `tests/py/lake.py`, in the virtualenv `ops/pyenv` makes).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The virtualenv's python: `$WAL2DELTA_PYTHON` (set by `ops/test`), else `ops/pyenv`.
pub fn python() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("WAL2DELTA_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    let root = crate::repo_root();
    let out = Command::new(root.join("ops/pyenv"))
        .output()
        .context("running ops/pyenv")?;
    if !out.status.success() {
        bail!("ops/pyenv failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn run(mode: &str, arg: &str) -> Result<Value> {
    let script = crate::tests_dir().join("py/lake.py");
    let out = Command::new(python()?)
        .arg(script)
        .args([mode, arg])
        .output()
        .context("running tests/py/lake.py")?;
    if !out.status.success() {
        bail!(
            "lake.py {mode} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("lake.py printed no JSON")
}

/// Rows of a DuckDB query (tables are read with `delta_scan('path')`).
pub fn duckdb(sql: &str) -> Result<Vec<Vec<Value>>> {
    let v = run("duckdb", sql)?;
    Ok(serde_json::from_value(v)?)
}

/// One integer from a DuckDB query returning one row with one column.
pub fn duckdb_i64(sql: &str) -> Result<i64> {
    let rows = duckdb(sql)?;
    rows.first()
        .and_then(|r| r.first())
        .and_then(Value::as_i64)
        .with_context(|| format!("no integer from {sql}: {rows:?}"))
}

/// The table as the `deltalake` package sees it: version, rows, partition columns.
pub fn deltalake_info(path: &Path) -> Result<Value> {
    run("deltalake", &path.display().to_string())
}

/// The table's top-level columns as the `deltalake` package reads them: `{"types":
/// {column: Arrow type}, "sums": {decimal column: exact sum of its non-null values}}`.
pub fn deltalake_sums(path: &Path) -> Result<Value> {
    run("sums", &path.display().to_string())
}

/// `[version, deltalake rows, duckdb rows]` for every version of the table at `path`, each
/// read by both readers at that version.
pub fn every_version(path: &Path) -> Result<Vec<[i64; 3]>> {
    let out = run("versions", &path.display().to_string())?;
    Ok(serde_json::from_value(out)?)
}

/// Changes a table behind wal2delta's back with the `deltalake` package (see the `tamper`
/// mode of `tests/py/lake.py` for the shape of `spec`); the new version.
pub fn tamper(spec: &Value) -> Result<i64> {
    let v = run("tamper", &spec.to_string())?;
    v.get("version")
        .and_then(Value::as_i64)
        .context("lake.py tamper printed no version")
}

/// `delta_scan('{path}')`.
pub fn scan(path: &Path) -> String {
    format!("delta_scan('{}')", path.display())
}

/// Parquet files under a table directory that no commit of its log references: files a
/// writer wrote but did not commit.
pub fn uncommitted_files(table: &Path) -> Result<Vec<String>> {
    let mut referenced = std::collections::HashSet::new();
    let log = table.join("_delta_log");
    if let Ok(entries) = std::fs::read_dir(&log) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") {
                let Ok(text) = std::fs::read_to_string(&p) else {
                    continue;
                };
                for line in text.lines() {
                    let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
                    if let Some(path) = v
                        .get("add")
                        .and_then(|a| a.get("path"))
                        .and_then(Value::as_str)
                    {
                        referenced.insert(percent_decode(path));
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![table.to_path_buf()];
    while let Some(dir) = stack.pop() {
        // The table (or a partition directory) may not exist yet.
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "_delta_log") {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "parquet") {
                let rel = p.strip_prefix(table)?.to_string_lossy().into_owned();
                if !referenced.contains(&rel) {
                    out.push(rel);
                }
            }
        }
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The latest version of a Delta table (the highest commit file of its log).
pub fn delta_version(table: &Path) -> Option<i64> {
    std::fs::read_dir(table.join("_delta_log"))
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".json")?.parse::<i64>().ok()
        })
        .max()
}

/// The `commitInfo` action of the table's latest commit.
pub fn last_commit_info(table: &Path) -> Result<Value> {
    let v = delta_version(table).context("no commit yet")?;
    let text = std::fs::read_to_string(table.join(format!("_delta_log/{v:020}.json")))?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|a| a.get("commitInfo").cloned())
        .context("the commit has no commitInfo")
}

/// How many commits of the table's log compacted it (`OPTIMIZE`).
pub fn compactions(table: &Path) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(table.join("_delta_log"))? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "json")
            && std::fs::read_to_string(&path)?.contains("\"operation\":\"OPTIMIZE\"")
        {
            n += 1;
        }
    }
    Ok(n)
}

/// Rows of a DuckDB query returning two text columns.
pub fn duckdb_pairs(sql: &str) -> Result<Vec<(String, String)>> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Ok(duckdb(sql)?
        .iter()
        .map(|r| (text(&r[0]), text(&r[1])))
        .collect())
}

/// `(key, rule_id)` of the lake's `rules/hits`, sorted (none before the table exists).
pub fn rule_hits(lake: &Path) -> Result<Vec<(String, String)>> {
    let hits = lake.join("rules/hits");
    if !hits.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    duckdb_pairs(&format!(
        "SELECT key, rule_id FROM delta_scan('{}') ORDER BY 1, 2",
        hits.display()
    ))
}

/// `(key, rule, transition)` of the lake's `rules/transitions` of `origin`: stream ones in commit order, backfill ones sorted.
pub fn transitions(lake: &Path, origin: &str) -> Result<Vec<(String, String, String)>> {
    let path = lake.join("rules/transitions");
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let order = if origin == "stream" {
        "lsn, key, transition DESC, rule_id"
    } else {
        "key, rule_id, transition"
    };
    let rows = duckdb(&format!(
        "SELECT key, rule_id, transition FROM delta_scan('{}') WHERE origin = '{origin}' ORDER BY {order}",
        path.display()
    ))?;
    Ok(rows
        .iter()
        .map(|r| {
            let t = |i: usize| r[i].as_str().unwrap_or_default().to_owned();
            (t(0), t(1), t(2))
        })
        .collect())
}

/// One row of `rules/transitions`: (rule_id, rule_version, key, transition, lsn, origin).
pub type ExactTransition = (String, i64, String, String, i64, String);

/// Every row of the lake's `rules/transitions`, sorted: what two runs of one history must
/// hold one for one (LSNs included).
pub fn exact_transitions(lake: &Path) -> Result<Vec<ExactTransition>> {
    let path = lake.join("rules/transitions");
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let rows = duckdb(&format!(
        "SELECT rule_id, rule_version, key, transition, lsn, origin FROM delta_scan('{}') ORDER BY ALL",
        path.display()
    ))?;
    Ok(rows
        .iter()
        .map(|r| {
            let s = |i: usize| r[i].as_str().unwrap_or_default().to_owned();
            let n = |i: usize| r[i].as_i64().unwrap_or(i64::MIN);
            (s(0), n(1), s(2), s(3), n(4), s(5))
        })
        .collect())
}

/// The positions `rules/versions` records, in the order recorded.
pub fn rule_versions(lake: &Path) -> Result<Vec<i64>> {
    let path = lake.join("rules/versions");
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let rows = duckdb(&format!(
        "SELECT position FROM delta_scan('{}') ORDER BY seq",
        path.display()
    ))?;
    Ok(rows.iter().filter_map(|r| r[0].as_i64()).collect())
}

/// `columns` of the Delta table at `path` in order of `order`, read by DuckDB; no rows
/// while the table does not exist yet.
pub fn table_rows(path: &Path, columns: &str, order: &str) -> Result<Vec<Vec<Value>>> {
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    duckdb(&format!(
        "SELECT {columns} FROM {} ORDER BY {order}",
        scan(path)
    ))
}
