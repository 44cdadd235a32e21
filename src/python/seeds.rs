//! `ferroloader.seeds`' functions: the engine's one definition of each
//! seed (`crate::sampler::seeds`), for Python. Arguments are 64-bit
//! (`ferroloader.seeds` masks Python integers to 64 bits first); and
//! per-sample seeding, which the engine runs before each sample is read
//! without calling back into ferroloader's Python.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::{PyTraverseError, PyVisit};

use crate::sampler::seeds;

/// The seed of a seeded loader's generator for `epoch` (0-based).
#[pyfunction]
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    seeds::epoch_seed(seed, epoch)
}

/// The seed set before `dataset[index]` in `epoch` with `per_sample_seed`
/// (`index`: any key, see [`index_key`]).
#[pyfunction]
pub fn sample_seed(seed: u64, epoch: u64, index: &Bound<'_, PyAny>) -> PyResult<u64> {
    Ok(seeds::sample_seed(
        seed,
        epoch,
        index_key(index.py(), index)?,
    ))
}

/// Folds each part into `root`.
#[pyfunction]
pub fn derive(root: u64, parts: Vec<u64>) -> u64 {
    seeds::derive(root, &parts)
}

/// The seed of a sharded epoch's shard order, from the epoch's root.
#[pyfunction]
pub fn shard_order_seed(root: u64) -> u64 {
    seeds::shard_order_seed(root)
}

/// The seed of the order of block `block` of shard `shard`.
#[pyfunction]
pub fn block_seed(root: u64, shard: u32, block: u64) -> u64 {
    seeds::block_seed(root, shard, block)
}

/// The index that stands for item `offset` of shard `shard`.
#[pyfunction]
pub fn shard_item_index(shard: u64, offset: u64) -> u64 {
    seeds::shard_item_index(shard, offset)
}

/// The modules and objects per-sample seeding touches, looked up once.
struct Rngs {
    default_generator: Py<PyAny>,
    get_rng_state: Py<PyAny>,
    set_rng_state: Py<PyAny>,
    random: Py<PyAny>,
    /// `numpy.random`, if numpy is installed.
    np_random: Option<Py<PyAny>>,
    /// `ferroloader.worker.worker_local`: a worker thread's generators.
    worker_local: Py<PyAny>,
    index: Py<PyAny>,
    crc32: Py<PyAny>,
}

static RNGS: PyOnceLock<Rngs> = PyOnceLock::new();

fn rngs(py: Python<'_>) -> PyResult<&'static Rngs> {
    RNGS.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        Ok(Rngs {
            default_generator: torch.getattr("default_generator")?.unbind(),
            get_rng_state: torch.getattr("get_rng_state")?.unbind(),
            set_rng_state: torch.getattr("set_rng_state")?.unbind(),
            random: py.import("random")?.into_any().unbind(),
            np_random: py
                .import("numpy.random")
                .ok()
                .map(|m| m.into_any().unbind()),
            worker_local: py
                .import("ferroloader.worker")?
                .getattr("worker_local")?
                .unbind(),
            index: py.import("operator")?.getattr("index")?.unbind(),
            crc32: py.import("zlib")?.getattr("crc32")?.unbind(),
        })
    })
}

/// An index as `sample_seed` takes it: an integer (masked to 64 bits), or
/// for other keys (a sampler may yield any hashable) the CRC-32 of their
/// `repr`, the same in every process.
fn index_key(py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<u64> {
    // the common case, an int that fits 64 bits, without calls into Python
    if let Some(i) = index
        .cast::<pyo3::types::PyInt>()
        .ok()
        .and_then(|i| i.extract::<i64>().ok())
    {
        return Ok(i as u64);
    }
    let r = rngs(py)?;
    let int = match r.index.bind(py).call1((index,)) {
        Ok(i) => i,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
            let text = index.repr()?.to_string();
            r.crc32
                .bind(py)
                .call1((pyo3::types::PyBytes::new(py, text.as_bytes()),))?
        }
        Err(e) => return Err(e),
    };
    int.call_method1("__and__", (u64::MAX,))?.extract()
}

/// Seeds torch's CPU generator, `random` and numpy (low 32 bits) with
/// `s`; in a worker thread, the thread's own three
/// (`get_worker_info().rng`). `torch.manual_seed` would also seed every
/// accelerator's generators, at ~100x the cost; data workers draw on the CPU.
#[pyfunction]
pub fn seed_everything(py: Python<'_>, s: u64) -> PyResult<()> {
    let r = rngs(py)?;
    let info = r.worker_local.bind(py).getattr("info")?;
    if !info.is_none() {
        let rng = info.getattr("rng")?;
        rng.getattr("torch_generator")?
            .call_method1("manual_seed", (s,))?;
        rng.getattr("random_generator")?
            .call_method1("seed", (s,))?;
        let np = rng.getattr("numpy_generator")?;
        if !np.is_none() {
            np.call_method1("seed", (s & 0xFFFF_FFFF,))?;
        }
        return Ok(());
    }
    r.default_generator
        .bind(py)
        .call_method1("manual_seed", (s,))?;
    r.random.bind(py).call_method1("seed", (s,))?;
    if let Some(np) = &r.np_random {
        np.bind(py).call_method1("seed", (s & 0xFFFF_FFFF,))?;
    }
    Ok(())
}

