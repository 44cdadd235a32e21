//! The pinned arena's bookkeeping against a fake runtime that models
//! streams: a fence is "the stream's queue length now", and it passes when
//! the test has run the stream that far.

use super::*;
use crate::ring::{ArenaReader, ArenaWriter};
use std::sync::Condvar;
use std::time::Duration;

#[derive(Default)]
struct FakeState {
    registered: Vec<(usize, usize)>,
    unregistered: Vec<usize>,
    /// Per stream: operations queued, operations run.
    queued: HashMap<StreamId, u64>,
    ran: HashMap<StreamId, u64>,
    fences: u64,
    syncs: u64,
    fail_register: bool,
    fail_fence: bool,
}

#[derive(Default)]
struct Fake {
    state: Mutex<FakeState>,
    moved: Condvar,
    /// Fences: (stream, queue length when taken).
    table: Mutex<Vec<Vec<(StreamId, u64)>>>,
}

impl Fake {
    fn enqueue(&self, s: StreamId) {
        *self.state.lock().unwrap().queued.entry(s).or_default() += 1;
    }
    fn run(&self, s: StreamId) {
        let mut st = self.state.lock().unwrap();
        let q = st.queued.get(&s).copied().unwrap_or(0);
        st.ran.insert(s, q);
        self.moved.notify_all();
    }
    fn registered(&self) -> Vec<(usize, usize)> {
        self.state.lock().unwrap().registered.clone()
    }
    fn unregistered(&self) -> Vec<usize> {
        self.state.lock().unwrap().unregistered.clone()
    }
}

impl HostRuntime for Fake {
    fn register(&self, ptr: *mut u8, len: usize) -> Result<i32, String> {
        let mut st = self.state.lock().unwrap();
        if st.fail_register {
            return Err("cudaHostRegister failed: fake".into());
        }
        st.registered.push((ptr as usize, len));
        Ok(0)
    }
    fn unregister(&self, ptr: *mut u8, _device: i32) {
        self.state.lock().unwrap().unregistered.push(ptr as usize);
    }
    fn fence(&self, streams: &[StreamId]) -> Result<Fence, String> {
        let mut st = self.state.lock().unwrap();
        if st.fail_fence {
            return Err("fake fence failure".into());
        }
        st.fences += 1;
        let marks: Vec<_> = streams
            .iter()
            .map(|s| (*s, st.queued.get(s).copied().unwrap_or(0)))
            .collect();
        let mut table = self.table.lock().unwrap();
        table.push(marks);
        Ok(Fence(vec![(0, (table.len() - 1) as u64)]))
    }
    fn wait(&self, fence: Fence) -> Result<(), String> {
        for (_, id) in fence.0 {
            let marks = self.table.lock().unwrap()[id as usize].clone();
            let mut st = self.state.lock().unwrap();
            while !marks
                .iter()
                .all(|(s, n)| st.ran.get(s).copied().unwrap_or(0) >= *n)
            {
                st = self.moved.wait(st).unwrap();
            }
        }
        Ok(())
    }
    fn synchronize(&self, _devices: &[i32]) -> Result<(), String> {
        let mut st = self.state.lock().unwrap();
        st.syncs += 1;
        // everything queued now must run first
        let marks: Vec<_> = st.queued.iter().map(|(s, n)| (*s, *n)).collect();
        while !marks
            .iter()
            .all(|(s, n)| st.ran.get(s).copied().unwrap_or(0) >= *n)
        {
            st = self.moved.wait(st).unwrap();
        }
        Ok(())
    }
}

const S0: StreamId = StreamId {
    device: 0,
    stream: 0,
};
const S1: StreamId = StreamId {
    device: 0,
    stream: 0x7f00,
};

/// A worker arena and the main process's reader of it, in one process.
fn arena() -> (ArenaWriter, ArenaReader) {
    let mut w = ArenaWriter::new(64 * 1024, 1 << 24).unwrap();
    let r = ArenaReader::new();
    connect(&mut w, &r);
    (w, r)
}

fn connect(w: &mut ArenaWriter, r: &ArenaReader) {
    for (id, fd) in w.take_new_segments() {
        let seg = Segment::from_fd(fd.try_clone_to_owned().unwrap()).unwrap();
        r.add_segment(id, seg);
    }
}

