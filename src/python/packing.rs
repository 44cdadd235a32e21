//! `ferroloader.Packing`'s engine: sequences gathered into a ragged batch
//! (`ragged`, a collate function) and packed into rows (`Packer`), each a
//! Rust loop over the sequences.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMapping};

use super::error::Class;
use super::ffi::{DlDtype, DlView, FreshTensor, DL_CPU};
use super::torch::torch;
use crate::collate::packing::{Fit, Packed, Packer as Core};

/// One sequence's tokens as `i64`: a 1-D integer tensor or array on the
/// CPU (any integer width), else a Python sequence of ints.
fn tokens_of(item: &Bound<'_, PyAny>, at: usize) -> PyResult<Vec<i64>> {
    if let Some(view) = DlView::of_array(item) {
        let dt = view.dtype();
        let shape = view.shape();
        let bytes = view.contiguous_bytes();
        let int = matches!(dt.code, 0 | 1) && dt.lanes == 1 && matches!(dt.bits, 8 | 16 | 32 | 64);
        let (true, 1, DL_CPU, Some(bytes)) = (int, shape.len(), view.device_type(), bytes) else {
            return Err(Class::Config.err(format!(
                "Packing: sample {at} is not a 1-D integer sequence on the CPU (shape {shape:?}, \
                 dtype {}); packing needs integer token ids: a 1-D CPU tensor or array of an \
                 integer dtype (e.g. torch.int64), or a list of ints",
                dtype_name(item.py(), dt)
            )));
        };
        fn widen<T: bytemuck::Pod + Into<i64>>(bytes: &[u8]) -> Vec<i64> {
            bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(|c| bytemuck::pod_read_unaligned::<T>(c).into())
                .collect()
        }
        return Ok(match (dt.bits, dt.code == 0) {
            (8, true) => widen::<i8>(bytes),
            (8, false) => widen::<u8>(bytes),
            (16, true) => widen::<i16>(bytes),
            (16, false) => widen::<u16>(bytes),
            (32, true) => widen::<i32>(bytes),
            (32, false) => widen::<u32>(bytes),
            // u64 ids above i64::MAX wrap, as torch's int64 cast does
            (_, true) => widen::<i64>(bytes),
            (_, false) => bytes
                .chunks_exact(8)
                .map(|c| bytemuck::pod_read_unaligned::<u64>(c) as i64)
                .collect(),
        });
    }
    item.extract::<Vec<i64>>().map_err(|_| {
        Class::Config.err(format!(
            "Packing: sample {at} ({}) is not a sequence of token ids",
            item.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}

/// A DLPack dtype by torch's name (`float32`, `bfloat16`), else by its
/// DLPack fields.
fn dtype_name(py: Python<'_>, dt: DlDtype) -> String {
    torch(py)
        .ok()
        .and_then(|t| t.dtype(py, dt).map(|d| d.to_string()))
        .map(|s| s.trim_start_matches("torch.").to_string())
        .unwrap_or_else(|| {
            format!(
                "DLPack type code {} bits {} lanes {}",
                dt.code, dt.bits, dt.lanes
            )
        })
}

/// A new tensor of `shape` and `dtype` (whose item is a `T`) holding `values`.
fn tensor_of<'py, T: bytemuck::Pod>(
    py: Python<'py>,
    shape: &[i64],
    dtype: &Bound<'py, PyAny>,
    values: &[T],
) -> PyResult<Bound<'py, PyAny>> {
    let t = torch(py)?;
    let mut fresh = FreshTensor::empty(t.empty.bind(py), shape, dtype, std::mem::size_of::<T>())?;
    fresh
        .bytes_mut()
        .copy_from_slice(bytemuck::cast_slice(values));
    Ok(fresh.into_tensor())
}

fn int64_tensor<'py>(
    py: Python<'py>,
    shape: &[i64],
    values: &[i64],
) -> PyResult<Bound<'py, PyAny>> {
    tensor_of(py, shape, torch(py)?.int64.bind(py), values)
}

