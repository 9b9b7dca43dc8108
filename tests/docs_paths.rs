//! The repository's own docs name files that exist: every path of the code that
//! docs/architecture.md names (a `.rs` file, a directory of the code, a document) is in
//! the repository, so the map a newcomer reads first leads somewhere.

use std::path::Path;

use anyhow::{ensure, Result};
use wal2delta_tests::repo_root;

/// The backquoted names in `text` that are paths of the repository: `.rs` and `.md` files
/// and directories (`lake/src/silver/fold/`), relative to the repository's root.
fn named_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.contains(char::is_whitespace) && !t.starts_with('/'))
        .filter(|t| {
            t.ends_with(".rs") || t.ends_with(".md") || (t.ends_with('/') && t.contains("src"))
        })
        .collect()
}

#[test]
fn every_path_the_architecture_map_names_exists() -> Result<()> {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("docs/architecture.md"))?;
    let named = named_paths(&text);
    ensure!(
        named.len() > 20,
        "the map names the code's files: {named:?}"
    );
    let missing: Vec<&&str> = named
        .iter()
        .filter(|p| !Path::new(&root).join(p).exists())
        .collect();
    ensure!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
    Ok(())
}

#[test]
fn the_path_reader_finds_paths_and_nothing_else() {
    let text = "see `lake/src/silver/hook.rs` and `lake/src/silver/fold/`, not `rules/hits`, \
                `/metrics` or `a b.rs`; [doc](`docs/rules.md`)";
    assert_eq!(
        named_paths(text),
        vec![
            "lake/src/silver/hook.rs",
            "lake/src/silver/fold/",
            "docs/rules.md"
        ]
    );
}

/// Every file under `dir` (recursively, skipping build output and hidden directories)
/// whose name ends with one of `exts`, or has no extension when `exts` holds "".
fn files(dir: &Path, exts: &[&str], out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "results" {
                files(&path, exts, out);
            }
        } else {
            let ext = path
                .extension()
                .map(|x| x.to_string_lossy().into_owned())
                .unwrap_or_default();
            if exts.contains(&ext.as_str()) {
                out.push(path);
            }
        }
    }
}

/// `docs/….md` names in `text` (in prose, comments, links).
fn cited_docs(text: &str) -> Vec<&str> {
    let mut cited = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("docs/") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/_-.".contains(c)))
            .unwrap_or(tail.len());
        let name = tail[..end].trim_end_matches('.');
        // `docs/` inside another word (`…/fuzz/docs/x.md`) is not the repository's.
        let inside = rest[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '/');
        if name.ends_with(".md") && !inside {
            cited.push(name);
        }
        rest = &tail[end.max(5)..];
    }
    cited
}

#[test]
fn every_document_the_repository_cites_is_in_the_repository() -> Result<()> {
    let root = repo_root();
    let mut sources = Vec::new();
    files(
        &root,
        &["md", "rs", "toml", "yml", "py", "sql", ""],
        &mut sources,
    );
    let mut missing = Vec::new();
    let mut seen = 0;
    for path in &sources {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for doc in cited_docs(&text) {
            seen += 1;
            if !root.join(doc).is_file() {
                missing.push(format!("{} cites {doc}", path.display()));
            }
        }
        // Relative links of the documents themselves: `[x](operations.md#deploying)`.
        if path.extension().is_some_and(|e| e == "md") {
            for link in text.split("](").skip(1) {
                let target = link.split([')', '#', ' ']).next().unwrap_or_default();
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let dir = path.parent().unwrap_or(&root);
                if !dir.join(target).exists() {
                    missing.push(format!("{} links to {target}", path.display()));
                }
            }
        }
    }
    ensure!(seen > 50, "the scan finds the citations: {seen}");
    ensure!(
        missing.is_empty(),
        "cited but not in the repository: {missing:#?}"
    );
    Ok(())
}

#[test]
fn the_citation_reader_finds_docs_and_nothing_else() {
    assert_eq!(
        cited_docs("see docs/rules.md, (docs/types.md#nan) and fuzz/docs/x.md; docs/ alone."),
        vec!["docs/rules.md", "docs/types.md"]
    );
}

#[test]
fn the_readme_opens_with_a_paragraph_short_enough_to_read() -> Result<()> {
    let text = std::fs::read_to_string(repo_root().join("README.md"))?;
    let first = text
        .split("\n\n")
        .map(str::trim)
        .find(|p| !p.is_empty() && !p.starts_with('#'))
        .unwrap_or_default();
    let words = first.split_whitespace().count();
    ensure!(
        (10..=70).contains(&words),
        "README's first paragraph has {words} words: {first}"
    );
    Ok(())
}

#[test]
fn the_quickstart_header_names_every_stage_it_runs() -> Result<()> {
    let text = std::fs::read_to_string(repo_root().join("ops/quickstart"))?;
    let header: String = text
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ");
    let stages = text
        .split("--stage ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_default();
    ensure!(!stages.is_empty(), "the quickstart runs named stages");
    for stage in stages.split(',') {
        ensure!(
            header.contains(stage),
            "the quickstart runs {stage} but its header does not say so: {header}"
        );
    }
    Ok(())
}

#[test]
fn the_docs_state_the_tested_versions_and_the_protocol_capture_speaks() -> Result<()> {
    let root = repo_root();
    let ops = std::fs::read_to_string(root.join("docs/operations.md"))?;
    let table = ops
        .split("## Supported versions")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .unwrap_or_default();
    for part in ["PostgreSQL", "Kafka", "registry", "| 15", "tansu"] {
        ensure!(
            table.contains(part),
            "the supported-versions table names {part}"
        );
    }
    let stack = std::fs::read_to_string(root.join("ops/stack"))?;
    let tansu = stack
        .split("cargo install tansu --version ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_default();
    ensure!(
        table.contains(&format!("tansu {tansu}")),
        "the table names the tansu version ops/stack installs ({tansu})"
    );
    // docs/capture.md says which pgoutput protocol versions the session asks for.
    let session = std::fs::read_to_string(root.join("wal2delta/src/capture/session.rs"))?;
    let capture = std::fs::read_to_string(root.join("docs/capture.md"))?;
    ensure!(
        session.contains("if streaming { 2 } else { 1 }")
            && capture.contains("protocol version 2")
            && capture.contains("version 1 otherwise"),
        "docs/capture.md states the protocol versions wal2delta/src/capture/session.rs uses"
    );
    Ok(())
}
