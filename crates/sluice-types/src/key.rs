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

    #[test]
    fn covers_on_segment_boundary() {
        assert!(path_covers("/a", "/a"));
        assert!(path_covers("/a", "/a/b"));
        assert!(!path_covers("/a", "/ab"));
        assert!(!path_covers("/a/b", "/a"));
    }
}
