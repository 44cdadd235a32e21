"""Dynamic against static sharding on uneven shards (shards_w2)."""

from __future__ import annotations

import gc
from typing import Any, Iterable, List

from ..datasets import CpuDataset, calibrate_cpu_iters
from ..harness import Check, Settings, epoch_step, mw_kwargs, probe_workers, timed_rate


def _cpu_shards(fl: Any) -> Any:
    """A ShardedDataset class whose items cost ``iters`` loop steps each
    (made here: ferroloader is imported only when a run asks for it)."""

    class CpuShards(fl.ShardedDataset):
        def __init__(self, lens: List[int], iters: int) -> None:
            self.lens = lens
            self.iters = iters

        def shards(self) -> List[int]:
            return list(range(len(self.lens)))

        def iter_shard(self, shard: int, start: int = 0) -> Iterable[int]:
            ds = CpuDataset(0, self.iters)
            return (ds[1000 * shard + o] for o in range(start, self.lens[shard]))

        def shard_len(self, shard: int) -> int:
            return self.lens[shard]

    return CpuShards


def sc_shards_w2(st: Settings, fl: Any) -> List[Check]:
    """Dynamic against static sharding on uneven shards (ferroloader
    against itself): one shard holds as many items as the 16 others
    together, so static lanes end with one worker reading it alone."""
    probe_workers(fl)
    iters = calibrate_cpu_iters(0.2e-3)
    per_small = 24 if st.quick else 96
    lens = [16 * per_small] + [per_small] * 16
    n = sum(lens)
    cls = _cpu_shards(fl)
    check = Check("samples/s, dynamic sharding", "samples/s", "static sharding", target=1.3)

    def make(mode: str) -> Any:
        return fl.DataLoader(
            cls(lens, iters),
            batch_size=16,
            shuffle=True,
            seed=0,
            sharding=fl.Sharding(mode=mode),
            **mw_kwargs(),
        )

    static, dynamic = make("static"), make("dynamic")
    s_step, d_step = epoch_step(static, n), epoch_step(dynamic, n)
    s_step()  # warm: starts the persistent workers
    d_step()
    for _ in range(st.repeats):
        check.add(timed_rate(s_step, st.min_time), timed_rate(d_step, st.min_time))
    del static, dynamic, s_step, d_step
    gc.collect()
    return [check]
