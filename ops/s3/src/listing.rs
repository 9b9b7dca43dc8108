//! `ListObjectsV2` over a bucket directory: every file under the prefix, in S3's order
//! (keys sorted by their UTF-8 bytes), grouped by the delimiter, paged by `max-keys`.
//!
//! The continuation token is the last key (or common prefix) of the page, so the next page
//! starts strictly after it; it is opaque to clients as S3's is.

use std::path::Path;

use crate::store::Meta;

/// One page of a listing.
#[derive(Debug, Default)]
pub struct Page {
    pub objects: Vec<(String, Meta)>,
    pub prefixes: Vec<String>,
    /// Where the next page starts, when this one is truncated.
    pub next: Option<String>,
}

/// Every object of the bucket at `bucket_dir` whose key starts with `prefix`, sorted.
/// The walk starts at the deepest directory the prefix names.
pub fn objects_under(bucket_dir: &Path, prefix: &str) -> std::io::Result<Vec<(String, Meta)>> {
    let dir_part = match prefix.rfind('/') {
        Some(i) => &prefix[..=i],
        None => "",
    };
    let mut out = Vec::new();
    let mut stack = vec![(bucket_dir.join(dir_part), dir_part.to_string())];
    while let Some((dir, key_prefix)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            // Keys are UTF-8 (S3 requires it); a file whose name is not was not put here.
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let key = format!("{key_prefix}{name}");
            let md = match entry.metadata() {
                Ok(md) => md,
                // Removed while we walked: not there any more.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if md.is_dir() {
                // Only descend where keys can still match the prefix.
                let sub = format!("{key}/");
                if sub.starts_with(prefix) || prefix.starts_with(&sub) {
                    stack.push((entry.path(), sub));
                }
            } else if md.is_file() && key.starts_with(prefix) {
                out.push((key, Meta::of(&md)));
            }
        }
    }
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The page of `sorted` (all under `prefix`) after `after`, at most `max` entries
/// (objects and common prefixes together, as S3 counts them).
pub fn page(
    sorted: Vec<(String, Meta)>,
    prefix: &str,
    delimiter: Option<&str>,
    after: Option<&str>,
    max: usize,
) -> Page {
    let mut out = Page::default();
    let mut count = 0usize;
    let mut last: Option<String> = None;
    for (key, meta) in sorted {
        if after.is_some_and(|a| key.as_str() <= a) {
            continue;
        }
        let group = delimiter.filter(|d| !d.is_empty()).and_then(|d| {
            key[prefix.len()..]
                .find(d)
                .map(|i| key[..prefix.len() + i + d.len()].to_string())
        });
        if let Some(g) = &group {
            // A group the previous page ended with, or already on this page.
            if after == Some(g.as_str()) || out.prefixes.last() == Some(g) {
                continue;
            }
        }
        if count == max {
            out.next = last;
            return out;
        }
        count += 1;
        match group {
            Some(g) => {
                last = Some(g.clone());
                out.prefixes.push(g);
            }
            None => {
                last = Some(key.clone());
                out.objects.push((key, meta));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn keys(list: &[&str]) -> Vec<(String, Meta)> {
        let mut v: Vec<_> = list
            .iter()
            .map(|k| {
                (
                    k.to_string(),
                    Meta {
                        size: 0,
                        modified: SystemTime::UNIX_EPOCH,
                        etag: String::new(),
                    },
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    fn names(p: &Page) -> Vec<String> {
        p.objects.iter().map(|(k, _)| k.clone()).collect()
    }

    #[test]
    fn delimiter_groups_and_pages_resume_after_the_token() {
        let all = keys(&[
            "t/_delta_log/0.json",
            "t/_delta_log/1.json",
            "t/a=1/p.parquet",
            "t/a=2/p.parquet",
            "t/x",
        ]);
        let p = page(all.clone(), "t/", Some("/"), None, 1000);
        assert_eq!(p.prefixes, ["t/_delta_log/", "t/a=1/", "t/a=2/"]);
        assert_eq!(names(&p), ["t/x"]);
        assert!(p.next.is_none());

        // Two per page: every entry exactly once across the pages.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let p = page(all.clone(), "t/", Some("/"), after.as_deref(), 2);
            seen.extend(p.prefixes.iter().cloned());
            seen.extend(names(&p));
            match p.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, ["t/_delta_log/", "t/a=1/", "t/a=2/", "t/x"]);
    }

    #[test]
    fn without_a_delimiter_every_key_is_listed_in_byte_order() {
        let all = keys(&["a/b", "a-c", "a/a", "é"]);
        let p = page(all, "", None, None, 1000);
        assert_eq!(names(&p), ["a-c", "a/a", "a/b", "é"]);
    }

    #[test]
    fn the_walk_finds_files_under_the_prefix_only() {
        let root = std::env::temp_dir().join(format!("dev-s3-list-{:x}", rand::random::<u64>()));
        for f in ["t/_delta_log/0.json", "t/a=1/p.parquet", "tt/q", "u"] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        let found: Vec<_> = objects_under(&root, "t/")
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(found, ["t/_delta_log/0.json", "t/a=1/p.parquet"]);
        let found: Vec<_> = objects_under(&root, "t")
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(found, ["t/_delta_log/0.json", "t/a=1/p.parquet", "tt/q"]);
        assert!(objects_under(&root, "nope/").unwrap().is_empty());
        let _ = std::fs::remove_dir_all(root);
    }
}
