//! Samplers exposed to Python: the engine's iterators driven with torch's
//! generators.

use std::collections::VecDeque;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyList};
use pyo3::{PyTraverseError, PyVisit};

use super::error::Class;
use super::ffi::DlView;
use super::torch::torch;
use super::turns::with_mut;
use crate::sampler::{
    distributed_indices, randperm_recent, BatchIter, Distributed, IndexSource, IndexVec, Mt19937,
    RandomIter, RngSource, SeededOnFirstUse, SequentialIter, SubsetRandomIter,
};

/// A user's (or the global) `torch.Generator`, which torch itself draws
/// from: each draw is one torch op, made under the generator's own lock, so
/// no other thread's draw (ferroloader's or the user's) can land between the
/// read and the write of its state, and torch sees exactly the draws torch
/// would make.
pub struct TorchGen {
    generator: Py<PyAny>,
}

impl TorchGen {
    fn new(py: Python<'_>, generator: Option<Py<PyAny>>) -> PyResult<Self> {
        let generator = match generator {
            Some(g) => g,
            None => torch(py)?.default_generator.clone_ref(py),
        };
        Ok(TorchGen { generator })
    }

    /// `op(*args, generator=g, device="cpu", dtype=dtype)`: the draws are
    /// those torch's samplers make, on the CPU whatever the default device.
    fn call<'py>(
        &self,
        py: Python<'py>,
        op: &Py<PyAny>,
        args: impl pyo3::call::PyCallArgs<'py>,
        dtype: &Py<PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kwargs = PyDict::new(py);
        kwargs.set_item(pyo3::intern!(py, "generator"), &self.generator)?;
        kwargs.set_item(pyo3::intern!(py, "device"), pyo3::intern!(py, "cpu"))?;
        kwargs.set_item(pyo3::intern!(py, "dtype"), dtype)?;
        op.bind(py).call(args, Some(&kwargs))
    }

    /// `randperm(n)` from the loader's own generator, drawn here from its
    /// state (torch's algorithm, draw for draw) and written back, so that a
    /// resume beside a live iterator of the same epoch takes that
    /// iterator's permutation over (`randperm_recent`). Only for a
    /// generator no one else draws from: between the read and the write of
    /// its state, another's draw would be lost.
    fn randperm_own(&mut self, n: usize) -> PyResult<Arc<IndexVec>> {
        Python::attach(|py| {
            let g = self.generator.bind(py);
            let state = g.call_method0(pyo3::intern!(py, "get_state"))?;
            let mut bytes = tensor_values::<u8>(&state)?;
            let Ok(mut rng) = Mt19937::from_state_bytes(&bytes) else {
                // (not a state this engine reads: torch draws)
                return self.randperm(n).map(Arc::new);
            };
            let perm = randperm_recent(n, &mut rng);
            rng.write_state_bytes(&mut bytes)
                .map_err(|e| Class::Internal.err(e.to_string()))?;
            let t = torch(py)?;
            let kwargs = PyDict::new(py);
            kwargs.set_item(pyo3::intern!(py, "dtype"), &t.uint8)?;
            let written = t
                .frombuffer
                .bind(py)
                .call((PyByteArray::new(py, &bytes),), Some(&kwargs))?;
            g.call_method1(pyo3::intern!(py, "set_state"), (written,))?;
            Ok(perm)
        })
    }
}

/// A 1-d CPU tensor torch just made, copied out as `T`s.
fn tensor_values<T: bytemuck::Pod>(tensor: &Bound<'_, PyAny>) -> PyResult<Vec<T>> {
    let view = DlView::of_array(tensor)
        .ok_or_else(|| Class::Internal.err("a drawn tensor has no DLPack export"))?;
    let bytes = view
        .contiguous_bytes()
        .ok_or_else(|| Class::Internal.err("a drawn tensor is not contiguous CPU memory"))?;
    let mut out = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(bytes);
    Ok(out)
}

impl RngSource for TorchGen {
    type Error = PyErr;
    fn randperm(&mut self, n: usize) -> PyResult<IndexVec> {
        Python::attach(|py| {
            let t = torch(py)?;
            // the draws do not depend on the dtype: int32 where it holds n
            // gives the compact form without a conversion
            if n <= i32::MAX as usize {
                let perm = self.call(py, &t.randperm, (n,), &t.int32)?;
                Ok(IndexVec::U32(tensor_values(&perm)?))
            } else {
                let perm = self.call(py, &t.randperm, (n,), &t.int64)?;
                Ok(IndexVec::I64(tensor_values(&perm)?))
            }
        })
    }

