//! One URL's store and the download of one object into a file.
//!
//! Each thread that downloads keeps its own single-threaded tokio runtime
//! and its stores (one per scheme and bucket or host), so no lock is
//! shared: a worker forked while another thread of its parent was opening
//! a store cannot find that lock held forever. They are also keyed by
//! process id: a forked child's copy of its parent's thread builds its own
//! (the parent's connections and runtime threads are not there).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreScheme, RetryConfig,
};
use url::Url;

/// What can go wrong reading an object; each names its URL.
#[derive(Debug)]
pub enum RemoteError {
    /// Not a URL any store reads.
    BadUrl { url: String, why: String },
    /// No object there.
    NotFound { url: String },
    /// The store refused: credentials missing or not allowed.
    Denied { url: String, why: String },
    /// The object changed while it was read (its ETag no longer matches).
    Changed { url: String },
    /// A transient error outlasted the retries, or the store failed.
    Failed { url: String, why: String },
    /// The object is larger than the whole cache budget.
    Budget { url: String, size: u64, budget: u64 },
    /// No room in the cache within the wait: every cached object is being
    /// read (the budget holds fewer objects than are read at once).
    NoRoom {
        url: String,
        size: u64,
        budget: u64,
        waited: Duration,
    },
    /// The cache directory failed (a full disk, permissions).
    Disk {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The prefetcher gave up a download to let the process fork or stop.
    Aborted,
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteError::BadUrl { url, why } => write!(f, "cannot read {url}: {why}"),
            RemoteError::NotFound { url } => write!(f, "no object at {url}"),
            RemoteError::Denied { url, why } => {
                write!(f, "reading {url} was refused (credentials?): {why}")
            }
            RemoteError::Changed { url } => write!(
                f,
                "{url} changed while it was being read (its ETag no longer matches)"
            ),
            RemoteError::Failed { url, why } => write!(f, "reading {url} failed: {why}"),
            RemoteError::Budget { url, size, budget } => write!(
                f,
                "{url} is {size} bytes, more than the whole shard cache budget of {budget} \
                 bytes; raise the budget (ferroloader.ShardCache(budget=...))"
            ),
            RemoteError::NoRoom {
                url,
                size,
                budget,
                waited,
            } => write!(
                f,
                "no room for {url} ({size} bytes) in the shard cache (budget {budget} bytes) \
                 after {:.0} s: every cached shard is being read; the budget must hold as \
                 many shards as are read at once (lanes, or workers with dynamic sharding)",
                waited.as_secs_f64()
            ),
            RemoteError::Disk { path, source } => {
                write!(f, "shard cache {}: {source}", path.display())
            }
            RemoteError::Aborted => write!(f, "download given up (the prefetch was stopped)"),
        }
    }
}

impl std::error::Error for RemoteError {}

pub type Result<T> = std::result::Result<T, RemoteError>;

/// Options the user passes for every store (`aws_endpoint`, `timeout`, ...:
/// the keys of each `object_store` builder's config), on top of the
/// environment each builder reads.
pub type Options = Vec<(String, String)>;

struct PerThread {
    pid: u32,
    runtime: Rc<tokio::runtime::Runtime>,
    stores: HashMap<String, Arc<dyn ObjectStore>>,
}

/// The thread's `PerThread`. In a forked child the forking thread's slot
/// holds the parent's copy: its runtime and connections are not in the
/// child, so it is forgotten, neither used nor dropped (a drop would wait
/// on threads that are not there).
struct Slot(Option<PerThread>);

impl Slot {
    /// This process's state, if any (a parent's copy forgotten first).
    fn here(&mut self) -> &mut Option<PerThread> {
        if self.0.as_ref().is_some_and(|s| s.pid != std::process::id()) {
            std::mem::forget(self.0.take());
        }
        &mut self.0
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.here();
    }
}

thread_local! {
    static STATE: RefCell<Slot> = const { RefCell::new(Slot(None)) };
}

