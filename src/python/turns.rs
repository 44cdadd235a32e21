//! Taking turns on an iterator that several threads use at once.
//!
//! PyO3 guards each object with a borrow flag, and a second borrow fails
//! with "Already borrowed". For a loader's or sampler's iterator that is
//! the wrong answer: a thread waiting in `next()` (detached, for a batch)
//! holds the flag, and another thread's `next()`, `state_dict()` or
//! `stats()` is a fair request that should wait its turn. Only a call from
//! the thread that holds the flag (the user's code, run from `next()`,
//! calling back into the same iterator) cannot wait: that is a clear error.

use std::cell::RefCell;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::False;
use pyo3::PyClass;

thread_local! {
    /// The objects this thread holds through [`with_mut`].
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

struct Held(usize);

impl Held {
    fn new(key: usize) -> Self {
        HELD.with(|h| h.borrow_mut().push(key));
        Held(key)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|&k| k == self.0) {
                h.remove(i);
            }
        });
    }
}

/// Tries `attempt` until it succeeds, detached between tries so the holder
/// (which may need the interpreter to finish) goes on: a few yields, then
/// sleeps growing to 0.8 ms, so a long wait does not spin a core.
fn in_turn<'py, T: PyClass, B>(
    slf: &Bound<'py, T>,
    what: &str,
    attempt: impl Fn(&Bound<'py, T>) -> Option<B>,
) -> PyResult<B> {
    let py = slf.py();
    let key = slf.as_ptr() as usize;
    let mut tries = 0u32;
    loop {
        if let Some(b) = attempt(slf) {
            return Ok(b);
        }
        if HELD.with(|h| h.borrow().contains(&key)) {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "{what} was called on a {} from inside its own next() (the dataset's or \
                 collate_fn's code, on the thread running it): call it between batches",
                T::NAME
            )));
        }
        py.detach(|| {
            if tries < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50 << (tries - 16).min(4)));
            }
        });
        tries += 1;
    }
}

/// `f` on `slf` borrowed mutably, once no other thread holds it.
pub fn with_mut<'py, T, R>(
    slf: &Bound<'py, T>,
    what: &str,
    f: impl FnOnce(PyRefMut<'py, T>) -> PyResult<R>,
) -> PyResult<R>
where
    T: PyClass<Frozen = False>,
{
    let it = in_turn(slf, what, |s| s.try_borrow_mut().ok())?;
    let _held = Held::new(slf.as_ptr() as usize);
    f(it)
}

/// `f` on `slf` borrowed, once no other thread holds it mutably.
pub fn with_ref<'py, T, R>(
    slf: &Bound<'py, T>,
    what: &str,
    f: impl FnOnce(PyRef<'py, T>) -> R,
) -> PyResult<R>
where
    T: PyClass<Frozen = False>,
{
    Ok(f(in_turn(slf, what, |s| s.try_borrow().ok())?))
}
