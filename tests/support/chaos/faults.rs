//! What a chaos run breaks: the kinds of fault, and the lake faults that outlive a
//! statement (a read-only lake, data files gone), undone when dropped.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};

#[derive(Debug, Clone, Copy)]
pub(super) enum Fault {
    KillPipeline,
    KillOneStage,
    PgFast,
    PgImmediate,
    KillBroker,
    KillRegistry,
    /// Close every connection between the daemon and PostgreSQL (the driver's proxy).
    CutPg,
    /// The proxy forwards nothing for a while; connections stay open.
    StallPg,
    /// Every file and directory of the lake immutable (`chattr +i`) for a while.
    LakeReadOnly,
    /// The Silver table a rule looks up cannot be read for a while (its data files gone).
    LookupUnreadable,
}

/// Makes the lake (or a directory of it) read-only while it lives. Tests run as root, for
/// whom `chmod` changes nothing; the immutable attribute (`chattr +i`, ext4 and most Linux
/// filesystems) makes creating, renaming, deleting and writing files fail with EPERM even
/// for root. Dropped, even when a test fails, it makes the tree writable again.
pub struct ReadOnlyLake(PathBuf);

impl ReadOnlyLake {
    pub fn set(path: PathBuf) -> Result<ReadOnlyLake> {
        chattr(&path, "+i")?;
        Ok(ReadOnlyLake(path))
    }
}

impl Drop for ReadOnlyLake {
    fn drop(&mut self) {
        if let Err(e) = chattr(&self.0, "-i") {
            eprintln!("chaos: could not make the lake writable again: {e:#}");
        }
    }
}

/// Moves a table's data files away while it lives (a storage that cannot serve them: a
/// 404, an object store outage), and back when dropped, also when the test fails.
pub struct FilesAway {
    moved: Vec<(std::path::PathBuf, std::path::PathBuf)>,
}

impl FilesAway {
    pub fn take(table: &std::path::Path, to: &std::path::Path) -> Result<FilesAway> {
        std::fs::create_dir_all(to)?;
        let mut moved = Vec::new();
        for entry in std::fs::read_dir(table)? {
            let from = entry?.path();
            if from.extension().is_some_and(|e| e == "parquet") {
                let away = to.join(from.file_name().unwrap_or_default());
                std::fs::rename(&from, &away)?;
                moved.push((from, away));
            }
        }
        ensure!(!moved.is_empty(), "no data file in {}", table.display());
        Ok(FilesAway { moved })
    }
}

impl Drop for FilesAway {
    fn drop(&mut self) {
        for (home, away) in &self.moved {
            if let Err(e) = std::fs::rename(away, home) {
                eprintln!("could not put {} back: {e}", home.display());
            }
        }
    }
}

pub(super) fn chattr(path: &PathBuf, flag: &str) -> Result<()> {
    let out = Command::new("chattr")
        .args(["-R", "-f", flag])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .context("running chattr")?;
    if !out.status.success() {
        bail!(
            "chattr -R {flag} {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `host:port` of a `postgres://user:password@host:port/db` DSN.
pub(super) fn dsn_host_port(dsn: &str) -> Result<String> {
    let rest = dsn
        .split_once('@')
        .map(|(_, r)| r)
        .context("the DSN has no @host part")?;
    Ok(rest.split(['/', '?']).next().unwrap_or(rest).to_owned())
}