/// Retries of a failed request (timeouts, 5xx, dropped connections), with
/// exponential backoff from 100 ms up to 10 s: `retries` times (default 8)
/// within `retry_timeout` seconds (default 120), both settable as options.
fn retry(options: &Options) -> RetryConfig {
    let get = |name: &str| {
        options
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse::<f64>().ok())
    };
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            base: 2.0,
        },
        max_retries: get("retries").map_or(8, |n| n.max(0.0) as usize),
        // (ShardCache checks the option; a value past Duration's range is
        // no limit at all)
        retry_timeout: Duration::try_from_secs_f64(get("retry_timeout").unwrap_or(120.0).max(0.0))
            .unwrap_or(Duration::MAX),
    }
}

/// Whether `key` is a setting some store knows (S3's, GCS's, Azure's or
/// the HTTP client's, as their builders parse them), or the retry
/// options: one options dict serves every store, so a key none of them
/// knows is a misspelling that would silently be ignored.
pub fn known_option(key: &str) -> bool {
    matches!(key, "retries" | "retry_timeout")
        || key.parse::<object_store::aws::AmazonS3ConfigKey>().is_ok()
        || key.parse::<object_store::gcp::GoogleConfigKey>().is_ok()
        || key.parse::<object_store::azure::AzureConfigKey>().is_ok()
        || key.parse::<object_store::ClientConfigKey>().is_ok()
}

/// `builder` with the user's options applied (keys the builder does not
/// know are left to the others: one options dict serves every store).
macro_rules! with_options {
    ($builder:expr, $options:expr) => {
        $options.iter().fold($builder, |b, (k, v)| match k.parse() {
            Ok(k) => b.with_config(k, v),
            Err(_) => b,
        })
    };
}

fn build(
    url: &Url,
    scheme: ObjectStoreScheme,
    options: &Options,
) -> object_store::Result<Arc<dyn ObjectStore>> {
    let retry = retry(options);
    Ok(match scheme {
        ObjectStoreScheme::Local => Arc::new(LocalFileSystem::new()),
        ObjectStoreScheme::AmazonS3 => Arc::new(
            with_options!(AmazonS3Builder::from_env().with_url(url.as_str()), options)
                .with_retry(retry)
                .build()?,
        ),
        ObjectStoreScheme::GoogleCloudStorage => Arc::new(
            with_options!(
                GoogleCloudStorageBuilder::from_env().with_url(url.as_str()),
                options
            )
            .with_retry(retry)
            .build()?,
        ),
        ObjectStoreScheme::MicrosoftAzure => Arc::new(
            with_options!(
                MicrosoftAzureBuilder::from_env().with_url(url.as_str()),
                options
            )
            .with_retry(retry)
            .build()?,
        ),
        ObjectStoreScheme::Http => {
            let base = &url[..url::Position::BeforePath];
            let client = ClientOptions::new().with_allow_http(true);
            Arc::new(
                with_options!(
                    HttpBuilder::new()
                        .with_url(base)
                        .with_client_options(client),
                    options
                )
                .with_retry(retry)
                .build()?,
            )
        }
        other => {
            return Err(object_store::Error::NotSupported {
                source: format!("{other:?} URLs").into(),
            })
        }
    })
}

/// The object a URL names: this process's runtime, the store and the path.
pub struct Object {
    pub url: String,
    /// Resumes of a broken transfer in a row before giving up.
    resumes: u32,
    runtime: Rc<tokio::runtime::Runtime>,
    store: Arc<dyn ObjectStore>,
    path: Path,
}