/// Writes and publishes a record of `len` bytes filled with `tag`, and
/// opens it on the reader's side.
fn batch(w: &mut ArenaWriter, r: &ArenaReader, len: usize, tag: u8) -> RecordHandle {
    let rec = w.alloc(len).unwrap();
    w.payload_mut(rec).fill(tag);
    w.publish(rec);
    connect(w, r);
    r.open(rec).unwrap()
}

/// Polls `cond` for up to 10 s (the reaper is another thread).
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..1000 {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

#[test]
fn a_segment_is_registered_once_and_growth_registers_only_the_new_one() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), true);
    let (mut w, r) = arena();
    let a = pin.hold(0, batch(&mut w, &r, 1000, 1));
    let b = pin.hold(0, batch(&mut w, &r, 1000, 2));
    assert!(a.is_pinned() && b.is_pinned());
    assert_eq!(fake.registered().len(), 1, "one segment, one registration");
    // a record larger than the first segment: the arena grows by a segment
    let big = pin.hold(0, batch(&mut w, &r, 200 * 1024, 3));
    assert_eq!(big.record().segment, 1);
    let regs = fake.registered();
    assert_eq!(regs.len(), 2);
    assert_eq!(regs[1].1, big.segment().len());
    let again = pin.hold(0, batch(&mut w, &r, 1000, 4));
    assert_eq!(fake.registered().len(), 2, "no registration per batch");
    assert_eq!(pin.counts().segments, 2);
    // another worker's segment 0 is its own registration
    let (mut w2, r2) = arena();
    let c = pin.hold(1, batch(&mut w2, &r2, 100, 5));
    assert_eq!(fake.registered().len(), 3);
    assert!(pin.is_registered(1, 0) && pin.is_registered(0, 1));
    drop((a, b, big, again, c));
}

/// Whether the worker's next allocation of `len` bytes reuses `rec`.
fn reused(w: &mut ArenaWriter, rec: crate::ring::RecordRef, len: usize) -> bool {
    w.reclaim();
    let n = w.alloc(len).unwrap();
    let same = n.offset == rec.offset && n.segment == rec.segment;
    w.abandon(n);
    same
}

#[test]
fn a_freed_record_waits_for_its_fence_before_the_worker_may_reuse_it() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), true);
    pin.tick(&[S1]);
    let (mut w, r) = arena();
    let held = pin.hold(0, batch(&mut w, &r, 4096, 7));
    let rec = held.record();
    // an asynchronous copy is queued on S1, then the tensor is dropped
    fake.enqueue(S1);
    drop(held);
    assert_eq!(
        fake.state.lock().unwrap().fences,
        0,
        "fenced at the next tick"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(!reused(&mut w, rec, 4096), "released before any fence");
    pin.tick(&[S1]);
    assert!(eventually(|| fake.state.lock().unwrap().fences == 1));
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !reused(&mut w, rec, 4096),
        "the record was reused while its copy was still queued"
    );
    // the stream runs the copy: the fence passes and the record comes back
    fake.run(S1);
    assert!(eventually(|| reused(&mut w, rec, 4096)));
    assert_eq!(pin.counts().fenced, 1);
}

#[test]
fn without_the_guard_the_record_is_reused_under_a_pending_copy() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), false);
    pin.note_stream(S1);
    let (mut w, r) = arena();
    let held = pin.hold(0, batch(&mut w, &r, 4096, 7));
    let rec = held.record();
    fake.enqueue(S1);
    drop(held);
    w.reclaim();
    let next = w.alloc(4096).unwrap();
    assert_eq!(next.offset, rec.offset, "released at once");
}