    fn randint(&mut self, high: i64, count: usize, out: &mut Vec<i64>) -> PyResult<()> {
        Python::attach(|py| {
            let t = torch(py)?;
            let drawn = self.call(py, &t.randint, (high, (count,)), &t.int64)?;
            out.extend(tensor_values::<i64>(&drawn)?);
            Ok(())
        })
    }

    fn random_int64(&mut self) -> PyResult<i64> {
        Python::attach(|py| {
            let t = torch(py)?;
            let kwargs = PyDict::new(py);
            kwargs.set_item(pyo3::intern!(py, "dtype"), &t.int64)?;
            kwargs.set_item(pyo3::intern!(py, "device"), pyo3::intern!(py, "cpu"))?;
            let empty = t.empty.bind(py).call(((),), Some(&kwargs))?;
            let kwargs = PyDict::new(py);
            kwargs.set_item(pyo3::intern!(py, "generator"), &self.generator)?;
            empty
                .call_method(pyo3::intern!(py, "random_"), (), Some(&kwargs))?
                .call_method0(pyo3::intern!(py, "item"))?
                .extract()
        })
    }
}

/// The generator a random sampler draws from.
pub enum Rng {
    /// `generator=` given: the user's generator, shared.
    Shared(TorchGen),
    /// `RandomSampler(generator=None)`: a private generator seeded from the
    /// global one on first use.
    Private(SeededOnFirstUse<TorchGen>),
    /// The loader's own generator (`seed=`), which only the loader draws
    /// from: a permutation is drawn here from its state (see `randperm_own`).
    Own(TorchGen),
}

impl Rng {
    fn source(&mut self) -> &mut dyn RngSource<Error = PyErr> {
        match self {
            Rng::Shared(g) | Rng::Own(g) => g,
            Rng::Private(g) => g,
        }
    }
}

impl RngSource for Rng {
    type Error = PyErr;
    fn randperm(&mut self, n: usize) -> PyResult<IndexVec> {
        self.source().randperm(n)
    }
    fn randperm_shared(&mut self, n: usize) -> PyResult<Arc<IndexVec>> {
        match self {
            Rng::Own(g) => g.randperm_own(n),
            _ => self.source().randperm_shared(n),
        }
    }
    fn private(&self) -> bool {
        matches!(self, Rng::Private(_))
    }
    fn randint(&mut self, high: i64, count: usize, out: &mut Vec<i64>) -> PyResult<()> {
        self.source().randint(high, count, out)
    }
    fn random_int64(&mut self) -> PyResult<i64> {
        self.source().random_int64()
    }
}

/// `WeightedRandomSampler`: one `torch.multinomial` call on first use.
/// The arguments of that call: weights, num_samples, replacement, generator.
type MultinomialArgs = (Py<PyAny>, Py<PyAny>, Py<PyAny>, Option<Py<PyAny>>);

pub struct Weighted {
    args: Option<MultinomialArgs>,
    drawn: std::vec::IntoIter<i64>,
}

impl IndexSource for Weighted {
    type Index = i64;
    type Error = PyErr;
    fn next_index(&mut self) -> PyResult<Option<i64>> {
        if let Some((weights, num_samples, replacement, generator)) = self.args.take() {
            self.drawn = Python::attach(|py| -> PyResult<_> {
                let kwargs = PyDict::new(py);
                kwargs.set_item("generator", generator)?;
                let drawn = torch(py)?
                    .multinomial
                    .bind(py)
                    .call((weights, num_samples, replacement), Some(&kwargs))?;
                let list: Vec<i64> = drawn.call_method0("tolist")?.extract()?;
                Ok(list.into_iter())
            })?;
        }
        Ok(self.drawn.next())
    }
}

impl TorchGen {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.generator)
    }
}

impl Rng {
    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Rng::Shared(g) | Rng::Own(g) | Rng::Private(SeededOnFirstUse::Pending(g)) => {
                g.traverse(visit)
            }
            Rng::Private(SeededOnFirstUse::Ready(_)) => Ok(()),
        }
    }
}

