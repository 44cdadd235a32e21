//! The shard cache: a directory of whole objects under a byte budget,
//! shared by every process on the machine (workers, ranks) through file
//! locks, so an object is downloaded once while it fits.
//!
//! Files in the directory, for an object whose key is `k` (a hash of its
//! URL and its file name):
//! - `k`: the object, complete. A reader holds a shared `flock` on it while
//!   it reads (a pin); eviction takes an exclusive one without waiting, so a
//!   pinned object is never evicted.
//! - `k.part`: a download in progress, its full size reserved.
//! - `k.lock`: held exclusively by the one process downloading `k`; another
//!   that wants `k` waits on it, then finds `k` there.
//! - `.index.lock`: held while space is reserved and objects evicted, so
//!   the objects and reservations never add up to more than the budget.
//!
//! - `.leases/<name>`: one per loader epoch reading from the cache, the
//!   bytes its readers may keep pinned between batches, `flock`ed by the
//!   loader while it lives. When the live leases add up to more than the
//!   budget the cache is *short of room*, and readers let go of their
//!   shards between batches (see [`Cache::short_of_room`]).
//!
//! An object's modification time orders eviction (oldest first). A reader
//! sets it to now; the prefetcher sets an object it fetched ahead of the
//! readers to a time far in the future (later positions nearer to now), so
//! the prefetcher itself never evicts what is still to be read this epoch,
//! and a reader short of room evicts what is needed last.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{flock, FlockOperation};

use super::store::{Object, Options, RemoteError, Result};

/// What this process's cache did (each process keeps its own).
#[derive(Default, Debug)]
pub struct Counters {
    /// Bytes downloaded.
    pub fetched: AtomicU64,
    /// Objects downloaded.
    pub downloads: AtomicU64,
    /// Opens that found the object cached.
    pub hits: AtomicU64,
    /// Opens that waited for a download (their own or another process's).
    pub misses: AtomicU64,
    /// Nanoseconds readers waited for objects to arrive.
    pub waited_ns: AtomicU64,
    /// Downloads of objects the cache had evicted before (a budget too
    /// small for what is read at once).
    pub redownloads: AtomicU64,
}

/// The cache in one directory with one budget.
pub struct Cache {
    dir: PathBuf,
    budget: u64,
    options: Options,
    pub counters: Arc<Counters>,
    /// How long a reader waits for room before `NoRoom`.
    room_wait: Duration,
    /// The last reading of the leases: the directory's modification time,
    /// when it was read, and whether they exceed the budget.
    leases_seen: Mutex<Option<(SystemTime, Instant, bool)>>,
}

/// A loader's claim on the room its readers may keep pinned between
/// batches (`.leases/<name>`, holding the bytes as text). Its lock lives
/// as long as it does, or as its process: a lease whose lock is free is
/// gone, and the next reading of the leases removes its file.
pub struct Lease {
    file: Locked,
    path: PathBuf,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // (the lock is released after this, by `Locked`'s drop)
        if self.file.pid == std::process::id() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// How long a reading of the leases is trusted while their directory is
/// unchanged (a lease whose process died changes nothing in it).
const LEASES_FRESH: Duration = Duration::from_secs(1);

/// An object in the cache, pinned while this lives.
pub struct Pinned {
    _file: Locked,
    pub path: PathBuf,
}

/// A file holding an `flock`, released by `LOCK_UN` when this is dropped in
/// the process that took it. The close alone would not release it while a
/// worker forked meanwhile keeps its copy of the descriptor, and that
/// worker would hold the lock for as long as it lived; `LOCK_UN` releases
/// it through any copy. A forked copy that is dropped only closes (it must
/// not release the parent's lock).
struct Locked {
    file: File,
    pid: u32,
}

impl Locked {
    fn new(file: File, op: FlockOperation) -> std::io::Result<Locked> {
        lock(&file, op)?;
        Ok(Locked {
            file,
            pid: std::process::id(),
        })
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            let _ = flock(&self.file, FlockOperation::Unlock);
        }
    }
}

