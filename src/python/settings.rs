//! The `FERROLOADER_*` settings (`crate::settings`) for Python: the check
//! `iter()` makes before any worker starts, and the values Python uses.

use pyo3::prelude::*;

use super::error::Class;
use crate::settings;

/// Checks every `FERROLOADER_*` setting; a bad one is a `ConfigError`
/// naming the variable and the value.
#[pyfunction]
pub fn check_settings() -> PyResult<()> {
    settings::check().map_err(|e| Class::Config.err(e))
}

/// `FERROLOADER_SHM_LIMIT` in bytes, `None` when unset.
#[pyfunction]
pub fn shm_limit_setting() -> PyResult<Option<u64>> {
    settings::shm_limit_env().map_err(|e| Class::Config.err(e))
}

/// The names `FERROLOADER_DISABLE` lists (trimmed, lower-cased).
#[pyfunction]
pub fn disabled_setting() -> PyResult<Vec<String>> {
    settings::disable_env().map_err(|e| Class::Config.err(e))
}
