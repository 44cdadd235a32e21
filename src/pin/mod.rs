//! Pinned arenas: batches that are page-locked for the GPU without a copy.
//!
//! With `pin_memory=True` torch copies every batch into page-locked memory
//! (its caching host allocator). ferroloader's batches already sit in shared
//! memory it owns, so instead the main process registers each worker's
//! arena segments with the CUDA runtime once ([`HostRuntime::register`],
//! `cudaHostRegister`), and tensors built over their records are pinned as
//! they are: no copy at all. A segment added by growth is registered when
//! its first record is opened; nothing is registered per batch.
//!
//! # The reuse guard
//!
//! A pinned tensor may be handed to an asynchronous copy
//! (`batch.to("cuda", non_blocking=True)`) and dropped right after, before
//! the GPU has read it. torch's allocator keeps its own pinned blocks from
//! reuse by recording an event on the copy's stream; a record of the arena
//! gets the same protection here. When the last tensor over a pinned record
//! is freed (on any thread, often with the GIL released, where torch's
//! current stream cannot be asked), the record is set aside. At the
//! training loop's next `next()` ([`Pinning::tick`]) one fence
//! ([`HostRuntime::fence`], an event per stream) is taken for everything set
//! aside since, on every stream that was current at a `next()`, and a
//! reaper thread releases those records once the fence has passed.
//!
//! That covers a copy on the stream current at `next()` (what Lightning,
//! accelerate and a plain loop do) and a copy on a side stream that the loop
//! joins into its stream (`wait_stream`) before the following `next()`, as
//! the prefetchers of timm and apex do before using the copy. Once the
//! iterator is closed there is no next `next()`: records freed after that
//! are fenced at once on the streams seen.
//!
//! The runtime is behind a trait so that the bookkeeping is tested without
//! a GPU (`tests` below, and a fake runtime in the bindings that models
//! streams and asynchronous copies); [`cuda`] is the real one, resolved at
//! run time from the CUDA runtime library torch has already loaded.

pub mod cuda;

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

use crate::ring::{RecordHandle, Segment};

/// A device and one of its streams: the raw `cudaStream_t` as an integer
/// (0 is the legacy default stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId {
    pub device: i32,
    pub stream: u64,
}

/// Opaque handles of the events that make one fence.
#[derive(Debug, Default)]
pub struct Fence(pub Vec<u64>);

/// What pinned arenas need from a GPU runtime.
pub trait HostRuntime: Send + Sync {
    /// Page-locks `len` bytes at `ptr` for every device (`cudaHostRegister`
    /// with `cudaHostRegisterPortable`).
    fn register(&self, ptr: *mut u8, len: usize) -> Result<(), String>;
    /// Undoes [`register`](Self::register) (`cudaHostUnregister`); called
    /// before the memory is unmapped.
    fn unregister(&self, ptr: *mut u8);
    /// A fence after all work queued so far on each of `streams`.
    fn fence(&self, streams: &[StreamId]) -> Result<Fence, String>;
    /// Blocks until `fence` has passed (or can never pass: the device
    /// failed), then frees it.
    fn wait(&self, fence: Fence);
}

/// A segment registered with the runtime. Unregisters on drop, before its
/// share of the mapping is dropped (fields drop after `drop` runs), so the
/// memory is never unmapped while registered.
pub struct Registration {
    runtime: Arc<dyn HostRuntime>,
    seg: Arc<Segment>,
    /// The registering process (a forked child's copy must not call the
    /// runtime).
    owner: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if std::process::id() == self.owner {
            self.runtime.unregister(self.seg.as_ptr());
        }
    }
}

/// Registrations by (worker, segment id); `None` where registering failed.
type Registry = HashMap<(usize, u32), Option<Arc<Registration>>>;

/// A freed pinned record and the registration that keeps its memory pinned.
type Freed = (RecordHandle, Arc<Registration>);

/// Freed pinned records and the fence they wait for.
struct Retired {
    records: Vec<Freed>,
    fence: Fence,
}

