//! Test doubles for the Python tests, compiled only with the
//! `test-doubles` feature (`scripts/test` builds the module it tests with
//! it; the wheel users install has none of this): a model of the CUDA
//! runtime for pinned arenas on machines without a GPU, and a panic at the
//! boundary.

mod fake_cuda;

use pyo3::prelude::*;

use crate::python::{guard, PinArena};
use fake_cuda::FakeCudaRuntime;

/// For the tests: a panic inside the boundary's guard (what a defect
/// would do).
#[pyfunction]
fn _panic_in_guard() -> PyResult<()> {
    guard("a deliberate test", || panic!("on purpose"))
}

/// Pinned arenas over the fake runtime. `guard=False` releases freed
/// records at once, to show what the reuse guard prevents.
#[pyfunction]
#[pyo3(signature = (runtime, stream_fn, guard=true))]
fn _fake_pin_arena(
    runtime: &Bound<'_, FakeCudaRuntime>,
    stream_fn: Py<PyAny>,
    guard: bool,
) -> PinArena {
    PinArena::with_runtime(runtime.get().runtime.clone(), stream_fn, guard)
}

/// Adds the doubles to `_core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_panic_in_guard, m)?)?;
    m.add_function(wrap_pyfunction!(_fake_pin_arena, m)?)?;
    m.add_class::<FakeCudaRuntime>()
}