/// `{"tokens": flat int64, "lengths": int64}` of a list of sequences.
fn ragged_of<'py, S: AsRef<[i64]>>(py: Python<'py>, seqs: &[S]) -> PyResult<Bound<'py, PyDict>> {
    let flat: Vec<i64> = seqs.iter().flat_map(|s| s.as_ref()).copied().collect();
    let lens: Vec<i64> = seqs.iter().map(|s| s.as_ref().len() as i64).collect();
    let out = PyDict::new(py);
    out.set_item("tokens", int64_tensor(py, &[flat.len() as i64], &flat)?)?;
    out.set_item("lengths", int64_tensor(py, &[lens.len() as i64], &lens)?)?;
    Ok(out)
}

/// Reads a ragged batch back: its flat tokens and lengths (checked to agree).
fn read_ragged(batch: &Bound<'_, PyAny>) -> PyResult<(Vec<i64>, Vec<i64>)> {
    let bad = || {
        Class::Config.err(format!(
            "Packer.push takes a ragged batch: {{'tokens': 1-D int64, 'lengths': 1-D int64}} \
             (what Packing.collate returns: build the loader with \
             collate_fn=packing.collate), got a {}",
            batch
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    };
    // a mapping first: indexing anything else by a key (a tensor by a
    // str) can warn, or run user code, before it fails
    let batch = batch.cast::<PyMapping>().map_err(|_| bad())?;
    let tokens = tokens_of(&batch.get_item("tokens").map_err(|_| bad())?, 0)?;
    let lens = tokens_of(&batch.get_item("lengths").map_err(|_| bad())?, 0)?;
    let total = lens.iter().try_fold(0i64, |a, &l| a.checked_add(l));
    if lens.iter().any(|&l| l < 0) || total != Some(tokens.len() as i64) {
        return Err(bad());
    }
    Ok((tokens, lens))
}

/// `Packing.collate`: the samples (1-D integer sequences) as one ragged
/// batch, `{"tokens": flat int64, "lengths": int64}`.
#[pyfunction]
pub fn ragged<'py>(py: Python<'py>, samples: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let mut seqs = Vec::new();
    for (at, item) in samples.try_iter()?.enumerate() {
        seqs.push(tokens_of(&item?, at)?);
    }
    ragged_of(py, &seqs)
}

/// The packer of `ferroloader.Packing` (see `collate::packing`).
#[pyclass(module = "ferroloader._core")]
pub struct Packer {
    core: Core,
    seq_len: usize,
    rows: usize,
}

#[pymethods]
impl Packer {
    #[new]
    fn new(seq_len: usize, rows: usize, method: &str, pad_id: i64) -> PyResult<Self> {
        let fit = Fit::parse(method).ok_or_else(|| {
            Class::Config.err(format!(
                "Packing method should be 'first_fit' or 'best_fit', got {method:?}"
            ))
        })?;
        if seq_len == 0 || rows == 0 {
            return Err(Class::Config.err("Packing needs seq_len >= 1 and rows >= 1"));
        }
        Ok(Packer {
            core: Core::new(seq_len, rows, fit, pad_id),
            seq_len,
            rows,
        })
    }

    /// Adds a ragged batch's sequences, in order.
    fn push(&mut self, batch: &Bound<'_, PyAny>) -> PyResult<()> {
        let (tokens, lens) = read_ragged(batch)?;
        let mut at = 0;
        for l in lens {
            self.core.push(&tokens[at..at + l as usize]);
            at += l as usize;
        }
        Ok(())
    }

    /// The next closed batch, or `None`.
    fn pop<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.core.pop().map(|p| self.render(py, &p)).transpose()
    }

    /// The next closed batch, else the open one (the stream's end), else `None`.
    fn flush<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.core.flush().map(|p| self.render(py, &p)).transpose()
    }

    /// The pieces placed since the last batch taken, as a ragged batch.
    fn pending<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        ragged_of(py, &self.core.pending())
    }
}

impl Packer {
    fn render<'py>(&self, py: Python<'py>, p: &Packed) -> PyResult<Bound<'py, PyDict>> {
        let shape = [self.rows as i64, self.seq_len as i64];
        let int32 = py.import("torch")?.getattr("int32")?;
        let out = PyDict::new(py);
        out.set_item("tokens", int64_tensor(py, &shape, &p.tokens)?)?;
        for (name, values) in [("segment_ids", &p.segment_ids), ("positions", &p.positions)] {
            out.set_item(name, tensor_of(py, &shape, &int32, values)?)?;
        }
        Ok(out)
    }
}