/// Counters of a [`Pinning`], for stats and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PinCounts {
    /// Segments registered, and their bytes.
    pub segments: u64,
    pub bytes: u64,
    /// Segments whose registration failed (their records are not pinned).
    pub failed: u64,
    /// Records retired through a fence, and those released at once because
    /// no fence could be taken.
    pub fenced: u64,
    pub unfenced: u64,
}

/// One iterator's pinned arenas: registrations per (worker, segment), the
/// streams seen, and the reaper of retired records.
pub struct Pinning {
    runtime: Arc<dyn HostRuntime>,
    regs: Mutex<Registry>,
    streams: Mutex<Vec<StreamId>>,
    /// Records freed since the last [`tick`](Self::tick), while the
    /// iterator is open (`None` once it is closed).
    pending: Mutex<Option<Vec<Freed>>>,
    /// `None`: the guard is off (tests show what it prevents), records are
    /// released as soon as their last tensor is freed.
    reaper: Option<Sender<Retired>>,
    first_error: Mutex<Option<String>>,
    segments: AtomicU64,
    bytes: AtomicU64,
    failed: AtomicU64,
    fenced: AtomicU64,
    unfenced: AtomicU64,
    /// The process whose CUDA context registered the arenas (a forked
    /// child must not call the runtime: CUDA does not survive fork).
    owner: u32,
}

impl Pinning {
    /// Pinned arenas over `runtime`. `guard=false` releases freed records at
    /// once (only for showing what the guard prevents).
    pub fn new(runtime: Arc<dyn HostRuntime>, guard: bool) -> Arc<Self> {
        let reaper = guard.then(|| {
            let (tx, rx) = channel::<Retired>();
            let rt = Arc::clone(&runtime);
            // Ends when every sender is gone (the iterator and all its
            // pinned records) and the retired records are released.
            let spawned = std::thread::Builder::new()
                .name("ferroloader-pin-reaper".into())
                .spawn(move || {
                    for r in rx {
                        rt.wait(r.fence);
                        drop(r.records);
                    }
                });
            spawned.ok().map(|_| tx)
        });
        Arc::new(Pinning {
            runtime,
            regs: Mutex::new(HashMap::new()),
            streams: Mutex::new(Vec::new()),
            pending: Mutex::new(Some(Vec::new())),
            reaper: reaper.flatten(),
            first_error: Mutex::new(None),
            segments: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            unfenced: AtomicU64::new(0),
            owner: std::process::id(),
        })
    }