impl Object {
    pub fn open(url: &str, options: &Options) -> Result<Object> {
        let bad = |why: String| RemoteError::BadUrl {
            url: url.to_string(),
            why,
        };
        let parsed = Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(e.to_string()))?;
        let path = if scheme == ObjectStoreScheme::Local {
            Path::from_url_path(parsed.path())
        } else {
            Path::parse(path)
        }
        .map_err(|e| bad(e.to_string()))?;
        let key = format!("{scheme:?} {}", &parsed[..url::Position::BeforePath]);
        STATE.with_borrow_mut(|slot| {
            let state = slot.here();
            if state.is_none() {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| RemoteError::Failed {
                        url: url.to_string(),
                        why: format!("cannot start the I/O runtime: {e}"),
                    })?;
                *state = Some(PerThread {
                    pid: std::process::id(),
                    runtime: Rc::new(runtime),
                    stores: HashMap::new(),
                });
            }
            let per = state.as_mut().expect("set above");
            let store = match per.stores.get(&key) {
                Some(s) => s.clone(),
                None => {
                    let s = build(&parsed, scheme, options).map_err(|e| bad(e.to_string()))?;
                    per.stores.insert(key, s.clone());
                    s
                }
            };
            Ok(Object {
                url: url.to_string(),
                resumes: retry(options).max_retries as u32,
                runtime: per.runtime.clone(),
                store,
                path,
            })
        })
    }

    fn classify(&self, e: object_store::Error) -> RemoteError {
        let url = self.url.clone();
        match e {
            object_store::Error::NotFound { .. } => RemoteError::NotFound { url },
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => RemoteError::Denied {
                url,
                why: source.to_string(),
            },
            object_store::Error::Precondition { .. } => RemoteError::Changed { url },
            other => RemoteError::Failed {
                url,
                why: other.to_string(),
            },
        }
    }

    /// The sizes of the objects at `urls`, asked concurrently (up to 32
    /// requests at once) on this thread's runtime.
    pub fn sizes(urls: &[String], options: &Options) -> Result<Vec<u64>> {
        let objects = urls
            .iter()
            .map(|u| Object::open(u, options))
            .collect::<Result<Vec<_>>>()?;
        let Some(first) = objects.first() else {
            return Ok(Vec::new());
        };
        let runtime = first.runtime.clone();
        runtime.block_on(async {
            let heads = futures::stream::iter(
                objects
                    .iter()
                    .map(|o| async move { o.head_async().await.map(|h| h.0) }),
            )
            .buffered(32);
            heads.collect::<Vec<_>>().await.into_iter().collect()
        })
    }

    /// The object's size and ETag (if the store gives one). A transport
    /// error the store does not retry itself (a connection that closed
    /// under a reused request) is retried here, as a broken transfer is.
    pub fn head(&self) -> Result<(u64, Option<String>)> {
        self.runtime.block_on(self.head_async())
    }

    async fn head_async(&self) -> Result<(u64, Option<String>)> {
        let mut backoff = Duration::from_millis(100);
        let mut failures = 0;
        loop {
            match self.store.head(&self.path).await {
                Ok(meta) => return Ok((meta.size, meta.e_tag)),
                Err(e) => match self.classify(e) {
                    RemoteError::Failed { .. } if failures < self.resumes => {
                        failures += 1;
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                    other => return Err(other),
                },
            }
        }
    }

    /// Writes bytes `range` of the object (`size` bytes long, when known)
    /// into `file` from its start: the whole object as a plain GET, which
    /// any HTTP server answers, a part as a ranged GET. A transfer that
    /// breaks off resumes where it stopped (a ranged GET of the rest, with
    /// backoff), up to `retries` times (an option) in a row; the ETag
    /// (given, or the first answer's) keeps every piece from the same
    /// version of the object.
    pub fn download(
        &self,
        file: &File,
        size: Option<u64>,
        range: std::ops::Range<u64>,
        etag: Option<&str>,
        fetched: &std::sync::atomic::AtomicU64,
        abort: &dyn Fn() -> bool,
    ) -> Result<()> {
        let mut at = range.start;
        let mut failures = 0u32;
        let mut backoff = Duration::from_millis(100);
        let disk = |e: std::io::Error| RemoteError::Disk {
            path: PathBuf::from(format!("(the file for {})", self.url)),
            source: e,
        };
        // without one given, the first answer's ETag pins the later pieces
        let mut etag = etag.map(str::to_string);
        let mut changed = false;
        while at < range.end {
            // the whole object as a plain GET (any HTTP server answers it);
            // a part of it as a range
            let whole = at == 0 && range.start == 0 && Some(range.end) == size;
            let opts = GetOptions {
                range: (!whole).then_some(GetRange::Bounded(at..range.end)),
                if_match: etag.clone(),
                ..Default::default()
            };
            let broke: Option<String> = self
                .runtime
                .block_on(async {
                    let got = match self.store.get_opts(&self.path, opts).await {
                        Ok(g) => g,
                        Err(e) => return Err(e),
                    };
                    if size.is_some_and(|n| got.meta.size != n) {
                        // not the object whose size the cache reserved
                        changed = true;
                        return Ok(None);
                    }
                    if etag.is_none() {
                        etag = got.meta.e_tag.clone();
                    }
                    let mut stream = got.into_stream();
                    while let Some(chunk) = stream.next().await {
                        if abort() {
                            return Err(object_store::Error::Generic {
                                store: "ferroloader cache",
                                source: Box::new(Abort),
                            });
                        }
                        match chunk {
                            Ok(bytes) => {
                                let end = at + bytes.len() as u64;
                                if end > range.end {
                                    return Ok(Some(format!(
                                        "the store sent bytes past {} (the object grew?)",
                                        range.end
                                    )));
                                }
                                if let Err(e) = file.write_all_at(&bytes, at - range.start) {
                                    return Err(object_store::Error::Generic {
                                        store: "ferroloader cache",
                                        source: Box::new(DiskError(e)),
                                    });
                                }
                                fetched.fetch_add(
                                    bytes.len() as u64,
                                    std::sync::atomic::Ordering::Relaxed,
                                );
                                at = end;
                                failures = 0;
                            }
                            Err(e) => return Ok(Some(e.to_string())),
                        }
                    }
                    Ok(None)
                })
                .map_err(|e| match e {
                    object_store::Error::Generic { source, .. } if source.is::<Abort>() => {
                        RemoteError::Aborted
                    }
                    object_store::Error::Generic { source, .. } if source.is::<DiskError>() => {
                        disk(
                            source
                                .downcast::<DiskError>()
                                .map(|d| d.0)
                                .unwrap_or_else(|e| std::io::Error::other(e.to_string())),
                        )
                    }
                    e => self.classify(e),
                })?;
            if changed {
                return Err(RemoteError::Changed {
                    url: self.url.clone(),
                });
            }
            match broke {
                None if at < range.end => {
                    failures += 1;
                    if failures > self.resumes {
                        return Err(RemoteError::Failed {
                            url: self.url.clone(),
                            why: format!("the transfer ended at byte {at} of {}", range.end),
                        });
                    }
                }
                None => {}
                Some(why) => {
                    failures += 1;
                    if failures > self.resumes {
                        return Err(RemoteError::Failed {
                            url: self.url.clone(),
                            why: format!("the transfer broke off {failures} times in a row: {why}"),
                        });
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        Ok(())
    }
}

/// A download given up at the prefetcher's request, carried through the
/// store's error.
#[derive(Debug)]
struct Abort;

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("aborted")
    }
}

impl std::error::Error for Abort {}

/// A write to the cache file that failed, carried through the store's error.
#[derive(Debug)]
struct DiskError(std::io::Error);

impl fmt::Display for DiskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DiskError {}

#[cfg(test)]
mod tests {
    use super::known_option;

    #[test]
    fn options_known_to_some_store() {
        for key in [
            "aws_endpoint",
            "endpoint",
            "aws_region",
            "allow_http",
            "aws_allow_http",
            "google_service_account",
            "azure_storage_account_name",
            "timeout",
            "retries",
            "retry_timeout",
        ] {
            assert!(known_option(key), "{key}");
        }
        for key in ["bogus", "aws_endpont", "AWS_ENDPOINT", "allow-http", ""] {
            assert!(!known_option(key), "{key}");
        }
    }
}