impl NativeSampler {
    /// Reports the Python objects held, for the cycle collector.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            NativeSampler::Deferred { sampler, resolve } => {
                visit.call(sampler)?;
                visit.call(resolve)
            }
            NativeSampler::Fallback(it) => visit.call(it),
            NativeSampler::Random(r) => r.rng().traverse(visit),
            NativeSampler::SubsetRandom(r) => r.rng().traverse(visit),
            NativeSampler::Weighted(w) => {
                if let Some((a, b, c, d)) = &w.args {
                    visit.call(a)?;
                    visit.call(b)?;
                    visit.call(c)?;
                    visit.call(d)?;
                }
                Ok(())
            }
            NativeSampler::Sequential(_) | NativeSampler::List(_) => Ok(()),
        }
    }
}

/// A sampler the engine runs natively.
pub enum NativeSampler {
    /// Not built yet: torch's `__iter__` is a generator that reads the
    /// sampler's attributes on the first `next()`, so this does too, by
    /// calling `resolve(sampler)` (a native iterator, or torch's own one).
    Deferred {
        sampler: Py<PyAny>,
        resolve: Py<PyAny>,
    },
    /// torch's own iterator, for configurations the engine leaves to torch
    /// (they yield Python ints).
    Fallback(Py<PyAny>),
    Sequential(SequentialIter),
    Random(RandomIter<Rng>),
    SubsetRandom(SubsetRandomIter<Rng>),
    Weighted(Weighted),
    List(std::vec::IntoIter<i64>),
}

impl IndexSource for NativeSampler {
    type Index = i64;
    type Error = PyErr;
    fn next_index(&mut self) -> PyResult<Option<i64>> {
        if let NativeSampler::Deferred { sampler, resolve } = self {
            *self = Python::attach(|py| -> PyResult<NativeSampler> {
                let it = resolve.bind(py).call1((sampler.bind(py),))?;
                Ok(match it.cast::<SamplerIter>() {
                    Ok(native) => native.borrow_mut().take().0,
                    Err(_) => NativeSampler::Fallback(it.unbind()),
                })
            })?;
        }
        match self {
            NativeSampler::Deferred { .. } => unreachable!("resolved above"),
            NativeSampler::Fallback(it) => {
                Python::attach(|py| match super::fetch::next(it.bind(py))? {
                    Some(v) => v.extract().map(Some),
                    None => Ok(None),
                })
            }
            NativeSampler::Sequential(s) => Ok(s.next_index().unwrap_or(None)),
            NativeSampler::Random(s) => s.next_index(),
            NativeSampler::SubsetRandom(s) => s.next_index(),
            NativeSampler::Weighted(s) => s.next_index(),
            NativeSampler::List(s) => Ok(s.next()),
        }
    }
}

/// Iterator over a native sampler's indices (Python ints).
#[pyclass(module = "ferroloader._core")]
pub struct SamplerIter {
    pub inner: NativeSampler,
    /// Indices handed out before `inner`'s (a resumed epoch's batches that
    /// were in flight when the snapshot was taken).
    prefix: VecDeque<i64>,
}

impl SamplerIter {
    fn of(inner: NativeSampler) -> Self {
        SamplerIter {
            inner,
            prefix: VecDeque::new(),
        }
    }

    /// Takes the sampler out, leaving an empty one (a `BatchSampler` now
    /// drives it).
    fn take(&mut self) -> (NativeSampler, VecDeque<i64>) {
        let inner = std::mem::replace(&mut self.inner, NativeSampler::List(Vec::new().into_iter()));
        (inner, std::mem::take(&mut self.prefix))
    }

    /// The next index: the prefix's, then the sampler's.
    pub fn next_one(&mut self) -> PyResult<Option<i64>> {
        match self.prefix.pop_front() {
            Some(i) => Ok(Some(i)),
            None => self.inner.next_index(),
        }
    }
}

#[pymethods]
impl SamplerIter {
    /// A sampler resolved on the first `next()` by `resolve(sampler)`.
    #[staticmethod]
    fn deferred(sampler: Py<PyAny>, resolve: Py<PyAny>) -> Self {
        SamplerIter::of(NativeSampler::Deferred { sampler, resolve })
    }

    #[staticmethod]
    fn sequential(n: usize) -> Self {
        SamplerIter::of(NativeSampler::Sequential(SequentialIter::new(n)))
    }