    /// Remembers `s` as a stream copies may run on (the current stream at a
    /// `next()`); every later fence covers it.
    pub fn note_stream(&self, s: StreamId) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if !streams.contains(&s) {
            streams.push(s);
        }
    }

    /// The streams seen so far.
    pub fn streams(&self) -> Vec<StreamId> {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The registration of the segment `handle` lies in, made on first
    /// sight (`None` if registering failed: its records are not pinned).
    fn registration(&self, worker: usize, handle: &RecordHandle) -> Option<Arc<Registration>> {
        let seg = handle.segment();
        let key = (worker, handle.record().segment);
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = regs.get(&key) {
            match known {
                // the same mapping (a segment id can be mapped anew)
                Some(r) if Arc::ptr_eq(&r.seg, seg) => return Some(Arc::clone(r)),
                None => return None,
                Some(_) => {}
            }
        }
        let made = match self.runtime.register(seg.as_ptr(), seg.len()) {
            Ok(()) => {
                self.segments.fetch_add(1, Ordering::Relaxed);
                self.bytes.fetch_add(seg.len() as u64, Ordering::Relaxed);
                Some(Arc::new(Registration {
                    runtime: Arc::clone(&self.runtime),
                    seg: Arc::clone(seg),
                    owner: self.owner,
                }))
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                None
            }
        };
        regs.insert(key, made.clone());
        made
    }

    /// Takes an opened record of `worker` under this pinning: its segment
    /// is registered (once), and when the last share of the returned
    /// [`Held`] is dropped the record waits for a fence before release.
    pub fn hold(self: &Arc<Self>, worker: usize, handle: RecordHandle) -> Held {
        let registration = self.registration(worker, &handle);
        Held {
            handle: Some(handle),
            pinned: registration.map(|r| (Arc::clone(self), r)),
        }
    }

    /// Whether records of `worker`'s segment `segment` are pinned.
    pub fn is_registered(&self, worker: usize, segment: u32) -> bool {
        let regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        matches!(regs.get(&(worker, segment)), Some(Some(_)))
    }

    /// The first registration error, if any.
    pub fn first_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn counts(&self) -> PinCounts {
        PinCounts {
            segments: self.segments.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            unfenced: self.unfenced.load(Ordering::Relaxed),
        }
    }

    /// Drops the registry's shares of the registrations: each segment is
    /// unregistered as soon as no record over it is held or waiting.
    pub fn forget_segments(&self) {
        self.regs.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The training loop's `next()`: `current` (its current stream, if
    /// known) joins the streams fences cover, and the records freed since
    /// the last tick are fenced and handed to the reaper.
    pub fn tick(&self, current: Option<StreamId>) {
        if let Some(s) = current {
            self.note_stream(s);
        }
        let freed = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match pending.as_mut() {
                Some(p) if !p.is_empty() => std::mem::take(p),
                _ => return,
            }
        };
        self.fence_and_reap(freed);
    }

    /// The iterator is closing: what was freed is fenced now, and records
    /// freed from here on are fenced as they are freed.
    pub fn close(&self) {
        let freed = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(freed) = freed.filter(|f| !f.is_empty()) {
            self.fence_and_reap(freed);
        }
    }

    /// A freed pinned record: set aside until the next tick, or, once the
    /// iterator is closed, fenced now. With the guard off it is released.
    fn retire(&self, record: RecordHandle, registration: Arc<Registration>) {
        if self.reaper.is_none() {
            return; // guard off: `record` is released on return
        }
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = pending.as_mut() {
                p.push((record, registration));
                return;
            }
        }
        self.fence_and_reap(vec![(record, registration)]);
    }

    fn fence_and_reap(&self, records: Vec<Freed>) {
        let n = records.len() as u64;
        if std::process::id() != self.owner {
            // A copy of these records in a forked child (garbage collected
            // there): no copy of the child's can be in flight, and the
            // parent's runtime is not the child's to call.
            std::mem::forget(records);
            return;
        }
        match self.runtime.fence(&self.streams()) {
            Ok(fence) => {
                self.fenced.fetch_add(n, Ordering::Relaxed);
                let retired = Retired { records, fence };
                let sent = match &self.reaper {
                    Some(reaper) => reaper.send(retired).map_err(|back| back.0),
                    None => Err(retired),
                };
                if let Err(back) = sent {
                    // the reaper is gone (it could not be started): wait here
                    self.runtime.wait(back.fence);
                }
            }
            Err(_) => {
                // No fence (the device failed): nothing can be waited on,
                // and holding the records forever would starve the workers.
                self.unfenced.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Pinning {
    /// The last share is gone (the iterator and every pinned record): what
    /// is still set aside is fenced before the reaper ends.
    fn drop(&mut self) {
        self.close();
    }
}

/// An opened record as the main process holds it while tensors live over
/// it: released when dropped, after a fence if it is pinned.
pub struct Held {
    handle: Option<RecordHandle>,
    pinned: Option<(Arc<Pinning>, Arc<Registration>)>,
}

impl Held {
    /// A record outside any pinned arena: released when dropped.
    pub fn plain(handle: RecordHandle) -> Held {
        Held {
            handle: Some(handle),
            pinned: None,
        }
    }

    /// Whether its memory is registered with the GPU runtime.
    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }
}

impl Deref for Held {
    type Target = RecordHandle;
    fn deref(&self) -> &RecordHandle {
        // `handle` is `Some` from construction until `drop` takes it.
        self.handle
            .as_ref()
            .expect("a Held record is alive until dropped")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let (Some(handle), Some((pinning, registration))) =
            (self.handle.take(), self.pinned.take())
        {
            pinning.retire(handle, registration);
        }
    }
}

#[cfg(all(test, not(any(miri, loom))))]
mod tests;
