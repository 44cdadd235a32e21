//! The shard cache (`crate::remote`) for Python: `ferroloader.ShardCache`
//! opens and prefetches through it. Downloads run detached from the
//! interpreter.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{
    PyFileNotFoundError, PyOSError, PyPermissionError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyString;

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

/// One process's handle on a cache directory, with the objects' sizes it
/// has asked for and whether it warned of a budget below its leases.
#[pyclass(module = "ferroloader._core", frozen, name = "ShardCacheCore")]
pub struct PyCache {
    cache: Arc<Cache>,
    sizes: Mutex<HashMap<String, u64>>,
    warned_budget: AtomicBool,
    /// This process's counters file (`publish`), once opened.
    counters_file: Mutex<Option<std::fs::File>>,
}

/// A process's counters as `publish` writes them: fetched, downloads,
/// hits, misses (u64 each), seconds waited (f64), re-downloads (u64),
/// little-endian.
type Counters = (u64, u64, u64, u64, f64, u64);
const COUNTERS_LEN: usize = 48;

fn encode_counters(c: Counters) -> [u8; COUNTERS_LEN] {
    let mut out = [0u8; COUNTERS_LEN];
    let words = [c.0, c.1, c.2, c.3, c.4.to_bits(), c.5];
    for (chunk, w) in out.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    out
}

fn decode_counters(b: &[u8; COUNTERS_LEN]) -> Counters {
    let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    (w(0), w(1), w(2), w(3), f64::from_bits(w(4)), w(5))
}

/// A piece of a shard as a dataset names it: a URL (the whole object),
/// `(url, (start, end))` (bytes of it), or `None` (a local shard).
type Piece = (String, Option<(u64, u64)>);

fn piece(obj: &Bound<'_, PyAny>) -> PyResult<Option<Piece>> {
    if obj.is_none() {
        return Ok(None);
    }
    if let Ok(url) = obj.cast::<PyString>() {
        return Ok(Some((url.extract::<String>()?, None)));
    }
    let url: String = obj.get_item(0)?.extract()?;
    let span = obj.get_item(1)?;
    let (start, end): (u64, u64) = (span.get_item(0)?.extract()?, span.get_item(1)?.extract()?);
    if obj.len()? != 2 || span.len()? != 2 {
        return Err(PyTypeError::new_err(
            "a shard's piece is a URL or (url, (start, end))",
        ));
    }
    Ok(Some((url, Some((start, end)))))
}

/// The bytes the cache's objects take on disk now (not its locks, parts
/// being written by name, or dot-folders): room a new object may take back.
fn held_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.') && !name.ends_with(".lock")
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .map(|m| m.len())
        .sum()
}

/// `n` bytes as the shortest exact IEC size (`20GiB`), else bytes (as
/// `ShardCache`'s repr shows a budget).
fn show_bytes(n: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n % (1u64 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    format!("{n}B")
}

impl PyCache {
    /// `pieces` as datasets name them (repeats and local shards left out)
    /// and their sizes, after checking the cache can hold each.
    fn checked(&self, py: Python<'_>, pieces: &[Bound<'_, PyAny>]) -> PyResult<Vec<(Piece, u64)>> {
        let mut seen = HashSet::new();
        let mut wanted = Vec::new();
        for p in pieces {
            if let Some(p) = piece(p)? {
                if seen.insert(p.clone()) {
                    wanted.push(p);
                }
            }
        }
        let sizes = self.check(py, wanted.clone())?;
        Ok(wanted.into_iter().zip(sizes).collect())
    }

    /// A lease on the room the largest `readers` of `sized` take.
    fn room(
        &self,
        py: Python<'_>,
        sized: &[(Piece, u64)],
        readers: usize,
    ) -> PyResult<Option<PyLease>> {
        let mut sizes: Vec<u64> = sized.iter().map(|(_, n)| *n).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        self.lease(py, sizes.iter().take(readers).sum(), readers)
    }
}