    #[staticmethod]
    #[pyo3(signature = (n, num_samples, replacement, generator=None, own=false))]
    fn random(
        py: Python<'_>,
        n: usize,
        num_samples: usize,
        replacement: bool,
        generator: Option<Py<PyAny>>,
        own: bool,
    ) -> PyResult<Self> {
        let rng = match generator {
            Some(g) if own => Rng::Own(TorchGen::new(py, Some(g))?),
            Some(g) => Rng::Shared(TorchGen::new(py, Some(g))?),
            None => Rng::Private(SeededOnFirstUse::Pending(TorchGen::new(py, None)?)),
        };
        Ok(SamplerIter::of(NativeSampler::Random(RandomIter::new(
            n,
            num_samples,
            replacement,
            rng,
        ))))
    }

    /// `randperm(n, generator=generator)` drawn now (torchdata's
    /// `RandomSampler` draws its permutation when iterated, not on first use).
    #[staticmethod]
    fn permutation(py: Python<'_>, n: usize, generator: Py<PyAny>) -> PyResult<Self> {
        let perm = TorchGen::new(py, Some(generator))?.randperm(n)?.into_i64();
        Ok(SamplerIter::of(NativeSampler::List(perm.into_iter())))
    }

    #[staticmethod]
    #[pyo3(signature = (indices, generator=None))]
    fn subset_random(
        py: Python<'_>,
        indices: Vec<i64>,
        generator: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let rng = Rng::Shared(TorchGen::new(py, generator)?);
        Ok(SamplerIter::of(NativeSampler::SubsetRandom(
            SubsetRandomIter::new(indices, rng),
        )))
    }

    #[staticmethod]
    #[pyo3(signature = (weights, num_samples, replacement, generator=None))]
    fn weighted(
        weights: Py<PyAny>,
        num_samples: Py<PyAny>,
        replacement: Py<PyAny>,
        generator: Option<Py<PyAny>>,
    ) -> Self {
        SamplerIter::of(NativeSampler::Weighted(Weighted {
            args: Some((weights, num_samples, replacement, generator)),
            drawn: Vec::new().into_iter(),
        }))
    }

    /// A fixed list of indices (a sampler whose epoch was drawn up front).
    #[staticmethod]
    fn from_list(indices: Vec<i64>) -> Self {
        SamplerIter::of(NativeSampler::List(indices.into_iter()))
    }

    /// `DistributedSampler`'s epoch (see `Distributed` for the keys).
    #[staticmethod]
    fn distributed(spec: Distributed) -> Option<Self> {
        // An inconsistent sampler (torch would fail an assertion): `None`,
        // and the caller lets torch's own `__iter__` raise its error.
        let indices = distributed_indices(&spec).ok()?;
        Some(SamplerIter::of(NativeSampler::List(indices.into_iter())))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.inner.traverse(&visit)
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        // (without borrowing: another thread's next() may hold the object)
        slf
    }

    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<i64>> {
        // (two threads on one iterator take turns, as torch's generators
        // would refuse them: no index is handed out twice or skipped)
        with_mut(slf, "next()", |mut it| it.next_one())
    }

    /// Draws and drops `n` indices (a resumed epoch's part already seen);
    /// how many there were.
    fn _skip(&mut self, n: usize) -> PyResult<usize> {
        for done in 0..n {
            if self.next_one()?.is_none() {
                return Ok(done);
            }
        }
        Ok(n)
    }

    /// Hands out `indices` before anything else.
    fn _prepend(&mut self, indices: Vec<i64>) {
        for i in indices.into_iter().rev() {
            self.prefix.push_front(i);
        }
    }
}

/// A sampler iterated in Python: `iter()` is called on the first pull, as
/// torch's `BatchSampler` does inside its generator.
pub struct PyIndexSource {
    iterable: Py<PyAny>,
    iter: Option<Py<PyAny>>,
}

impl IndexSource for PyIndexSource {
    type Index = Py<PyAny>;
    type Error = PyErr;
    fn next_index(&mut self) -> PyResult<Option<Py<PyAny>>> {
        Python::attach(|py| {
            if self.iter.is_none() {
                self.iter = Some(self.iterable.bind(py).try_iter()?.into_any().unbind());
            }
            let it = self.iter.as_ref().expect("set above").bind(py);
            let it = it.cast::<pyo3::types::PyIterator>()?;
            match it.clone().next() {
                Some(Ok(v)) => Ok(Some(v.unbind())),
                Some(Err(e)) => Err(e),
                None => Ok(None),
            }
        })
    }
}

pub enum Batches {
    Native(BatchIter<NativeSampler>, Vec<i64>),
    Python(BatchIter<PyIndexSource>, Vec<Py<PyAny>>),
}

