//! Records the commit the binary is built from, for `wal2delta --version`: the
//! `WAL2DELTA_COMMIT` environment variable when set (the Dockerfile passes it: an image
//! build has no `.git`), else `git rev-parse HEAD` of the checkout, else "unknown".

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=WAL2DELTA_COMMIT");
    let commit = std::env::var("WAL2DELTA_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Built again when HEAD moves: HEAD itself (a checkout) and the branch it names (a
    // commit). Only files that exist: a missing one would rebuild on every build.
    if let (Some(dir), Some(common)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) {
        let mut watched = vec![Path::new(&dir).join("HEAD")];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(Path::new(&common).join(branch));
        }
        watched.push(Path::new(&common).join("packed-refs"));
        for path in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rustc-env=WAL2DELTA_COMMIT={commit}");
}