/// A cached object: its file name, modification time and length.
type Entry = (String, SystemTime, u64);

/// Far enough ahead that no reader's "now" reaches it.
const AHEAD: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

fn disk(path: &Path) -> impl FnOnce(std::io::Error) -> RemoteError + '_ {
    move |source| RemoteError::Disk {
        path: path.to_path_buf(),
        source,
    }
}

/// A stable key for `url` (the same in every process and build): FNV-1a of
/// the URL, then its last path segment for people reading the directory.
pub fn key(url: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in url.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let tail: String = url
        .rsplit('/')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(80)
        .collect();
    format!("{h:016x}-{tail}")
}

/// The key of bytes `start..end` of `url`, or of the whole object.
pub fn piece_key(url: &str, range: Option<(u64, u64)>) -> String {
    match range {
        None => key(url),
        Some((start, end)) => format!("{}.{start}-{end}", key(url)),
    }
}

/// What the prefetcher fetches: a URL, the byte range of it (`None`: the
/// whole object) and the whole object's size when known.
pub type Item = (String, Option<(u64, u64)>, Option<u64>);

fn lock(file: &File, op: FlockOperation) -> std::io::Result<()> {
    flock(file, op).map_err(std::io::Error::from)
}

impl Cache {
    pub fn new(dir: impl Into<PathBuf>, budget: u64, options: Options) -> Result<Cache> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(disk(&dir))?;
        Ok(Cache {
            dir,
            budget,
            options,
            counters: Arc::default(),
            room_wait: Duration::from_secs(120),
            leases_seen: Mutex::new(None),
        })
    }

    fn leases_dir(&self) -> PathBuf {
        self.dir.join(".leases")
    }

    /// Claims `bytes` of room for the pins a loader's readers may keep
    /// between batches, until the lease is dropped.
    pub fn lease(&self, bytes: u64) -> Result<Lease> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = self.leases_dir();
        std::fs::create_dir_all(&dir).map_err(disk(&dir))?;
        let name = format!(
            "{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        );
        // written and locked under a name readings skip, then renamed into
        // place: a reading never finds a lease whose lock is not taken yet
        let tmp = dir.join(format!(".{name}"));
        std::fs::write(&tmp, bytes.to_string()).map_err(disk(&tmp))?;
        let file = OpenOptions::new()
            .read(true)
            .open(&tmp)
            .map_err(disk(&tmp))?;
        let file = Locked::new(file, FlockOperation::LockExclusive).map_err(disk(&tmp))?;
        let path = dir.join(name);
        std::fs::rename(&tmp, &path).map_err(disk(&path))?;
        Ok(Lease { file, path })
    }

    /// The bytes the live leases claim; the files of leases that are gone
    /// are removed.
    pub fn leased(&self) -> u64 {
        let dir = self.leases_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return 0;
        };
        let mut total: u64 = 0;
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(f) = File::open(e.path()) else {
                continue;
            };
            if flock(&f, FlockOperation::NonBlockingLockShared).is_ok() {
                // its loader is gone
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let bytes = std::fs::read_to_string(e.path()).unwrap_or_default();
            total = total.saturating_add(bytes.trim().parse().unwrap_or(0));
        }
        total
    }

    /// Whether the loaders reading from this cache claim more room for
    /// their readers' pins than the budget has: then each reader lets go of
    /// its shards between batches, so that only readers at work hold any
    /// and every budget of at least one shard makes progress. Cheap (one
    /// `stat`) while the leases are unchanged; it runs after each batch.
    pub fn short_of_room(&self) -> bool {
        let dir = self.leases_dir();
        let Ok(mtime) = std::fs::metadata(&dir).and_then(|m| m.modified()) else {
            return false;
        };
        let mut seen = self.leases_seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, when, short)) = *seen {
            if at == mtime && when.elapsed() < LEASES_FRESH {
                return short;
            }
        }
        let short = self.leased() > self.budget;
        // the reading may have removed a gone lease: read the time again
        let mtime = std::fs::metadata(&dir)
            .and_then(|m| m.modified())
            .unwrap_or(mtime);
        *seen = Some((mtime, Instant::now(), short));
        short
    }

    /// The same cache with a shorter wait for room (tests).
    #[cfg(test)]
    pub fn with_room_wait(mut self, wait: Duration) -> Cache {
        self.room_wait = wait;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The lock file `name`, held exclusively until dropped.
    fn lock_file(&self, name: &str) -> Result<Locked> {
        let p = self.path(name);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(disk(&p))?;
        Locked::new(file, FlockOperation::LockExclusive).map_err(disk(&self.dir))
    }

    /// `k` pinned, if it is there (not evicted between open and pin).
    fn try_pin(&self, k: &str) -> Result<Option<Pinned>> {
        let p = self.path(k);
        let file = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(disk(&p)(e)),
        };
        let file = Locked::new(file, FlockOperation::LockShared).map_err(disk(&p))?;
        if file.file.metadata().map_err(disk(&p))?.nlink() == 0 {
            return Ok(None); // evicted before the pin took
        }
        Ok(Some(Pinned {
            _file: file,
            path: p,
        }))
    }

    /// The object at `url`, pinned: from the cache, or downloaded now
    /// (waiting for another process's download of it, if one is under way).
    pub fn open(&self, url: &str) -> Result<Pinned> {
        self.open_piece(url, None)
    }

    /// Bytes `start..end` of the object at `url` (`None`: all of it), pinned:
    /// a part is kept as a file of its own, so formats read by ranges
    /// (Parquet row groups) fetch only what is read.
    pub fn open_piece(&self, url: &str, range: Option<(u64, u64)>) -> Result<Pinned> {
        let k = piece_key(url, range);
        if let Some(p) = self.try_pin(&k)? {
            touch(&p.path, SystemTime::now());
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(p);
        }
        let t0 = Instant::now();
        let out = (|| loop {
            let _guard = self.lock_file(&format!("{k}.lock"))?;
            if let Some(p) = self.try_pin(&k)? {
                touch(&p.path, SystemTime::now());
                return Ok(p);
            }
            if let Some(p) = self.fetch_locked(url, &k, range, None, None, &|| false)? {
                return Ok(p);
            }
        })();
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.counters
            .waited_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    /// Downloads `url` into `k` (the caller holds `k.lock`). A reader
    /// (`ahead == None`) gets it pinned and may wait for room; the
    /// prefetcher (`ahead == Some(position)`) gets `None` at once when there
    /// is no room without evicting what is still to be read.
    fn fetch_locked(
        &self,
        url: &str,
        k: &str,
        range: Option<(u64, u64)>,
        ahead: Option<u64>,
        known: Option<u64>,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Pinned>> {
        let obj = Object::open(url, &self.options)?;
        // a size known already saves a request (the GET checks it); a part
        // needs none
        let (object_size, etag) = match (range, known) {
            (Some(_), _) => (None, None),
            (None, Some(size)) => (Some(size), None),
            (None, None) => {
                let (size, etag) = obj.head()?;
                (Some(size), etag)
            }
        };
        let bytes = match range {
            Some((start, end)) => start..end.max(start),
            None => 0..object_size.unwrap_or(0),
        };
        let size = bytes.end - bytes.start;
        if size > self.budget {
            return Err(RemoteError::Budget {
                url: url.to_string(),
                size,
                budget: self.budget,
            });
        }
        let part_path = self.path(&format!("{k}.part"));
        let Some(part) = self.reserve(url, k, size, &part_path, ahead.is_some())? else {
            return Ok(None);
        };
        let written = obj.download(
            &part,
            object_size,
            bytes,
            etag.as_deref(),
            &self.counters.fetched,
            abort,
        );
        if let Err(e) = written {
            let _ = std::fs::remove_file(&part_path);
            return Err(e);
        }
        // pinned before it is visible: nothing can evict it between the
        // rename and the reader's open
        let pin = match ahead {
            None => Some(Locked::new(part, FlockOperation::LockShared).map_err(disk(&part_path))?),
            Some(_) => None,
        };
        let final_path = self.path(k);
        {
            // under the index lock: a scan that read `k.part` before the
            // rename could miss `k` after it, count neither, and reserve
            // past the budget
            let _index = self.lock_file(".index.lock")?;
            std::fs::rename(&part_path, &final_path).map_err(disk(&final_path))?;
        }
        self.counters.downloads.fetch_add(1, Ordering::Relaxed);
        if self.was_evicted(k) {
            self.counters.redownloads.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(pos) = ahead {
            touch(&final_path, ahead_time(pos));
            return Ok(None);
        }
        touch(&final_path, SystemTime::now());
        Ok(pin.map(|pin| Pinned {
            _file: pin,
            path: final_path,
        }))
    }

    /// Reserves `size` bytes as `part_path` (created at its full length),
    /// evicting unpinned objects oldest first; the prefetcher evicts only
    /// objects already read. `None`: no room for the prefetcher now.
    fn reserve(
        &self,
        url: &str,
        k: &str,
        size: u64,
        part_path: &Path,
        prefetching: bool,
    ) -> Result<Option<File>> {
        let start = Instant::now();
        let now = SystemTime::now();
        loop {
            let index = self.lock_file(".index.lock")?;
            let (mut used, mut objects) = self.scan(k)?;
            objects.sort_by_key(|o| o.1);
            for (name, mtime, len) in objects {
                if used + size <= self.budget {
                    break;
                }
                if prefetching && mtime > now {
                    break; // sorted: the rest are still to be read
                }
                let p = self.path(&name);
                let Ok(f) = File::open(&p) else { continue };
                if flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() {
                    std::fs::remove_file(&p).map_err(disk(&p))?;
                    used -= len;
                    self.mark_evicted(&name);
                }
            }
            if used + size <= self.budget {
                let part = OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .read(true)
                    .write(true)
                    .open(part_path)
                    .map_err(disk(part_path))?;
                part.set_len(size).map_err(disk(part_path))?;
                return Ok(Some(part));
            }
            drop(index);
            if prefetching {
                return Ok(None);
            }
            if start.elapsed() > self.room_wait {
                return Err(RemoteError::NoRoom {
                    url: url.to_string(),
                    size,
                    budget: self.budget,
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Bytes in use (objects and reservations) and the objects other than
    /// `k` as `(name, mtime, len)`. A reservation whose downloader is gone
    /// (its lock free) is removed.
    fn scan(&self, k: &str) -> Result<(u64, Vec<Entry>)> {
        let mut used = 0;
        let mut objects = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(disk(&self.dir))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name.ends_with(".lock") {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if let Some(owner) = name.strip_suffix(".part") {
                if owner != k && self.stale(owner) {
                    let _ = std::fs::remove_file(e.path());
                    continue;
                }
                used += meta.len();
                continue;
            }
            used += meta.len();
            if name != k {
                objects.push((
                    name,
                    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    meta.len(),
                ));
            }
        }
        Ok((used, objects))
    }

    /// Notes that object `name` was evicted (an empty file in
    /// `.evicted/`), so that downloading it again counts as a re-download.
    fn mark_evicted(&self, name: &str) {
        let dir = self.dir.join(".evicted");
        let _ = std::fs::create_dir_all(&dir);
        let _ = File::create(dir.join(name));
    }

    /// Whether `k` had been evicted before this download (the note goes).
    fn was_evicted(&self, k: &str) -> bool {
        std::fs::remove_file(self.dir.join(".evicted").join(k)).is_ok()
    }

    /// Whether `k.part` was left by a downloader that is gone.
    fn stale(&self, k: &str) -> bool {
        match File::open(self.path(&format!("{k}.lock"))) {
            Ok(f) => flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok(),
            Err(_) => true,
        }
    }

    /// Fetches `urls` in order on a thread of its own, ahead of the readers
    /// and within the budget, until done or dropped.
    /// `streams` threads take the objects in order, so that many downloads
    /// overlap their requests' latency.
    /// Each item a URL, its byte range (or the whole object) and the
    /// object's size when known (a request saved).
    pub fn prefetch(self: &Arc<Self>, urls: Vec<Item>, streams: usize) -> Prefetch {
        let control = Arc::new(Control::default());
        let urls = Arc::new(urls);
        let handles = (0..streams.max(1))
            .filter_map(|_| {
                let (cache, ctl, urls) = (self.clone(), control.clone(), urls.clone());
                std::thread::Builder::new()
                    .name("ferroloader-prefetch".into())
                    .spawn(move || cache.prefetch_all(&urls, &ctl))
                    .ok()
            })
            .collect();
        Prefetch {
            control,
            handles,
            pid: std::process::id(),
        }
    }

    /// One prefetching thread: takes the next object not yet taken until
    /// none is left.
    fn prefetch_all(&self, urls: &[Item], ctl: &Control) {
        loop {
            let pos = ctl.next.fetch_add(1, Ordering::SeqCst);
            let Some((url, range, size)) = urls.get(pos) else {
                return;
            };
            loop {
                if ctl.stop.load(Ordering::SeqCst) {
                    return;
                }
                let stop = || ctl.stop.load(Ordering::SeqCst);
                match self.prefetch_one(url, *range, *size, pos as u64, &stop) {
                    Ok(true) => break,
                    // no room yet: the readers free some as they go
                    Ok(false) => std::thread::sleep(Duration::from_millis(25)),
                    // stopped: the check above ends it; any other error the
                    // reader that needs the object meets itself
                    Err(RemoteError::Aborted) => {}
                    Err(_) => break,
                }
            }
        }
    }

    /// `Ok(false)`: no room for it now.
    fn prefetch_one(
        &self,
        url: &str,
        range: Option<(u64, u64)>,
        size: Option<u64>,
        pos: u64,
        abort: &dyn Fn() -> bool,
    ) -> Result<bool> {
        let k = piece_key(url, range);
        let p = self.path(&k);
        if p.exists() {
            touch(&p, ahead_time(pos)); // keep it for this epoch's reader
            return Ok(true);
        }
        let _guard = self.lock_file(&format!("{k}.lock"))?;
        if p.exists() {
            touch(&p, ahead_time(pos));
            return Ok(true);
        }
        let budget_before = self.counters.downloads.load(Ordering::Relaxed);
        self.fetch_locked(url, &k, range, Some(pos), size, abort)?;
        Ok(self.counters.downloads.load(Ordering::Relaxed) > budget_before)
    }
}

fn ahead_time(pos: u64) -> SystemTime {
    SystemTime::now() + AHEAD - Duration::from_secs(pos.min(1 << 20))
}

fn touch(path: &Path, when: SystemTime) {
    // best effort: the time only orders eviction
    if let Ok(f) = File::options().write(true).open(path) {
        let _ = f.set_modified(when);
    }
}

/// How the prefetcher is steered, with atomics only (a forked child may
/// drop its copy of a handle; it must find no lock held by a thread that
/// is not there).
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    /// The position of the next object to take.
    next: AtomicUsize,
}

/// A prefetch under way; dropping it stops it (a download under way is
/// given up). Workers may be forked while it runs: the cache's locks are
/// released by `LOCK_UN` (`Locked`), so a forked copy of a descriptor
/// holds none of them.
pub struct Prefetch {
    control: Arc<Control>,
    // detached when dropped; joined only by tests
    handles: Vec<std::thread::JoinHandle<()>>,
    // the process whose threads these are
    pid: u32,
}

impl Prefetch {
    /// Waits for it to finish (tests).
    #[cfg(test)]
    pub fn join(mut self) {
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::SeqCst);
        if self.pid != std::process::id() {
            // a forked child's copy (collected with the parent's objects):
            // its threads are not in this process, and detaching them
            // would touch thread records that are not either
            std::mem::forget(std::mem::take(&mut self.handles));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects(n: usize, size: usize) -> (tempdir::Dirs, Vec<String>) {
        let dirs = tempdir::Dirs::new();
        let urls = (0..n)
            .map(|i| {
                let p = dirs.src.join(format!("shard-{i}.bin"));
                std::fs::write(&p, vec![i as u8; size]).unwrap();
                format!("file://{}", p.display())
            })
            .collect();
        (dirs, urls)
    }

    mod tempdir {
        use std::path::PathBuf;
        pub struct Dirs {
            pub src: PathBuf,
            pub cache: PathBuf,
        }
        impl Dirs {
            pub fn new() -> Dirs {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let root = std::env::temp_dir()
                    .join(format!("ferroloader-cache-test-{}-{n}", std::process::id()));
                let _ = std::fs::remove_dir_all(&root);
                let d = Dirs {
                    src: root.join("src"),
                    cache: root.join("cache"),
                };
                std::fs::create_dir_all(&d.src).unwrap();
                d
            }
        }
        impl Drop for Dirs {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(self.src.parent().unwrap());
            }
        }
    }

    fn cached_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn open_downloads_once_then_hits() {
        let (d, urls) = objects(2, 1000);
        let c = Cache::new(&d.cache, 10_000, vec![]).unwrap();
        let a = c.open(&urls[0]).unwrap();
        assert_eq!(std::fs::read(&a.path).unwrap(), vec![0u8; 1000]);
        drop(a);
        let _b = c.open(&urls[0]).unwrap();
        assert_eq!(c.counters.downloads.load(Ordering::Relaxed), 1);
        assert_eq!(c.counters.hits.load(Ordering::Relaxed), 1);
        assert_eq!(c.counters.fetched.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn eviction_keeps_the_budget_and_spares_pinned_objects() {
        let (d, urls) = objects(6, 1000);
        let c = Cache::new(&d.cache, 2500, vec![])
            .unwrap()
            .with_room_wait(Duration::from_millis(200));
        let pinned = c.open(&urls[0]).unwrap();
        for u in &urls[1..] {
            drop(c.open(u).unwrap());
            assert!(cached_bytes(&d.cache) <= 2500);
        }
        // the pinned object survived every eviction
        assert_eq!(std::fs::read(&pinned.path).unwrap(), vec![0u8; 1000]);
        let p2 = c.open(&urls[5]).unwrap();
        // two pinned, room for a third only after one is released
        let err = c.open(&urls[1]).map(|_| ()).unwrap_err();
        assert!(matches!(err, RemoteError::NoRoom { .. }), "{err}");
        drop(p2);
        assert!(c.open(&urls[1]).is_ok());
    }

    #[test]
    fn an_object_larger_than_the_budget_is_an_error_naming_it() {
        let (d, urls) = objects(1, 1000);
        let c = Cache::new(&d.cache, 999, vec![]).unwrap();
        let err = c.open(&urls[0]).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains(&urls[0]), "{err}");
        assert!(matches!(
            err,
            RemoteError::Budget {
                size: 1000,
                budget: 999,
                ..
            }
        ));
    }

    #[test]
    fn an_object_downloaded_again_after_its_eviction_is_a_redownload() {
        let (d, urls) = objects(2, 1000);
        let c = Cache::new(&d.cache, 1500, vec![]).unwrap();
        drop(c.open(&urls[0]).unwrap());
        drop(c.open(&urls[1]).unwrap()); // evicts the first: room for one
        drop(c.open(&urls[1]).unwrap()); // a hit
        assert_eq!(c.counters.redownloads.load(Ordering::Relaxed), 0);
        drop(c.open(&urls[0]).unwrap()); // evicted before: fetched again
        assert_eq!(c.counters.downloads.load(Ordering::Relaxed), 3);
        assert_eq!(c.counters.redownloads.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_missing_object_is_not_found_naming_it() {
        let d = tempdir::Dirs::new();
        let c = Cache::new(&d.cache, 999, vec![]).unwrap();
        let url = format!("file://{}/nope.bin", d.src.display());
        let err = c.open(&url).map(|_| ()).unwrap_err();
        assert!(matches!(err, RemoteError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("nope.bin"));
    }

    #[test]
    fn prefetch_fills_the_budget_in_order_and_never_evicts_unread_objects() {
        let (d, urls) = objects(5, 1000);
        let c = Arc::new(Cache::new(&d.cache, 3000, vec![]).unwrap());
        let ctl = Control::default();
        // without readers, three fit; the fourth waits for room
        let done = std::thread::scope(|s| {
            let sized: Vec<_> = urls.iter().map(|u| (u.clone(), None, None)).collect();
            let (c, ctl) = (&c, &ctl);
            let h = s.spawn(move || c.prefetch_all(&sized, ctl));
            std::thread::sleep(Duration::from_millis(300));
            let n = c.counters.downloads.load(Ordering::Relaxed);
            ctl.stop.store(true, Ordering::SeqCst);
            h.join().unwrap();
            n
        });
        assert_eq!(done, 3);
        for u in &urls[..3] {
            assert!(d.cache.join(key(u)).exists());
        }
        // reading frees room: the rest arrive, still within the budget
        for u in &urls[..3] {
            drop(c.open(u).unwrap());
        }
        c.prefetch(
            urls[3..]
                .iter()
                .map(|u| (u.clone(), None, Some(1000)))
                .collect(),
            2,
        )
        .join();
        assert!(cached_bytes(&d.cache) <= 3000);
        assert!(d.cache.join(key(&urls[4])).exists());
        assert_eq!(c.counters.hits.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_piece_is_fetched_and_kept_alone() {
        let d = tempdir::Dirs::new();
        let p = d.src.join("obj.bin");
        std::fs::write(&p, (0..=255u8).cycle().take(10_000).collect::<Vec<_>>()).unwrap();
        let url = format!("file://{}", p.display());
        let c = Cache::new(&d.cache, 10_000, vec![]).unwrap();
        let piece = c.open_piece(&url, Some((300, 812))).unwrap();
        let want: Vec<u8> = (300..812).map(|i| (i % 256) as u8).collect();
        assert_eq!(std::fs::read(&piece.path).unwrap(), want);
        assert_eq!(c.counters.fetched.load(Ordering::Relaxed), 512);
        drop(piece);
        let _again = c.open_piece(&url, Some((300, 812))).unwrap();
        assert_eq!(c.counters.downloads.load(Ordering::Relaxed), 1);
        assert_eq!(cached_bytes(&d.cache), 512);
    }

    #[test]
    fn leases_beyond_the_budget_make_the_cache_short_of_room() {
        let d = tempdir::Dirs::new();
        let c = Cache::new(&d.cache, 1000, vec![]).unwrap();
        assert!(!c.short_of_room());
        let a = c.lease(600).unwrap();
        assert_eq!(c.leased(), 600);
        assert!(!c.short_of_room());
        let b = c.lease(600).unwrap();
        assert_eq!(c.leased(), 1200);
        assert!(c.short_of_room(), "two leases of 600 in a budget of 1000");
        drop(b);
        assert!(!c.short_of_room());
        drop(a);
        assert_eq!(c.leased(), 0);
    }

    #[test]
    fn a_lease_whose_holder_is_gone_is_removed() {
        let d = tempdir::Dirs::new();
        let c = Cache::new(&d.cache, 1000, vec![]).unwrap();
        let lease = c.lease(5000).unwrap();
        // its lock released as by the death of its process, the file left
        let _ = flock(&lease.file.file, FlockOperation::Unlock);
        let path = lease.path.clone();
        std::mem::forget(lease);
        assert!(path.exists());
        assert_eq!(c.leased(), 0);
        assert!(!path.exists());
    }

    #[test]
    fn processes_and_threads_share_one_download() {
        let (d, urls) = objects(1, 200_000);
        let c = Arc::new(Cache::new(&d.cache, 1 << 20, vec![]).unwrap());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| drop(c.open(&urls[0]).unwrap()));
            }
        });
        assert_eq!(c.counters.downloads.load(Ordering::Relaxed), 1);
        assert_eq!(c.counters.fetched.load(Ordering::Relaxed), 200_000);
    }
}