/// `per_sample_seed=True`: seeds the generators right before each sample
/// is read, from `(seed, epoch, index)`; over a map-style dataset
/// (`seeder[i]` seeds, then reads `dataset[i]`) or a sharded one
/// (`seeder(shard, offset)` seeds before the item is drawn). In the main
/// process the loader calls `save()` before and `restore()` after each
/// batch, so a seeded loader leaves the user's generators untouched; a
/// worker calls `start_epoch()` at each epoch it serves.
#[pyclass(frozen, module = "ferroloader._core")]
pub struct SampleSeeder {
    seed: u64,
    epoch: AtomicU64,
    started: AtomicBool,
    dataset: Option<Py<PyAny>>,
    saved: Mutex<Option<Py<PyAny>>>,
}

#[pymethods]
impl SampleSeeder {
    #[new]
    #[pyo3(signature = (seed, epoch, dataset=None, started=false))]
    fn new(seed: u64, epoch: u64, dataset: Option<Py<PyAny>>, started: bool) -> Self {
        SampleSeeder {
            seed,
            epoch: AtomicU64::new(epoch),
            started: AtomicBool::new(started),
            dataset,
            saved: Mutex::new(None),
        }
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    #[getter]
    fn dataset(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.dataset.as_ref().map(|d| d.clone_ref(py))
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(dataset) = &self.dataset else {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "this SampleSeeder seeds shard items, it wraps no dataset",
            ));
        };
        let key = index_key(py, index)?;
        seed_everything(py, seeds::sample_seed(self.seed, self.epoch(), key))?;
        dataset.bind(py).get_item(index)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.dataset {
            Some(d) => d.bind(py).len(),
            None => Err(pyo3::exceptions::PyTypeError::new_err(
                "this SampleSeeder wraps no dataset",
            )),
        }
    }

    /// Before item `offset` of shard `shard` is drawn.
    fn __call__(&self, py: Python<'_>, shard: u64, offset: u64) -> PyResult<()> {
        let key = seeds::shard_item_index(shard, offset);
        seed_everything(py, seeds::sample_seed(self.seed, self.epoch(), key))
    }

    /// Keeps the global generators' states (before a batch in the main process).
    fn save(&self, py: Python<'_>) -> PyResult<()> {
        let r = rngs(py)?;
        let torch_state = r.get_rng_state.bind(py).call0()?;
        let random_state = r.random.bind(py).call_method0("getstate")?;
        let np_state = match &r.np_random {
            Some(np) => np.bind(py).call_method0("get_state")?,
            None => py.None().into_bound(py),
        };
        let states = (torch_state, random_state, np_state).into_pyobject(py)?;
        *self.lock() = Some(states.into_any().unbind());
        Ok(())
    }

    /// Puts back what `save()` kept.
    fn restore(&self, py: Python<'_>) -> PyResult<()> {
        let Some(states) = self.lock().take() else {
            return Ok(());
        };
        let r = rngs(py)?;
        let (torch_state, random_state, np_state): (
            Bound<'_, PyAny>,
            Bound<'_, PyAny>,
            Bound<'_, PyAny>,
        ) = states.bind(py).extract()?;
        r.set_rng_state.bind(py).call1((torch_state,))?;
        r.random
            .bind(py)
            .call_method1("setstate", (random_state,))?;
        if let Some(np) = &r.np_random {
            np.bind(py).call_method1("set_state", (np_state,))?;
        }
        Ok(())
    }

    /// A worker starts serving an epoch: the first is the one it was made
    /// for; each later one (persistent workers) is the next.
    fn start_epoch(&self) {
        if self.started.swap(true, Ordering::Relaxed) {
            self.epoch.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Travels to worker processes as its arguments.
    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (u64, u64, Option<Py<PyAny>>, bool))> {
        let me = slf.get();
        let args = (
            me.seed,
            me.epoch(),
            me.dataset(slf.py()),
            me.started.load(Ordering::Relaxed),
        );
        Ok((slf.get_type().into_any(), args))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.dataset)?;
        if let Ok(saved) = self.saved.try_lock() {
            visit.call(saved.as_ref())?;
        }
        Ok(())
    }
}

impl SampleSeeder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Py<PyAny>>> {
        self.saved.lock().unwrap_or_else(|e| e.into_inner())
    }
}
