"""Shared fixtures for the torch-conformance suite.

Self-check of the suite itself: with ``FERROLOADER_TESTS_SELFCHECK=1`` the
name ``ferroloader`` is bound to a stand-in that re-exports
``torch.utils.data``, so every comparison test must pass; a failure there is a
bug in a test, not in ferroloader.

Hypothesis profiles: ``FERROLOADER_HYPOTHESIS_PROFILE`` picks one; ``ci``
(the default) keeps the suite within CI's time, ``thorough`` runs 25 times
as many examples per property for a run on request.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import types

import pytest
from hypothesis import HealthCheck, settings
from remote_servers import s3_server  # noqa: F401 (a session fixture: moto's S3 on localhost)

# examples are whole loader runs, slow next to hypothesis' expectations
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile(
    "thorough", max_examples=1500, deadline=None, suppress_health_check=_SLOW_OK
)
settings.load_profile(os.environ.get("FERROLOADER_HYPOTHESIS_PROFILE", "ci"))

# Under forkserver (Python 3.14's default) the session's fork server starts
# with its first loader, often torch's, which preloads nothing: each worker
# of each later test would import torch again (seconds on 2 cores). The
# server preloads what ferroloader preloads for its own loaders, and the
# tests' helper module.
multiprocessing.set_forkserver_preload(["torch", "numpy", "mp_helpers"])

# Ray starts its worker processes at nice 15, so that they never starve its
# own daemons. Beside two busy processes of nice 0 an actor then gets about
# a thirtieth of a core: importing torch in it took minutes, and the
# tests that start clusters took 30 minutes instead of 90 seconds. Their
# workers (the clusters of test_ray.py, and docs/guide/ray.md's, which
# inherits the environment) run at the tests' own priority, as Ray's job
# supervisor runs its own.
os.environ.setdefault("RAY_worker_niceness", "0")

if os.environ.get("FERROLOADER_TESTS_SELFCHECK") == "1":  # pragma: no cover
    import torch.utils.data as _tud

    _shim = types.ModuleType("ferroloader")
    for _name in (
        "DataLoader Dataset IterableDataset TensorDataset StackDataset ConcatDataset "
        "ChainDataset Subset random_split get_worker_info Sampler SequentialSampler "
        "RandomSampler SubsetRandomSampler WeightedRandomSampler BatchSampler "
        "DistributedSampler default_collate default_convert"
    ).split():
        setattr(_shim, _name, getattr(_tud, _name))
    from torch.utils.data._utils import collate as _collate_mod

    _shim.collate = _collate_mod.collate
    _shim.default_collate_fn_map = _collate_mod.default_collate_fn_map
    sys.modules["ferroloader"] = _shim


@pytest.fixture
def collate_registries():
    """Yield (torch_map, ferro_map); restores both registries afterwards."""
    import ferroloader
    from torch.utils.data._utils.collate import default_collate_fn_map as torch_map

    ferro_map = ferroloader.default_collate_fn_map
    saved_torch = dict(torch_map)
    saved_ferro = dict(ferro_map)
    try:
        yield torch_map, ferro_map
    finally:
        _restore(torch_map, saved_torch)
        _restore(ferro_map, saved_ferro)


def _restore(registry, saved):
    for key in list(registry):
        if key not in saved:
            del registry[key]
    for key, fn in saved.items():
        if key not in registry or registry[key] is not fn:
            registry[key] = fn


@pytest.fixture(autouse=True)
def _no_function_mode_left_behind():
    """A test that leaves a TorchFunctionMode active (torch.set_default_device,
    say) would make every later test run ferroloader's fallback paths only."""
    from torch.overrides import _get_current_function_mode_stack

    before = len(_get_current_function_mode_stack())
    yield
    assert len(_get_current_function_mode_stack()) == before, (
        "this test left a TorchFunctionMode active"
    )
