//! PyO3 bindings: the `ferroloader._core` extension module. Thin adapters
//! from Python objects to the engine: calling the user's code, building
//! tensors, converting errors; no loader logic lives here that the engine
//! could own.

use pyo3::prelude::*;

#[cfg(feature = "test-doubles")]
pub(crate) use error::guard;
#[cfg(feature = "test-doubles")]
pub(crate) use pinning::PinArena;

mod codec;
mod collate;
mod error;
mod fetch;
mod ffi;
mod indices;
mod loader;
mod multiproc;
mod packing;
mod pinning;
mod relay;
mod remote;
mod sampler;
mod seeds;
mod settings;
mod shards;
mod state_check;
mod stats;
mod table;
mod torch;
mod tuning;
mod turns;
mod worker;
mod world;

/// Adds the bindings to `ferroloader._core` (made in `lib.rs`).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(collate::collate, m)?)?;
    m.add_function(wrap_pyfunction!(sampler::randperm_list, m)?)?;
    m.add_function(wrap_pyfunction!(worker::worker_loop, m)?)?;
    m.add_function(wrap_pyfunction!(relay::relay_loop, m)?)?;
    m.add_class::<relay::ActorHost>()?;
    m.add_function(wrap_pyfunction!(shards::shard_plan, m)?)?;
    m.add_function(wrap_pyfunction!(shards::elastic_indices, m)?)?;
    m.add_function(wrap_pyfunction!(shards::mixture_indices, m)?)?;
    for f in [
        wrap_pyfunction!(seeds::epoch_seed, m)?,
        wrap_pyfunction!(seeds::sample_seed, m)?,
        wrap_pyfunction!(seeds::derive, m)?,
        wrap_pyfunction!(seeds::shard_order_seed, m)?,
        wrap_pyfunction!(seeds::block_seed, m)?,
        wrap_pyfunction!(seeds::shard_item_index, m)?,
        wrap_pyfunction!(seeds::seed_everything, m)?,
        wrap_pyfunction!(multiproc::prefetch_window, m)?,
        wrap_pyfunction!(indices::resume_stream, m)?,
        wrap_pyfunction!(multiproc::end_processes, m)?,
        wrap_pyfunction!(settings::check_settings, m)?,
        wrap_pyfunction!(settings::shm_limit_setting, m)?,
        wrap_pyfunction!(settings::disabled_setting, m)?,
    ] {
        m.add_function(f)?;
    }
    m.add_function(wrap_pyfunction!(packing::ragged, m)?)?;
    m.add_class::<packing::Packer>()?;
    m.add_class::<shards::ShardPlan>()?;
    m.add_class::<world::WorldClaims>()?;
    m.add_class::<shards::AddressBatches>()?;
    m.add_class::<table::ArrowTable>()?;
    m.add_class::<indices::Recorder>()?;
    m.add_class::<seeds::SampleSeeder>()?;
    m.add_class::<sampler::SamplerIter>()?;
    m.add_class::<sampler::BatchSamplerIter>()?;
    m.add_class::<loader::SingleProcessIter>()?;
    m.add_class::<multiproc::MultiProcessIter>()?;
    m.add_class::<multiproc::StopFlag>()?;
    m.add_class::<pinning::PinArena>()?;
    m.add_class::<remote::PyCache>()?;
    m.add_class::<remote::PyPinned>()?;
    m.add_class::<remote::PyPrefetch>()?;
    m.add_class::<remote::PyLease>()?;
    m.add_function(wrap_pyfunction!(remote::is_url, m)?)?;
    m.add_function(wrap_pyfunction!(state_check::check_state_layout, m)?)?;
    m.add_function(wrap_pyfunction!(state_check::check_shard_resume, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_check_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_remaining, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_translate, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_list_id, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_even_budget, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_even_count, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_unit, m)?)?;
    m.add_function(wrap_pyfunction!(world::world_cut, m)?)?;
    m.add_function(wrap_pyfunction!(remote::store_option_known, m)?)?;
    m.add_class::<tuning::TunePolicy>()?;
    m.add_class::<tuning::ClimbPolicy>()?;
    m.add_function(wrap_pyfunction!(tuning::tune_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_soft_min, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_candidates, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_past_noise, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_sim_rate, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_best, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_draw, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_outcome, m)?)?;
    m.add_function(wrap_pyfunction!(tuning::tune_simulate, m)?)?;
    // (the simulator's machine shapes and when a shifting one changes:
    // tuning.model's SHAPES and SHIFT_AT, one definition)
    let shapes: Vec<&str> = crate::tuning::sim::SHAPES.iter().map(|(n, _)| *n).collect();
    m.add("TUNE_SHAPES", pyo3::types::PyTuple::new(m.py(), shapes)?)?;
    m.add("TUNE_SHIFT_AT", crate::tuning::sim::SHIFT_AT)?;
    Ok(())
}
