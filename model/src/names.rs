//! How source names become names outside PostgreSQL: one-to-one (docs/architecture.md, interfaces).
//!
//! Kafka topics allow `[a-zA-Z0-9._-]` (at most 249 characters), Avro names
//! `[A-Za-z_][A-Za-z0-9_]*`, and lake paths must be one safe segment per part on
//! filesystems that may ignore case. A replacing sanitiser (every other character becomes
//! `_`) maps `"a b"` and `a_b` to one topic and one lake table, whose rows then merge by
//! key, and a count made under one spelling is looked up under the other. So every name is
//! *escaped*, never replaced:
//!
//! - **Identity** ([`ident_part`]; topics, registry subjects, lake paths, END records):
//!   `[a-z0-9_]` stay as they are; every other byte of the UTF-8 name, capitals included
//!   (`"Orders"` and `orders` must differ on a case-insensitive filesystem), becomes `-`
//!   and two lowercase hex digits; `-` itself becomes `-2d`. `"Order Items"` →
//!   `-4frder-20-49tems`. A part longer than [`MAX_IDENT_PART`] keeps its escaped head and
//!   ends in `--` and 16 hex digits of its SHA-256: `--` never occurs in a plain escape, so
//!   shortened and plain parts never meet, and two shortened parts meet only when their
//!   head and 64-bit hash both do.
//! - **Avro** ([`avro_part`]; the namespace of a table's schemas): the same escape with
//!   `Z` for `-` (capitals are escaped, so a bare `Z` never occurs otherwise), and `_` put
//!   in front of a part starting with a digit, with `_`s and then a digit, or made of `_`s
//!   only — so `1st` → `_1st` as before, and `_1st` → `__1st`.
//!
//! Names made only of `[a-z0-9_]` keep the names earlier releases gave them.

use sha2::{Digest, Sha256};

/// Longest identity part: a topic `{prefix}.{schema}.{table}` then fits Kafka's 249
/// characters for any prefix of up to [`MAX_TOPIC_PREFIX`] characters, and a lake path
/// segment stays far below filesystems' 255 bytes.
pub const MAX_IDENT_PART: usize = 100;

/// Longest `[kafka] topic_prefix` with which every table topic fits Kafka's limit.
pub const MAX_TOPIC_PREFIX: usize = 249 - 2 - 2 * MAX_IDENT_PART;

/// Hex digits of the hash ending a shortened identity part.
const HASH_HEX: usize = 16;

/// Whether a byte stays as it is in every mapping.
fn kept(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
}

