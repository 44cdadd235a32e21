//! Shards where they live: URLs (`s3://`, `gs://`, `az://`, `http(s)://`,
//! `file://`) read through the `object_store` crate, without Python, into a
//! local disk cache that every process on the machine shares ([`cache`]).
//!
//! [`store`] turns a URL into a store and a path (credentials and endpoints
//! from each store's standard environment, plus options the user passes)
//! and downloads an object into a file: resumed with a ranged GET where a
//! transfer breaks off, retried with backoff on transient errors, a
//! permanent one (missing, denied) an error naming the URL.

pub mod cache;
pub mod store;

pub use cache::{Cache, Counters, Pinned, Prefetch};
pub use store::RemoteError;

/// Whether `path` is a URL a store reads (anything else is a local path).
pub fn is_url(path: &str) -> bool {
    const SCHEMES: [&str; 11] = [
        "s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "azure://", "adl://",
        "http://", "https://", "file://",
    ];
    SCHEMES
        .iter()
        .any(|s| path.len() > s.len() && path[..s.len()].eq_ignore_ascii_case(s))
}

#[cfg(test)]
mod tests {
    use super::is_url;

    #[test]
    fn urls_and_paths() {
        assert!(is_url("s3://bucket/a.tar"));
        assert!(is_url("HTTPS://host/x"));
        assert!(is_url("file:///tmp/x"));
        assert!(!is_url("/tmp/s3://x"));
        assert!(!is_url("relative/path"));
        assert!(!is_url("s3://"));
    }
}