/// `BatchSampler.__iter__`: lists of indices.
#[pyclass(module = "ferroloader._core")]
pub struct BatchSamplerIter {
    pub inner: Batches,
    /// Batches handed out before `inner`'s (native batches only; see
    /// `SamplerIter::prefix`).
    prefix: VecDeque<Vec<i64>>,
}

impl BatchSamplerIter {
    /// The next batch as a list.
    pub fn next_list<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        match &mut self.inner {
            Batches::Native(..) => match self.next_native()? {
                Some(batch) => Ok(Some(PyList::new(py, batch.iter())?)),
                None => Ok(None),
            },
            Batches::Python(it, buf) => {
                if it.next_batch(buf)? {
                    Ok(Some(PyList::new(py, buf.drain(..))?))
                } else {
                    Ok(None)
                }
            }
        }
    }

    /// The next batch: native indices, or Python objects as a list.
    pub fn next_native(&mut self) -> PyResult<Option<&[i64]>> {
        match &mut self.inner {
            Batches::Native(it, buf) => {
                if let Some(batch) = self.prefix.pop_front() {
                    *buf = batch;
                    return Ok(Some(buf));
                }
                Ok(if it.next_batch(buf)? { Some(buf) } else { None })
            }
            Batches::Python(..) => Ok(None),
        }
    }

    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.inner {
            Batches::Native(it, _) => it.source().traverse(visit),
            Batches::Python(it, buf) => {
                let src = it.source();
                visit.call(&src.iterable)?;
                visit.call(&src.iter)?;
                for obj in buf {
                    visit.call(obj)?;
                }
                Ok(())
            }
        }
    }

    pub fn is_native_batches(&self) -> bool {
        matches!(self.inner, Batches::Native(..))
    }
}

#[pymethods]
impl BatchSamplerIter {
    #[new]
    fn new(source: &Bound<'_, PyAny>, batch_size: usize, drop_last: bool) -> PyResult<Self> {
        let inner = match source.cast::<SamplerIter>() {
            Ok(native) => {
                let (sampler, prefix) = native.borrow_mut().take();
                if !prefix.is_empty() {
                    return Err(Class::Internal.err("a resumed sampler cannot be batched"));
                }
                Batches::Native(BatchIter::new(sampler, batch_size, drop_last), Vec::new())
            }
            Err(_) => Batches::Python(
                BatchIter::new(
                    PyIndexSource {
                        iterable: source.clone().unbind(),
                        iter: None,
                    },
                    batch_size,
                    drop_last,
                ),
                Vec::new(),
            ),
        };
        Ok(BatchSamplerIter {
            inner,
            prefix: VecDeque::new(),
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.traverse(&visit)
    }

    /// True when batches come from a native sampler (plain int indices).
    #[getter]
    fn is_native(&self) -> bool {
        matches!(self.inner, Batches::Native(..))
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        // (without borrowing: another thread's next() may hold the object)
        slf
    }

    /// Draws and drops `n` batches without building them in Python (a
    /// resumed epoch's part already seen); how many there were.
    fn _skip(&mut self, py: Python<'_>, n: usize) -> PyResult<usize> {
        for done in 0..n {
            let more = match self.inner {
                Batches::Native(..) => self.next_native()?.is_some(),
                Batches::Python(..) => self.next_list(py)?.is_some(),
            };
            if !more {
                return Ok(done);
            }
        }
        Ok(n)
    }

    /// Hands out `batches` before anything else (native batches only).
    fn _prepend(&mut self, batches: Vec<Vec<i64>>) -> PyResult<()> {
        if !self.is_native_batches() {
            return Err(Class::Internal.err("_prepend needs native batches"));
        }
        for b in batches.into_iter().rev() {
            self.prefix.push_front(b);
        }
        Ok(())
    }

    fn __next__<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyList>>> {
        let py = slf.py();
        with_mut(slf, "next()", |mut it| it.next_list(py))
    }
}

/// `torch.randperm(n, generator=g).tolist()`, drawn here from `g` (the
/// global generator when `None`), leaving `g` where torch would.
#[pyfunction]
#[pyo3(name = "randperm", signature = (n, generator=None))]
pub fn randperm_list(py: Python<'_>, n: usize, generator: Option<Py<PyAny>>) -> PyResult<Vec<i64>> {
    let mut g = TorchGen::new(py, generator)?;
    Ok(g.randperm(n)?.into_i64())
}
