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
//! training loop's next `next()` ([`Pinning::tick`]) everything set aside
//! since goes to the reaper thread, which takes one fence
//! ([`HostRuntime::fence`], an event per stream) on every stream that was
//! current at a `next()` (on every device in use), waits for it and then
//! releases the records. A fence taken later than the tick covers more, never
//! less. If no fence can be taken or waited for, the reaper synchronizes the
//! devices instead; a record is released without either only when the device
//! itself has failed (no copy can be running then).
//!
//! Every runtime call after registration (fences, waits, unregistering)
//! runs on the reaper thread: none on the thread that frees a tensor (often
//! with the GIL released, or one of torch's own threads), and the reaper's
//! calls are made in the relaxed stream-capture mode, so a CUDA graph being
//! captured elsewhere is not disturbed.
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

/// Opaque handles of the events that make one fence, with their devices.
#[derive(Debug, Default)]
pub struct Fence(pub Vec<(i32, u64)>);

/// What pinned arenas need from a GPU runtime.
pub trait HostRuntime: Send + Sync {
    /// Page-locks `len` bytes at `ptr` for every device (`cudaHostRegister`
    /// with `cudaHostRegisterPortable`), on the calling thread's device;
    /// returns that device.
    fn register(&self, ptr: *mut u8, len: usize) -> Result<i32, String>;
    /// Undoes [`register`](Self::register) (`cudaHostUnregister`); called
    /// before the memory is unmapped.
    fn unregister(&self, ptr: *mut u8, device: i32);
    /// A fence after all work queued so far on each of `streams`.
    fn fence(&self, streams: &[StreamId]) -> Result<Fence, String>;
    /// Blocks until `fence` has passed, then frees it.
    fn wait(&self, fence: Fence) -> Result<(), String>;
    /// Blocks until all work queued so far on `devices` has finished (the
    /// fallback when no fence can be taken or waited for).
    fn synchronize(&self, devices: &[i32]) -> Result<(), String>;
    /// Prepares the calling thread to be the reaper (e.g. the relaxed
    /// stream-capture mode).
    fn reaper_started(&self) {}
}

/// A segment registered with the runtime. Unregisters on drop, before its
/// share of the mapping is dropped (fields drop after `drop` runs), so the
/// memory is never unmapped while registered.
pub struct Registration {
    runtime: Arc<dyn HostRuntime>,
    seg: Arc<Segment>,
    device: i32,
    /// The registering process (a forked child's copy must not call the
    /// runtime).
    owner: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if std::process::id() == self.owner {
            self.runtime.unregister(self.seg.as_ptr(), self.device);
        }
    }
}

/// Registrations by (worker, segment id); `None` where registering failed.
type Registry = HashMap<(usize, u32), Option<Arc<Registration>>>;

/// A freed pinned record and the registration that keeps its memory pinned.
type Freed = (RecordHandle, Arc<Registration>);

/// The reaper's work, in order.
enum Job {
    /// Fence `streams`, wait, then release `records`.
    Retire {
        records: Vec<Freed>,
        streams: Vec<StreamId>,
    },
    /// Registrations to drop on the reaper (unregistering there).
    Drop(Vec<Arc<Registration>>),
}

/// Counters of a [`Pinning`], for stats and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PinCounts {
    /// Segments registered, and their bytes.
    pub segments: u64,
    pub bytes: u64,
    /// Segments whose registration failed (their records are not pinned).
    pub failed: u64,
    /// Records released after a fence, after a device synchronization (no
    /// fence could be used), and without either (the device failed).
    pub fenced: u64,
    pub synchronized: u64,
    pub unfenced: u64,
}

#[derive(Default)]
struct Counters {
    segments: AtomicU64,
    bytes: AtomicU64,
    failed: AtomicU64,
    fenced: AtomicU64,
    synchronized: AtomicU64,
    unfenced: AtomicU64,
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
    /// `false`: freed records are released at once (only for showing what
    /// the guard prevents).
    guard: bool,
    /// The reaper's queue; `None` if its thread could not be started (its
    /// work is then done on the caller's thread).
    reaper: Option<Sender<Job>>,
    first_error: Mutex<Option<String>>,
    counts: Arc<Counters>,
    /// The process whose CUDA context registered the arenas (a forked
    /// child must not call the runtime: CUDA does not survive fork).
    owner: u32,
}

/// Does one job of the reaper (on its thread, or inline without one).
fn work(rt: &dyn HostRuntime, counts: &Counters, job: Job) {
    let (records, streams) = match job {
        Job::Retire { records, streams } => (records, streams),
        Job::Drop(regs) => return drop(regs),
    };
    let n = records.len() as u64;
    let fenced = rt.fence(&streams).and_then(|f| rt.wait(f));
    let counter = if fenced.is_ok() {
        &counts.fenced
    } else {
        let mut devices: Vec<i32> = streams.iter().map(|s| s.device).collect();
        devices.sort_unstable();
        devices.dedup();
        if rt.synchronize(&devices).is_ok() {
            &counts.synchronized
        } else {
            // the device failed: no copy from these records can be running
            &counts.unfenced
        }
    };
    counter.fetch_add(n, Ordering::Relaxed);
    drop(records);
}

