//! Handles to the torch and numpy objects the engine calls, looked up once.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyType};

use super::ffi::{DlDtype, DlView};

/// torch's default collate functions, recognised by identity so the engine
/// can run a native equivalent where the registry still points at them.
/// Every dtype torch may have; those a given torch lacks are skipped.
const DTYPE_NAMES: &[&str] = &[
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
];

pub struct DefaultFns {
    pub tensor: Py<PyAny>,
    pub ndarray: Py<PyAny>,
    pub float: Py<PyAny>,
    pub int: Py<PyAny>,
    pub str_: Py<PyAny>,
}

pub struct Torch {
    pub tensor_type: Py<PyType>,
    pub ndarray_type: Py<PyType>,
    /// `numpy.memmap`: a memory-mapped array's samples (`np.load(...,
    /// mmap_mode="r")[i]`) are of this subclass; torch collates them as
    /// arrays.
    pub memmap_type: Py<PyType>,
    pub strided: Py<PyAny>,
    pub stack: Py<PyAny>,
    pub empty: Py<PyAny>,
    pub to_dlpack: Py<PyAny>,
    pub from_dlpack: Py<PyAny>,
    pub np_from_dlpack: Py<PyAny>,
    pub pickler: Py<PyAny>,
    pub unpickler: Py<PyAny>,
    pub loads: Py<PyAny>,
    pub dumps: Py<PyAny>,
    /// `torch._utils.ExceptionWrapper`: how torch re-raises an error from
    /// another thread or process.
    pub exception_wrapper: Py<PyAny>,
    pub bytes_io: Py<PyAny>,
    pub int64: Py<PyAny>,
    pub float64: Py<PyAny>,
    pub bool_: Py<PyAny>,
    pub default_generator: Py<PyAny>,
    pub multinomial: Py<PyAny>,
    pub randperm: Py<PyAny>,
    pub randint: Py<PyAny>,
    pub int32: Py<PyAny>,
    pub uint8: Py<PyAny>,
    /// `torch.frombuffer`: a generator's state written back from bytes.
    pub frombuffer: Py<PyAny>,
    /// `torch._C._len_torch_function_stack`: a TorchFunctionMode (such as
    /// `torch.set_default_device`) changes what torch's collate builds.
    pub function_modes: Py<PyAny>,
    /// torch's `collate` (Python), for container types the engine leaves to it.
    pub torch_collate: Py<PyAny>,
    pub default_collate_fn_map: Py<PyDict>,
    /// `torch.utils.data.default_collate` and `ferroloader.default_collate`.
    pub default_collates: Vec<Py<PyAny>>,
    pub fns: DefaultFns,
    /// DLPack dtype -> torch dtype, for the dtypes torch can both export and
    /// `torch.stack` (checked at start-up, so the native path never succeeds
    /// where torch would fail).
    dtypes: HashMap<DlDtype, Py<PyAny>>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

pub fn torch(py: Python<'_>) -> PyResult<&'static Torch> {
    TORCH.get_or_try_init(py, || Torch::load(py))
}

impl Torch {
    fn load(py: Python<'_>) -> PyResult<Self> {
        let torch = py.import("torch")?;
        let np = py.import("numpy")?;
        let c = torch.getattr("_C")?;
        let collate = py.import("torch.utils.data._utils.collate")?;
        let ferro_collate = py.import("ferroloader.collate")?;
        let get = |name: &str| collate.getattr(name).map(Bound::unbind);
        let fns = DefaultFns {
            tensor: get("collate_tensor_fn")?,
            ndarray: get("collate_numpy_array_fn")?,
            float: get("collate_float_fn")?,
            int: get("collate_int_fn")?,
            str_: get("collate_str_fn")?,
        };
        let stack = torch.getattr("stack")?;
        let empty = torch.getattr("empty")?;
        let to_dlpack = c.getattr("_to_dlpack")?;
        let dtypes = Self::dtype_table(py, &torch, &stack, &empty, &to_dlpack)?;
        Ok(Torch {
            tensor_type: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
            ndarray_type: np.getattr("ndarray")?.cast_into::<PyType>()?.unbind(),
            memmap_type: np.getattr("memmap")?.cast_into::<PyType>()?.unbind(),
            strided: torch.getattr("strided")?.unbind(),
            stack: stack.unbind(),
            empty: empty.unbind(),
            to_dlpack: to_dlpack.unbind(),
            from_dlpack: c.getattr("_from_dlpack")?.unbind(),
            np_from_dlpack: np.getattr("from_dlpack")?.unbind(),
            // subclasses with the leaf hooks as methods (Python 3.13 made
            // a C Pickler's `persistent_id` read-only on instances)
            pickler: py
                .import("ferroloader._pickling")?
                .getattr("LeafPickler")?
                .unbind(),
            unpickler: py
                .import("ferroloader._pickling")?
                .getattr("LeafUnpickler")?
                .unbind(),
            loads: py.import("pickle")?.getattr("loads")?.unbind(),
            dumps: py.import("pickle")?.getattr("dumps")?.unbind(),
            exception_wrapper: py
                .import("torch._utils")?
                .getattr("ExceptionWrapper")?
                .unbind(),
            bytes_io: py.import("io")?.getattr("BytesIO")?.unbind(),
            int64: torch.getattr("int64")?.unbind(),
            float64: torch.getattr("float64")?.unbind(),
            bool_: torch.getattr("bool")?.unbind(),
            default_generator: torch.getattr("default_generator")?.unbind(),
            multinomial: torch.getattr("multinomial")?.unbind(),
            randperm: torch.getattr("randperm")?.unbind(),
            randint: torch.getattr("randint")?.unbind(),
            int32: torch.getattr("int32")?.unbind(),
            uint8: torch.getattr("uint8")?.unbind(),
            frombuffer: torch.getattr("frombuffer")?.unbind(),
            function_modes: c.getattr("_len_torch_function_stack")?.unbind(),
            torch_collate: get("collate")?,
            default_collate_fn_map: collate
                .getattr("default_collate_fn_map")?
                .cast_into::<PyDict>()?
                .unbind(),
            default_collates: vec![
                get("default_collate")?,
                ferro_collate.getattr("default_collate")?.unbind(),
            ],
            fns,
            dtypes,
        })
    }

    fn dtype_table(
        py: Python<'_>,
        torch: &Bound<'_, PyModule>,
        stack: &Bound<'_, PyAny>,
        empty: &Bound<'_, PyAny>,
        to_dlpack: &Bound<'_, PyAny>,
    ) -> PyResult<HashMap<DlDtype, Py<PyAny>>> {
        let mut table = HashMap::new();
        for name in DTYPE_NAMES {
            let Ok(d) = torch.getattr(*name) else {
                continue;
            };
            let kwargs = PyDict::new(py);
            kwargs.set_item("dtype", &d)?;
            let Ok(probe) = empty.call(((2,),), Some(&kwargs)) else {
                continue;
            };
            let pair = PyList::new(py, [&probe, &probe])?;
            if stack.call1((pair, 0)).is_err() {
                continue;
            }
            let Ok(capsule) = to_dlpack.call1((&probe,)) else {
                continue;
            };
            if let Some(view) = DlView::open(capsule) {
                // Aliases (torch.float / torch.float32) map to the same dtype.
                table
                    .entry(view.dtype())
                    .or_insert_with(|| d.clone().unbind());
            }
        }
        Ok(table)
    }

    pub fn dtype<'py>(&self, py: Python<'py>, dl: DlDtype) -> Option<&Bound<'py, PyAny>> {
        self.dtypes.get(&dl).map(|d| d.bind(py))
    }

    /// Whether a TorchFunctionMode is active (then native paths stand aside
    /// and torch's own functions run, honouring it).
    pub fn modes_active(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.function_modes.bind(py).call0()?.extract::<usize>()? > 0)
    }

    /// The DLPack dtype of a `torch.dtype` object (dtype objects are
    /// singletons, so identity is enough).
    pub fn dl_dtype(&self, dtype: &Bound<'_, PyAny>) -> Option<DlDtype> {
        self.dtypes
            .iter()
            .find(|(_, d)| d.is(dtype))
            .map(|(dl, _)| *dl)
    }
}