fn escape_with(raw: &str, escape: char) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if kept(b) {
            out.push(char::from(b));
        } else {
            out.push(escape);
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

fn unescape_with(s: &str, escape: u8) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == escape {
            let hex = s.get(i + 1..i + 3)?;
            if !hex
                .bytes()
                .all(|h| h.is_ascii_digit() || (b'a'..=b'f').contains(&h))
            {
                return None;
            }
            let v = u8::from_str_radix(hex, 16).ok()?;
            if kept(v) {
                return None; // never escaped: not the image of any name
            }
            out.push(v);
            i += 3;
        } else if kept(b) {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// The identity of one part of a table name (schema or table): its topic part, registry
/// subject part, lake path segment and END-record spelling.
pub fn ident_part(raw: &str) -> String {
    let escaped = escape_with(raw, '-');
    if escaped.len() <= MAX_IDENT_PART {
        return escaped;
    }
    // The head ends between characters, so it still reads as (the start of) a name.
    let budget = MAX_IDENT_PART - 2 - HASH_HEX;
    let mut head = String::with_capacity(budget);
    for c in raw.chars() {
        let e = escape_with(c.encode_utf8(&mut [0; 4]), '-');
        if head.len() + e.len() > budget {
            break;
        }
        head.push_str(&e);
    }
    let hash = Sha256::digest(raw.as_bytes());
    let hex: String = hash
        .iter()
        .take(HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{head}--{hex}")
}

/// The name an identity part stands for; `None` for a shortened part (its tail is a hash)
/// or a string that is no identity.
pub fn name_of_ident_part(ident: &str) -> Option<String> {
    if ident.contains("--") {
        return None;
    }
    unescape_with(ident, b'-')
}

/// A valid Avro name standing for one part of a table name, distinct for distinct parts.
pub fn avro_part(raw: &str) -> String {
    let escaped = escape_with(raw, 'Z');
    let rest = escaped.trim_start_matches('_');
    if rest.is_empty() || rest.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn avro_valid(s: &str) -> bool {
        s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    }

    /// Every string of up to three characters over an alphabet of the troublemakers.
    fn tricky_names() -> Vec<String> {
        let alphabet = [
            "a", "b", "A", "Z", "z", "_", "-", ".", " ", "1", "é", "e", "\"", "%",
        ];
        let mut names = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..3 {
            let next: Vec<String> = last
                .iter()
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            names.extend(next.iter().cloned());
            last = next;
        }
        names
    }

    #[test]
    fn ordinary_names_keep_their_names() {
        for n in ["transactions", "order_items", "t1", "_x", "public"] {
            assert_eq!(ident_part(n), n);
            assert_eq!(avro_part(n), n);
        }
        assert_eq!(avro_part("1st"), "_1st");
        assert_eq!(ident_part("Order Items"), "-4frder-20-49tems");
        assert_eq!(avro_part("Order Items"), "Z4frderZ20Z49tems");
        assert_eq!(ident_part("a-b"), "a-2db");
        assert_eq!(ident_part("é"), "-c3-a9");
    }

    #[test]
    fn the_mappings_are_one_to_one_on_tricky_names() {
        let names = tricky_names();
        let mut idents: HashMap<String, &str> = HashMap::new();
        let mut avros: HashMap<String, &str> = HashMap::new();
        for n in &names {
            let i = ident_part(n);
            assert!(
                i.bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'_'
                    || b == b'-'),
                "{n:?} → {i:?}"
            );
            assert_eq!(name_of_ident_part(&i).as_deref(), Some(n.as_str()));
            if let Some(other) = idents.insert(i.clone(), n) {
                panic!("{other:?} and {n:?} share the identity {i:?}");
            }
            let a = avro_part(n);
            assert!(avro_valid(&a), "{n:?} → {a:?}");
            if let Some(other) = avros.insert(a.clone(), n) {
                panic!("{other:?} and {n:?} share the Avro name {a:?}");
            }
        }
    }

    #[test]
    fn schema_and_table_never_run_together() {
        // `"a.b".c` and `a."b.c"`: a dot inside a part is escaped, so the parts joined by
        // `.` stay apart.
        let join = |s: &str, t: &str| format!("{}.{}", ident_part(s), ident_part(t));
        assert_ne!(join("a.b", "c"), join("a", "b.c"));
        assert_ne!(join("a", "b"), join("a.b", ""));
        assert_eq!(join("a.b", "c"), "a-2eb.c");
    }

    #[test]
    fn long_names_are_shortened_and_stay_distinct() {
        let long_a = "A".repeat(63);
        let long_b = format!("{}B", "A".repeat(62));
        let i_a = ident_part(&long_a);
        let i_b = ident_part(&long_b);
        assert!(i_a.len() <= MAX_IDENT_PART && i_b.len() <= MAX_IDENT_PART);
        assert_ne!(i_a, i_b);
        assert!(i_a.contains("--"));
        assert_eq!(name_of_ident_part(&i_a), None);
        // A plain name whose escape fits is never shortened, and cannot look shortened.
        let fits = "a".repeat(MAX_IDENT_PART);
        assert_eq!(ident_part(&fits), fits);
        // Names up to PostgreSQL's 63 bytes that need at most a third escaped fit whole.
        let mixed = format!("{}{}", "Ab".repeat(12), "x".repeat(39));
        assert_eq!(name_of_ident_part(&ident_part(&mixed)), Some(mixed));
        // The head is cut between characters.
        for n in 40..64 {
            let s = format!("{}{}", "q".repeat(n % 7), "É".repeat(n / 2));
            let i = ident_part(&s);
            let head = i.split("--").next().unwrap();
            assert!(unescape_with(head, b'-').is_some(), "{i}");
        }
        const _: () = assert!(MAX_TOPIC_PREFIX >= 40);
    }
}
