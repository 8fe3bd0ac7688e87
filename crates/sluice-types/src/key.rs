//! Key validation: `/`-separated paths such as `/pool/sub/key`.

use crate::error::{Result, SluiceError};

/// Checks that `key` is an absolute `/`-separated path with non-empty
/// segments, no control characters and at most `max_bytes` bytes.
pub fn validate_key(key: &str, max_bytes: usize) -> Result<()> {
    if key.is_empty() {
        return Err(SluiceError::invalid_key(key, "key is empty"));
    }
    if key.len() > max_bytes {
        return Err(SluiceError::invalid_key(
            &truncate_for_message(key),
            format!("key is {} bytes, the limit is {max_bytes}", key.len()),
        ));
    }
    if !key.starts_with('/') {
        return Err(SluiceError::invalid_key(
            key,
            "keys are absolute paths and must start with '/' (e.g. /vol/a)",
        ));
    }
    if key.len() > 1 && key.ends_with('/') {
        return Err(SluiceError::invalid_key(key, "key must not end with '/'"));
    }
    if key == "/" {
        return Err(SluiceError::invalid_key(key, "key has no segments"));
    }
    if key[1..].split('/').any(str::is_empty) {
        return Err(SluiceError::invalid_key(
            key,
            "key has an empty segment ('//')",
        ));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(SluiceError::invalid_key(
            key,
            format!("key contains control character {c:?}"),
        ));
    }
    Ok(())
}

/// Checks a watch's prefix: a key (`/vol/w` watches `/vol/w`, `/vol/w1`,
/// `/vol/w/a`), or a key and a final '/' for the keys below it only
/// (`/vol/w/`: `/vol/w/a`, not `/vol/w1`), or `/` for every key.
pub fn validate_prefix(prefix: &str, max_bytes: usize) -> Result<()> {
    if prefix == "/" {
        return Ok(());
    }
    match prefix.strip_suffix('/') {
        Some(key) if key.len() > 1 => validate_key(key, max_bytes).map_err(|e| match e {
            SluiceError::InvalidKey { reason, .. } => SluiceError::invalid_key(prefix, reason),
            other => other,
        }),
        _ => validate_key(prefix, max_bytes),
    }
}

/// True when `path` is `prefix` itself or lies below it on a segment
/// boundary: `/a` covers `/a` and `/a/b` but not `/ab`.
pub fn path_covers(prefix: &str, path: &str) -> bool {
    path.starts_with(prefix)
        && (path.len() == prefix.len() || path.as_bytes()[prefix.len()] == b'/')
}

fn truncate_for_message(key: &str) -> String {
    let mut end = 64.min(key.len());
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &key[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_paths() {
        for k in ["/a", "/vol/a", "/vol/sub/key_1.bin", "/ünïcode/ok"] {
            validate_key(k, 1024).unwrap();
        }
    }

    #[test]
    fn rejects_bad_paths_with_reason() {
        let cases = [
            ("", "empty"),
            ("a/b", "start with '/'"),
            ("/", "no segments"),
            ("/a//b", "empty segment"),
            ("/a/", "end with '/'"),
            ("/a\nb", "control character"),
        ];
        for (k, why) in cases {
            let e = validate_key(k, 1024).unwrap_err();
            assert!(e.to_string().contains(why), "{k:?}: {e}");
        }
        let long = format!("/{}", "x".repeat(2000));
        let e = validate_key(&long, 1024).unwrap_err();
        assert!(e.to_string().contains("the limit is 1024"), "{e}");
    }

    /// A watch on `/vol/` (the README's and the Python docstring's own
    /// example) was refused: "key must not end with '/'".
    #[test]
    fn prefixes_may_end_with_a_slash() {
        for p in ["/", "/vol", "/vol/", "/vol/w", "/vol/sub/"] {
            validate_prefix(p, 1024).unwrap();
        }
        for (p, why) in [
            ("//", "end with '/'"),
            ("/a//", "end with '/'"),
            ("vol/", "start with '/'"),
        ] {
            let e = validate_prefix(p, 1024).unwrap_err();
            assert!(e.to_string().contains(why), "{p:?}: {e}");
            assert!(e.to_string().contains(&format!("{p:?}")), "{p:?}: {e}");
        }
    }

    #[test]
    fn covers_on_segment_boundary() {
        assert!(path_covers("/a", "/a"));
        assert!(path_covers("/a", "/a/b"));
        assert!(!path_covers("/a", "/ab"));
        assert!(!path_covers("/a/b", "/a"));
    }
}
