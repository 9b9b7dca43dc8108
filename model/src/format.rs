//! Format versions of what wal2delta keeps between runs (docs/upgrading.md, "Format
//! versions"): the lake's tables and the state topics.
//!
//! A binary writes the format it knows and refuses what a newer one wrote: a table or a
//! state record of a newer format may hold what this binary would misread or overwrite
//! (a column meaning something else, a progress record of another shape), so an older
//! binary stops with a message instead of guessing. A table of an older format is not
//! rewritten silently either: `wal2delta upgrade` migrates it, and `--dry-run` says what it
//! would do first.
//!
//! The lake format is recorded in the `commitInfo` of every commit wal2delta makes
//! ([`LAKE_FORMAT_COMMIT_KEY`]), so a reader of the log sees which format wrote each
//! commit, and a table's format is that of its latest commit recording one. (A table
//! property could not be set when a write creates the table: delta-rs refuses keys it
//! does not know there.) `wal2delta upgrade` records the format in a metadata-only commit
//! that also sets the table property [`LAKE_FORMAT_PROPERTY`], for readers of the
//! table's metadata. State records carry a `format` field ([`STATE_FORMAT`]).
//!
//! | Lake format | Release | What it holds |
//! |---|---|---|
//! | 0 (not recorded) | before 0.2.0 | bounded `numeric` as text in every layer |
//! | 1 | 0.2.0 | bounded `numeric` as `DECIMAL(p,s)`; a text column of an older table keeps its values exact (`wal2delta.decimal.<column>`) |

/// The lake format this binary writes.
pub const LAKE_FORMAT: u32 = 1;

/// The table property `wal2delta upgrade` sets to the format it migrated a table to.
pub const LAKE_FORMAT_PROPERTY: &str = "wal2delta.format";

/// The `commitInfo` key recording the lake format of the binary that made a commit.
pub const LAKE_FORMAT_COMMIT_KEY: &str = "wal2delta.format";

/// The format of the records in the state topics (positions, snapshot progress) this
/// binary writes. Records without the field are format 0, read as format 1 (the same
/// shape).
pub const STATE_FORMAT: u32 = 1;

/// How a format found compares with the one this binary writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatCheck {
    /// Written in this binary's format.
    Current,
    /// Written by an earlier release: migrate it (`wal2delta upgrade`).
    Older(u32),
    /// Written by a later release: this binary must not write it.
    Newer(u32),
    /// The recorded value is not a format number at all.
    Unreadable,
}

/// Compares a table's recorded lake format (`None`: no property, format 0) with
/// [`LAKE_FORMAT`].
pub fn check_lake(recorded: Option<&str>) -> FormatCheck {
    let found = match recorded {
        None => 0,
        Some(v) => match v.trim().parse::<u32>() {
            Ok(n) => n,
            Err(_) => return FormatCheck::Unreadable,
        },
    };
    compare(found, LAKE_FORMAT)
}

/// Compares a state record's `format` (`None`: written before the field existed) with
/// [`STATE_FORMAT`]. Format 0 records have the same shape: they are current.
pub fn check_state(recorded: Option<u32>) -> FormatCheck {
    compare(recorded.unwrap_or(STATE_FORMAT).max(1), STATE_FORMAT)
}

fn compare(found: u32, ours: u32) -> FormatCheck {
    match found.cmp(&ours) {
        std::cmp::Ordering::Equal => FormatCheck::Current,
        std::cmp::Ordering::Less => FormatCheck::Older(found),
        std::cmp::Ordering::Greater => FormatCheck::Newer(found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_compare_with_the_one_this_binary_writes() {
        assert_eq!(
            check_lake(Some(&LAKE_FORMAT.to_string())),
            FormatCheck::Current
        );
        assert_eq!(check_lake(None), FormatCheck::Older(0));
        assert_eq!(
            check_lake(Some(&(LAKE_FORMAT + 1).to_string())),
            FormatCheck::Newer(LAKE_FORMAT + 1)
        );
        assert_eq!(check_lake(Some("v2")), FormatCheck::Unreadable);
        assert_eq!(check_state(None), FormatCheck::Current);
        assert_eq!(check_state(Some(0)), FormatCheck::Current);
        assert_eq!(
            check_state(Some(STATE_FORMAT + 1)),
            FormatCheck::Newer(STATE_FORMAT + 1)
        );
    }
}