#[pymethods]
impl PyCache {
    #[new]
    fn new(dir: PathBuf, budget: u64, options: Vec<(String, String)>) -> PyResult<Self> {
        let cache = Cache::new(dir, budget, options).map_err(to_py)?;
        Ok(PyCache {
            cache: Arc::new(cache),
            sizes: Mutex::new(HashMap::new()),
            warned_budget: AtomicBool::new(false),
            counters_file: Mutex::new(None),
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
            _lease: None,
        }
    }

    /// Starts fetching `pieces` in the order given (each a URL, `(url,
    /// (start, end))` or `None` for a local shard; repeats fetched once),
    /// after checking the cache can hold each: the handle, holding a lease
    /// on the room the largest `holders` of them take while it lives, or
    /// `None` when nothing is remote.
    fn fetch_ahead(
        &self,
        py: Python<'_>,
        pieces: Vec<Bound<'_, PyAny>>,
        holders: usize,
        streams: usize,
    ) -> PyResult<Option<PyPrefetch>> {
        let sized = self.checked(py, &pieces)?;
        if sized.is_empty() {
            return Ok(None);
        }
        let lease = self.room(py, &sized, holders)?;
        let items = {
            let known = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
            sized
                .into_iter()
                .map(|((url, range), _)| {
                    let size = known.get(&url).copied();
                    (url, range, size)
                })
                .collect()
        };
        Ok(Some(PyPrefetch {
            inner: Mutex::new(Some(self.cache.prefetch(items, streams))),
            _lease: lease,
        }))
    }

    /// A lease on the room the largest `readers` of `pieces` take (each as
    /// `fetch_ahead` takes them), after checking the cache can hold each;
    /// `None` for nothing remote.
    fn claim_room(
        &self,
        py: Python<'_>,
        pieces: Vec<Bound<'_, PyAny>>,
        readers: usize,
    ) -> PyResult<Option<PyLease>> {
        let sized = self.checked(py, &pieces)?;
        self.room(py, &sized, readers)
    }

    /// A clear error now, rather than at the first read, when the cache
    /// cannot hold one of `pieces` (`(url, (start, end) or None)`): larger
    /// than the budget, or than the disk has free. Their sizes.
    fn check(&self, py: Python<'_>, pieces: Vec<Piece>) -> PyResult<Vec<u64>> {
        if pieces.is_empty() {
            return Ok(Vec::new());
        }
        let wholes: Vec<String> = pieces
            .iter()
            .filter(|(_, r)| r.is_none())
            .map(|(u, _)| u.clone())
            .collect();
        let whole = self.sizes(py, wholes)?;
        let mut whole = whole.into_iter();
        let sizes: Vec<u64> = pieces
            .iter()
            .map(|(_, r)| match r {
                Some((start, end)) => end.saturating_sub(*start),
                None => whole.next().unwrap_or(0),
            })
            .collect();
        let (size, url) = sizes
            .iter()
            .zip(pieces.iter().map(|(u, _)| u))
            .max()
            .expect("pieces is not empty");
        let budget = self.cache.budget();
        if *size > budget {
            return Err(Class::Config.err(format!(
                "the shard cache budget ({budget} bytes) is below one shard: {url} is {size} \
                 bytes; raise ShardCache(budget=...)"
            )));
        }
        let dir = self.cache.dir();
        let free = std::fs::create_dir_all(dir)
            .and_then(|()| rustix::fs::statvfs(dir).map_err(std::io::Error::from))
            .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        if *size > free.saturating_add(held_bytes(dir)) {
            return Err(PyOSError::new_err((
                28,
                format!(
                    "the shard cache's disk ({}) has {free} bytes free, less than one shard \
                     ({url}: {size} bytes)",
                    dir.display()
                ),
            )));
        }
        Ok(sizes)
    }

    /// Writes this process's counters where `published` reads them: one
    /// positioned write into a file of its own in `dir` (a few
    /// microseconds, so it runs after every shard). Best effort: a counter
    /// that cannot be written is not worth a failed read.
    fn publish(&self, dir: PathBuf) {
        use std::os::unix::fs::FileExt;
        let mut file = self.counters_file.lock().unwrap_or_else(|p| p.into_inner());
        if file.is_none() {
            let opened = std::fs::create_dir_all(&dir).and_then(|()| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(dir.join(std::process::id().to_string()))
            });
            *file = opened.ok();
        }
        if let Some(f) = file.as_ref() {
            let _ = f.write_at(&encode_counters(self.counters()), 0);
        }
    }

