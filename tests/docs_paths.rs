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
