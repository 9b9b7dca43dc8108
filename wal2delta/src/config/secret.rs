//! Secret keys and passwords, read from the environment or from files (never from the
//! config file itself).

use std::path::Path;

use super::{invalid, ConfigError};

/// Reads a secret key from the environment variable `{section}.key_env` names or the file
/// `{section}.key_file` names (exactly one; at least 16 bytes; one trailing newline of a
/// file is ignored). Keys never live in the config file itself.
pub(super) fn load_key(
    section: &str,
    env: Option<&str>,
    file: Option<&Path>,
) -> Result<Vec<u8>, ConfigError> {
    const MIN_KEY_BYTES: usize = 16;
    let (field, key) = match (env, file) {
        (Some(var), None) => {
            let field = format!("{section}.key_env");
            let key = std::env::var(var)
                .map_err(|_| invalid(&field, format!("names {var:?}, which is not set")))?
                .into_bytes();
            (field, key)
        }
        (None, Some(path)) => {
            let field = format!("{section}.key_file");
            let mut bytes = read_small_file(path, &field)?;
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            (field, bytes)
        }
        _ => {
            return Err(invalid(
                section,
                "needs exactly one of key_env or key_file when columns are listed",
            ))
        }
    };
    if key.len() < MIN_KEY_BYTES {
        return Err(invalid(
            &field,
            format!("key must be at least {MIN_KEY_BYTES} bytes"),
        ));
    }
    Ok(key)
}

/// Reads a password from the environment variable `env` names or the first line of
/// `file` (at most one of them; `None` when neither is set). `field` is the key's name
/// without its `_env`/`_file` suffix.
pub(super) fn load_password(
    field: &str,
    env: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, ConfigError> {
    match (env, file) {
        (None, None) => Ok(None),
        (Some(var), None) => std::env::var(var).map(Some).map_err(|_| {
            invalid(
                &format!("{field}_env"),
                format!("names {var:?}, which is not set"),
            )
        }),
        (None, Some(path)) => {
            let f = format!("{field}_file");
            let bytes = read_small_file(path, &f)?;
            let text = String::from_utf8(bytes)
                .map_err(|_| invalid(&f, format!("{} is not UTF-8", path.display())))?;
            Ok(Some(text.lines().next().unwrap_or("").to_owned()))
        }
        (Some(_), Some(_)) => Err(invalid(
            &format!("{field}_env"),
            format!("and {field}_file are exclusive: set one"),
        )),
    }
}

/// The most a key or password file may hold. Keys and passwords are short; the bound
/// keeps a config naming the wrong file (a log, a device such as `/dev/zero`) from
/// reading without end.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// Reads a key or password file of at most [`MAX_SECRET_FILE_BYTES`] bytes.
pub(super) fn read_small_file(path: &Path, field: &str) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    let cannot =
        |e: std::io::Error| invalid(field, format!("cannot be read ({}): {e}", path.display()));
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(invalid(
            field,
            format!(
                "names {}, which holds more than {MAX_SECRET_FILE_BYTES} bytes: name the file that holds only the secret",
                path.display()
            ),
        ));
    }
    Ok(bytes)
}