#[test]
fn one_fence_covers_every_stream_current_at_a_tick_and_all_records_freed_since() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), true);
    pin.tick(&[S0]);
    pin.tick(&[S0]);
    assert_eq!(pin.streams(), vec![S0]);
    let (mut w, r) = arena();
    let a = pin.hold(0, batch(&mut w, &r, 4096, 1));
    let b = pin.hold(0, batch(&mut w, &r, 4096, 2));
    let (ra, rb) = (a.record(), b.record());
    fake.enqueue(S0);
    fake.enqueue(S1);
    drop((a, b));
    // the loop's next next() runs with S1 current
    pin.tick(&[S1]);
    assert_eq!(pin.streams(), vec![S0, S1]);
    assert!(
        eventually(|| fake.state.lock().unwrap().fences == 1),
        "one fence for both"
    );
    fake.run(S0);
    std::thread::sleep(Duration::from_millis(50));
    assert!(!reused(&mut w, ra, 4096), "S1's copy had not run yet");
    fake.run(S1);
    assert!(eventually(|| reused(&mut w, ra, 4096)));
    let n = w.alloc(4096).unwrap();
    assert!(eventually(|| reused(&mut w, rb, 4096)));
    w.abandon(n);
}

#[test]
fn after_close_a_freed_record_is_fenced_at_once() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), true);
    pin.tick(&[S0]);
    let (mut w, r) = arena();
    let held = pin.hold(0, batch(&mut w, &r, 4096, 1));
    let rec = held.record();
    pin.close();
    fake.enqueue(S0);
    drop(held);
    assert!(eventually(|| fake.state.lock().unwrap().fences == 1));
    std::thread::sleep(Duration::from_millis(50));
    assert!(!reused(&mut w, rec, 4096));
    fake.run(S0);
    assert!(eventually(|| reused(&mut w, rec, 4096)));
}

#[test]
fn unregistering_waits_for_the_last_record_and_precedes_the_unmap() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), true);
    pin.tick(&[S0]);
    let (mut w, r) = arena();
    let held = pin.hold(0, batch(&mut w, &r, 4096, 1));
    let base = held.segment().as_ptr() as usize;
    pin.close();
    drop(pin);
    assert!(fake.unregistered().is_empty(), "a record is still held");
    fake.enqueue(S0);
    drop(held);
    std::thread::sleep(Duration::from_millis(50));
    assert!(fake.unregistered().is_empty(), "its fence has not passed");
    fake.run(S0);
    assert!(eventually(|| fake.unregistered() == vec![base]));
}

#[test]
fn a_failed_registration_leaves_records_unpinned_and_is_reported_once() {
    let fake = Arc::new(Fake::default());
    fake.state.lock().unwrap().fail_register = true;
    let pin = Pinning::new(fake.clone(), true);
    let (mut w, r) = arena();
    let a = pin.hold(0, batch(&mut w, &r, 100, 1));
    let b = pin.hold(0, batch(&mut w, &r, 100, 2));
    assert!(!a.is_pinned() && !b.is_pinned());
    assert_eq!(pin.counts().failed, 1, "not retried per batch");
    assert!(pin.first_error().unwrap().contains("cudaHostRegister"));
    let rec = a.record();
    drop(a);
    w.reclaim();
    let n = w.alloc(100).unwrap();
    assert_eq!(
        n.offset, rec.offset,
        "an unpinned record is released at once"
    );
    drop(b);
}

#[test]
fn without_a_fence_the_devices_are_synchronized_before_the_release() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), true);
    pin.tick(&[S1]);
    let (mut w, r) = arena();
    let held = pin.hold(0, batch(&mut w, &r, 100, 1));
    let rec = held.record();
    fake.state.lock().unwrap().fail_fence = true;
    fake.enqueue(S1);
    drop(held);
    pin.tick(&[]);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !reused(&mut w, rec, 100),
        "released before the device was idle"
    );
    fake.run(S1);
    assert!(eventually(|| reused(&mut w, rec, 100)));
    assert!(eventually(|| fake.state.lock().unwrap().syncs == 1));
    assert_eq!(pin.counts().synchronized, 1);
}

#[test]
fn the_reaper_thread_ends_with_its_last_record() {
    let fake = Arc::new(Fake::default());
    let pin = Pinning::new(fake.clone(), true);
    let (mut w, r) = arena();
    let held = pin.hold(0, batch(&mut w, &r, 100, 1));
    let weak = Arc::downgrade(&pin);
    drop(pin);
    assert!(weak.upgrade().is_some(), "the record keeps its pinning");
    drop(held);
    // the runtime is shared by the reaper, the registration and the test:
    // once the reaper is done with the retired record, only the test's share
    // remains
    assert!(eventually(|| Arc::strong_count(&fake) == 1));
    assert!(weak.upgrade().is_none());
}