impl Pinning {
    /// Pinned arenas over `runtime`. `guard=false` releases freed records at
    /// once (only for showing what the guard prevents).
    pub fn new(runtime: Arc<dyn HostRuntime>, guard: bool) -> Arc<Self> {
        let counts = Arc::new(Counters::default());
        let (tx, rx) = channel::<Job>();
        let rt = Arc::clone(&runtime);
        let c = Arc::clone(&counts);
        // Ends when every sender is gone (the iterator and all its pinned
        // records) and its last job is done.
        let spawned = std::thread::Builder::new()
            .name("ferroloader-pin-reaper".into())
            .spawn(move || {
                rt.reaper_started();
                for job in rx {
                    work(rt.as_ref(), &c, job);
                }
            });
        Arc::new(Pinning {
            runtime,
            regs: Mutex::new(HashMap::new()),
            streams: Mutex::new(Vec::new()),
            pending: Mutex::new(Some(Vec::new())),
            guard,
            reaper: spawned.ok().map(|_| tx),
            first_error: Mutex::new(None),
            counts,
            owner: std::process::id(),
        })
    }

    /// Remembers `s` as a stream copies may run on (current at a `next()`);
    /// every later fence covers it.
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

    /// Hands `job` to the reaper, or does it here without one.
    fn submit(&self, job: Job) {
        if std::process::id() != self.owner {
            // A copy of these records in a forked child (garbage collected
            // there): no copy of the child's can be in flight, and the
            // parent's runtime is not the child's to call; the parent
            // releases its own records.
            std::mem::forget(job);
            return;
        }
        let job = match &self.reaper {
            Some(reaper) => match reaper.send(job) {
                Ok(()) => return,
                Err(back) => back.0,
            },
            None => job,
        };
        work(self.runtime.as_ref(), &self.counts, job);
    }

    /// The registration of the segment `handle` lies in, made on first
    /// sight (`None` if registering failed: its records are not pinned).
    fn registration(&self, worker: usize, handle: &RecordHandle) -> Option<Arc<Registration>> {
        let seg = handle.segment();
        let key = (worker, handle.record().segment);
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        let old = match regs.get(&key) {
            // the same mapping (a segment id can be mapped anew)
            Some(Some(r)) if Arc::ptr_eq(&r.seg, seg) => return Some(Arc::clone(r)),
            Some(None) => return None,
            Some(Some(r)) => Some(Arc::clone(r)),
            None => None,
        };
        let made = match self.runtime.register(seg.as_ptr(), seg.len()) {
            Ok(device) => {
                self.counts.segments.fetch_add(1, Ordering::Relaxed);
                self.counts
                    .bytes
                    .fetch_add(seg.len() as u64, Ordering::Relaxed);
                Some(Arc::new(Registration {
                    runtime: Arc::clone(&self.runtime),
                    seg: Arc::clone(seg),
                    device,
                    owner: self.owner,
                }))
            }
            Err(e) => {
                self.counts.failed.fetch_add(1, Ordering::Relaxed);
                self.first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                None
            }
        };
        regs.insert(key, made.clone());
        drop(regs);
        if let Some(old) = old {
            self.submit(Job::Drop(vec![old]));
        }
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
        let c = &self.counts;
        PinCounts {
            segments: c.segments.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            fenced: c.fenced.load(Ordering::Relaxed),
            synchronized: c.synchronized.load(Ordering::Relaxed),
            unfenced: c.unfenced.load(Ordering::Relaxed),
        }
    }

    /// Drops the registry's shares of the registrations: each segment is
    /// unregistered (by the reaper) as soon as no record over it is held or
    /// waiting.
    pub fn forget_segments(&self) {
        let regs: Vec<_> = self
            .regs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .filter_map(|(_, r)| r)
            .collect();
        if !regs.is_empty() {
            self.submit(Job::Drop(regs));
        }
    }

    /// The training loop's `next()`: the streams in `current` (the current
    /// stream of each device in use) join those fences cover, and the
    /// records freed since the last tick go to the reaper.
    pub fn tick(&self, current: &[StreamId]) {
        for &s in current {
            self.note_stream(s);
        }
        let freed = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match pending.as_mut() {
                Some(p) if !p.is_empty() => std::mem::take(p),
                _ => return,
            }
        };
        self.submit(Job::Retire {
            records: freed,
            streams: self.streams(),
        });
    }

    /// The iterator is closing: what was freed goes to the reaper now, and
    /// records freed from here on go as they are freed.
    pub fn close(&self) {
        let freed = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(freed) = freed.filter(|f| !f.is_empty()) {
            self.submit(Job::Retire {
                records: freed,
                streams: self.streams(),
            });
        }
    }

    /// A freed pinned record: set aside until the next tick, or, once the
    /// iterator is closed, handed to the reaper now. With the guard off it
    /// is released at once.
    fn retire(&self, record: RecordHandle, registration: Arc<Registration>) {
        if !self.guard {
            return; // `record` is released on return
        }
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = pending.as_mut() {
                p.push((record, registration));
                return;
            }
        }
        self.submit(Job::Retire {
            records: vec![(record, registration)],
            streams: self.streams(),
        });
    }
}

impl Drop for Pinning {
    /// The last share is gone (the iterator and every pinned record): what
    /// is still set aside, and the registry's registrations, go to the
    /// reaper before it ends.
    fn drop(&mut self) {
        self.close();
        self.forget_segments();
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