    /// The counters every process published in `dir`, summed.
    #[staticmethod]
    fn published(dir: PathBuf) -> Counters {
        use std::io::Read;
        let mut sum: Counters = (0, 0, 0, 0, 0.0, 0);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return sum;
        };
        for entry in entries.flatten() {
            let mut b = [0u8; COUNTERS_LEN];
            let read = std::fs::File::open(entry.path()).and_then(|mut f| f.read_exact(&mut b));
            if read.is_ok() {
                let c = decode_counters(&b);
                sum = (
                    sum.0 + c.0,
                    sum.1 + c.1,
                    sum.2 + c.2,
                    sum.3 + c.3,
                    sum.4 + c.4,
                    sum.5 + c.5,
                );
            }
        }
        sum
    }

    /// `(bytes fetched, downloads, hits, misses, seconds waited,
    /// re-downloads)` of this process.
    fn counters(&self) -> Counters {
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

    /// Claims `hold` bytes of room for what a loader's `readers` keep
    /// open between batches, until the lease is released (or collected);
    /// `None` for nothing. A budget below `hold` warns once
    /// (`CacheBudgetWarning`): every reader then opens its shard again
    /// after each batch, and downloads it again if evicted.
    fn lease(&self, py: Python<'_>, hold: u64, readers: usize) -> PyResult<Option<PyLease>> {
        if hold == 0 {
            return Ok(None);
        }
        let budget = self.cache.budget();
        if hold > budget && !self.warned_budget.swap(true, Ordering::Relaxed) {
            let category = py
                .import("ferroloader.errors")?
                .getattr("CacheBudgetWarning")?;
            let s = if readers != 1 { "s" } else { "" };
            let msg = format!(
                "ShardCache budget {} is below what the loader's {readers} reader{s} keep open \
                 between batches (their largest shards: {}): each reader lets go of its shard \
                 after every batch and opens it again, downloading it again once it was evicted \
                 (stats().remote.redownloads counts them). Give ShardCache(budget=...) at least \
                 {}, or fewer readers (Sharding(lanes=...), num_workers)",
                show_bytes(budget),
                show_bytes(hold),
                show_bytes(hold)
            );
            PyErr::warn(py, &category, &std::ffi::CString::new(msg)?, 1)?;
        }
        let lease = self.cache.lease(hold).map_err(to_py)?;
        Ok(Some(PyLease {
            inner: Mutex::new(Some(lease)),
        }))
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

    /// The sizes of the objects at `urls` (HEAD requests, 32 at once),
    /// remembered by this handle.
    fn sizes(&self, py: Python<'_>, urls: Vec<String>) -> PyResult<Vec<u64>> {
        let mut missing: Vec<String> = {
            let known = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
            urls.iter()
                .filter(|u| !known.contains_key(*u))
                .cloned()
                .collect()
        };
        let mut seen = HashSet::new();
        missing.retain(|u| seen.insert(u.clone()));
        if !missing.is_empty() {
            let options = self.cache.options().to_vec();
            let got = py
                .detach(|| crate::remote::store::Object::sizes(&missing, &options))
                .map_err(to_py)?;
            let mut known = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
            known.extend(missing.into_iter().zip(got));
        }
        let known = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        Ok(urls.iter().map(|u| known[u]).collect())
    }

    /// The size remembered for `url`, if any was asked.
    fn known_size(&self, url: &str) -> Option<u64> {
        self.sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(url)
            .copied()
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

/// A prefetch under way; `stop()` (or dropping it) ends it. One made by
/// `fetch_ahead` holds the loader's lease on the cache's room until it is
/// dropped.
#[pyclass(module = "ferroloader._core", frozen, name = "ShardPrefetch")]
pub struct PyPrefetch {
    inner: Mutex<Option<Prefetch>>,
    _lease: Option<PyLease>,
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
