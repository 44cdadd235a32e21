//! The shard cache (`crate::remote`) for Python: `ferroloader.ShardCache`
//! opens and prefetches through it. Downloads run detached from the
//! interpreter.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyPermissionError, PyValueError};
use pyo3::prelude::*;

use super::error::Class;
use crate::remote::cache::Lease;
use crate::remote::{Cache, Pinned, Prefetch, RemoteError};

fn to_py(e: RemoteError) -> PyErr {
    let msg = e.to_string();
    match e {
        RemoteError::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        RemoteError::Denied { .. } => PyPermissionError::new_err(msg),
        RemoteError::BadUrl { .. } => PyValueError::new_err(msg),
        RemoteError::Budget { .. } | RemoteError::NoRoom { .. } => Class::Config.err(msg),
        RemoteError::Disk { source, .. } => match source.raw_os_error() {
            Some(code) => PyOSError::new_err((code, msg)),
            None => PyOSError::new_err(msg),
        },
        RemoteError::Changed { .. } | RemoteError::Failed { .. } | RemoteError::Aborted => {
            PyOSError::new_err(msg)
        }
    }
}

/// One process's handle on a cache directory.
#[pyclass(module = "ferroloader._core", frozen, name = "ShardCacheCore")]
pub struct PyCache {
    cache: Arc<Cache>,
}

#[pymethods]
impl PyCache {
    #[new]
    fn new(dir: PathBuf, budget: u64, options: Vec<(String, String)>) -> PyResult<Self> {
        let cache = Cache::new(dir, budget, options).map_err(to_py)?;
        Ok(PyCache {
            cache: Arc::new(cache),
        })
    }

    /// The object at `url` (or bytes `start..end` of it), pinned in the
    /// cache until `release()`.
    #[pyo3(signature = (url, start=None, end=None))]
    fn open(
        &self,
        py: Python<'_>,
        url: &str,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<PyPinned> {
        let range = start.zip(end);
        let pinned = py
            .detach(|| self.cache.open_piece(url, range))
            .map_err(to_py)?;
        Ok(PyPinned {
            path: pinned.path.to_string_lossy().into_owned(),
            pin: Mutex::new(Some(pinned)),
        })
    }

    /// Fetches `items` in order on `streams` threads until done or
    /// dropped: each `(url, (start, end) or None, size or None)`, a size
    /// known saving a request.
    #[pyo3(signature = (items, streams=8))]
    fn prefetch(&self, items: Vec<crate::remote::cache::Item>, streams: usize) -> PyPrefetch {
        PyPrefetch {
            inner: Mutex::new(Some(self.cache.prefetch(items, streams))),
        }
    }

    /// `(bytes fetched, downloads, hits, misses, seconds waited,
    /// re-downloads)` of this process.
    fn counters(&self) -> (u64, u64, u64, u64, f64, u64) {
        let c = &self.cache.counters;
        (
            c.fetched.load(Ordering::Relaxed),
            c.downloads.load(Ordering::Relaxed),
            c.hits.load(Ordering::Relaxed),
            c.misses.load(Ordering::Relaxed),
            c.waited_ns.load(Ordering::Relaxed) as f64 / 1e9,
            c.redownloads.load(Ordering::Relaxed),
        )
    }

    /// Claims `bytes` of room for a loader's readers' pins between
    /// batches, until the lease is released (or collected).
    fn lease(&self, bytes: u64) -> PyResult<PyLease> {
        let lease = self.cache.lease(bytes).map_err(to_py)?;
        Ok(PyLease {
            inner: Mutex::new(Some(lease)),
        })
    }

    /// Whether the live leases claim more than the budget: readers then
    /// let go of their shards between batches.
    fn short_of_room(&self) -> bool {
        self.cache.short_of_room()
    }

    /// The bytes the live leases claim.
    fn leased(&self) -> u64 {
        self.cache.leased()
    }

    /// The sizes of the objects at `urls` (HEAD requests, 32 at once).
    fn sizes(&self, py: Python<'_>, urls: Vec<String>) -> PyResult<Vec<u64>> {
        let options = self.cache.options().to_vec();
        py.detach(|| crate::remote::store::Object::sizes(&urls, &options))
            .map_err(to_py)
    }
}

/// An object pinned in the cache.
#[pyclass(module = "ferroloader._core", frozen, name = "PinnedShard")]
pub struct PyPinned {
    #[pyo3(get)]
    path: String,
    pin: Mutex<Option<Pinned>>,
}

#[pymethods]
impl PyPinned {
    /// Lets the cache evict it again.
    fn release(&self) {
        self.pin.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// A loader's lease on the cache's room (`ShardCacheCore.lease`).
#[pyclass(module = "ferroloader._core", frozen, name = "CacheLease")]
pub struct PyLease {
    inner: Mutex<Option<Lease>>,
}

#[pymethods]
impl PyLease {
    fn release(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// A prefetch under way; `stop()` (or dropping it) ends it.
#[pyclass(module = "ferroloader._core", frozen, name = "ShardPrefetch")]
pub struct PyPrefetch {
    inner: Mutex<Option<Prefetch>>,
}

#[pymethods]
impl PyPrefetch {
    fn stop(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// Whether `path` is a URL the shard cache reads (`s3://`, `gs://`,
/// `az://`, `http(s)://`, `file://`).
#[pyfunction]
pub fn is_url(path: &str) -> bool {
    crate::remote::is_url(path)
}

/// Whether `key` is an option some store knows (see
/// `crate::remote::store::known_option`).
#[pyfunction]
pub fn store_option_known(key: &str) -> bool {
    crate::remote::store::known_option(key)
}
