//! Reading a libpq-style DSN: the TLS parameters wal2delta handles itself, the rest for
//! tokio-postgres (which knows neither `verify-ca`/`verify-full` nor the certificate
//! parameters).
//!
//! Both forms libpq accepts: `postgres://user@host:port/db?sslmode=verify-full&...` and
//! `host=... sslmode=verify-full sslrootcert='/path/ca.pem'`. The parser never panics on
//! any input; values are never echoed in errors (a DSN may carry a password).

use std::path::PathBuf;

use crate::tls::{RootCert, SslMode, TlsSettings};
use crate::CdcError;

/// libpq TLS parameters wal2delta does not implement; named in the error instead of
/// tokio-postgres's "unknown option".
const UNSUPPORTED: &[&str] = &[
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslcertmode",
    "sslcompression",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "requiressl",
    "gssencmode",
];

/// A DSN split in two: the TLS settings, and the DSN without them.
#[derive(Debug)]
pub struct SplitDsn {
    pub tls: TlsSettings,
    /// The same DSN without the TLS parameters, in its original form.
    pub rest: String,
}

/// Splits the TLS parameters out of a DSN.
pub fn split(dsn: &str) -> Result<SplitDsn, CdcError> {
    let trimmed = dsn.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        split_url(trimmed)
    } else {
        split_key_value(trimmed)
    }
}

/// The DSN with `password` added (for a password read from a file), in its own form.
pub fn with_password(dsn: &str, password: &str) -> String {
    let trimmed = dsn.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let sep = if trimmed.contains('?') { '&' } else { '?' };
        format!("{trimmed}{sep}password={}", percent_encode(password))
    } else {
        format!("{trimmed} password={}", quote(password))
    }
}

fn take(tls: &mut TlsSettings, key: &str, value: &str) -> Result<bool, CdcError> {
    match key {
        "sslmode" => tls.mode = SslMode::parse(value)?,
        "sslrootcert" => {
            tls.root_cert = Some(match value {
                "system" => RootCert::System,
                path => RootCert::File(PathBuf::from(path)),
            })
        }
        "sslcert" => tls.client_cert = Some(PathBuf::from(value)),
        "sslkey" => tls.client_key = Some(PathBuf::from(value)),
        k if UNSUPPORTED.contains(&k) => {
            return Err(CdcError::Dsn(format!(
                "{k} is not supported; wal2delta reads sslmode, sslrootcert, sslcert and sslkey"
            )))
        }
        _ => return Ok(false),
    }
    Ok(true)
}

fn split_url(dsn: &str) -> Result<SplitDsn, CdcError> {
    let mut tls = TlsSettings::default();
    let Some((base, query)) = dsn.split_once('?') else {
        return Ok(SplitDsn {
            tls,
            rest: dsn.to_owned(),
        });
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key_text = percent_decode(key)?;
        let value_text = percent_decode(value)?;
        if !take(&mut tls, &key_text, &value_text)? {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(SplitDsn { tls, rest })
}

fn split_key_value(dsn: &str) -> Result<SplitDsn, CdcError> {
    let mut tls = TlsSettings::default();
    let mut kept = Vec::new();
    let mut chars = dsn.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(CdcError::Dsn(format!(
                "expected `=` after {key:?} in the key=value DSN"
            )));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(CdcError::Dsn(format!(
                    "the quoted value of {key:?} has no closing quote"
                )));
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if !take(&mut tls, &key, &value)? {
            kept.push(format!("{key}={}", quote(&value)));
        }
    }
    Ok(SplitDsn {
        tls,
        rest: kept.join(" "),
    })
}

fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn percent_decode(text: &str) -> Result<String, CdcError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| CdcError::Dsn("a bad %-escape in the DSN's parameters".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| CdcError::Dsn("a %-escape in the DSN's parameters is not UTF-8".into()))
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_form_keeps_the_rest_and_decodes_paths() {
        let s = split("postgres://u:p@h:5/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&options=-c%20x%3D1&sslcert=/c&sslkey=/k").unwrap();
        assert_eq!(s.tls.mode, SslMode::VerifyFull);
        assert_eq!(s.tls.root_cert, Some(RootCert::File("/tmp/ca.pem".into())));
        assert_eq!(s.tls.client_cert, Some("/c".into()));
        assert_eq!(s.tls.client_key, Some("/k".into()));
        assert_eq!(s.rest, "postgres://u:p@h:5/db?options=-c%20x%3D1");
        let plain = split("postgresql://u@h/db?sslmode=require").unwrap();
        assert_eq!(plain.rest, "postgresql://u@h/db");
        assert_eq!(plain.tls.mode, SslMode::Require);
    }

    #[test]
    fn key_value_form_handles_quotes_and_escapes() {
        let s = split(
            r"host=h  sslmode = verify-ca sslrootcert='/a b/c\'a.pem' password='x y\\z' user=u",
        )
        .unwrap();
        assert_eq!(s.tls.mode, SslMode::VerifyCa);
        assert_eq!(s.tls.root_cert, Some(RootCert::File("/a b/c'a.pem".into())));
        assert_eq!(s.rest, r"host='h' password='x y\\z' user='u'");
        let cfg: tokio_postgres::Config = s.rest.parse().unwrap();
        assert_eq!(cfg.get_password(), Some(&b"x y\\z"[..]));
        assert_eq!(
            split("sslrootcert=system").unwrap().tls.root_cert,
            Some(RootCert::System)
        );
    }

    #[test]
    fn defaults_to_prefer() {
        assert_eq!(split("host=h user=u").unwrap().tls.mode, SslMode::Prefer);
        assert_eq!(split("postgres://u@h/d").unwrap().tls.mode, SslMode::Prefer);
    }

    #[test]
    fn errors_name_the_parameter_never_the_password() {
        for dsn in [
            "host=h password=hunter2secret sslmode=bogus",
            "postgres://u:hunter2secret@h/d?sslmode=allow",
            "password=hunter2secret sslcrl=/x",
            "password='hunter2secret",
            "password=hunter2secret user",
            "postgres://u:hunter2secret@h/d?sslmode=%zz",
        ] {
            let e = split(dsn).unwrap_err().to_string();
            assert!(!e.contains("hunter2secret"), "{e}");
        }
        let e = split("sslmode=bogus").unwrap_err().to_string();
        assert!(e.contains("sslmode"), "{e}");
        let e = split("sslcrl=/x").unwrap_err().to_string();
        assert!(e.contains("sslcrl is not supported"), "{e}");
    }

    #[test]
    fn never_panics_on_odd_input() {
        for dsn in [
            "",
            "=",
            "'",
            "a='\\",
            "a=\\",
            "postgres://?",
            "postgres://?&&=&%",
            "postgres://?a=%",
            "postgres://?a=%f",
            "x = 'é\\",
        ] {
            let _ = split(dsn);
        }
    }

    #[test]
    fn password_is_added_in_the_dsn_form() {
        let url = with_password("postgres://u@h/d?sslmode=require", "p&w d");
        let cfg: tokio_postgres::Config = split(&url).unwrap().rest.parse().unwrap();
        assert_eq!(cfg.get_password(), Some(&b"p&w d"[..]));
        let kv = with_password("host=h user=u sslmode=verify-full", "it's");
        let s = split(&kv).unwrap();
        assert_eq!(s.tls.mode, SslMode::VerifyFull);
        let cfg: tokio_postgres::Config = s.rest.parse().unwrap();
        assert_eq!(cfg.get_password(), Some(&b"it's"[..]));
    }
}
