#!/usr/bin/env python3
"""Soak: random loaders, random faults, every batch checked against torch.

Runs rounds for ``--minutes``. Each round builds a random loader (dataset
kind and size, batch size, shuffle, workers, persistence, prefetch, order),
computes torch's batches for the same seed, then iterates ferroloader's
with one random fault or interruption: none, a worker killed mid-epoch, a
break out of the epoch, held batches, or a snapshot mid-epoch resumed by a
new loader (another num_workers for map-style data). Every batch that comes
out is compared with torch's. A fifth of the rounds load a ShardedDataset
(static or dynamic sharding, resumed with another num_workers too): its
items are compared with torch's loader over the same dataset, and a static
epoch's batches with ferroloader's own num_workers=0 run (the batch
sequence does not depend on num_workers). After each round everything is dropped and the
process is checked: no child process left, file descriptors, memory maps of
shared memory and threads back to where they started, nothing new in
/dev/shm. Prints its figures at the end; exits 1 on the first failure.

Not part of CI (scripts/test); run as ``scripts/soak --minutes 10``.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import random
import resource
import signal
import sys
import threading
import time
import warnings
from typing import Any

import torch
import torch.utils.data as tud

warnings.filterwarnings("ignore")

import ferroloader as fl  # noqa: E402


class MapData(tud.Dataset):
    def __init__(self, n: int, kind: str) -> None:
        self.n, self.kind = n, kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.kind == "int":
            return i
        if self.kind == "dict":
            return {"i": i, "x": torch.arange(4, dtype=torch.float32) * i, "s": f"s{i}"}
        return torch.full((64, 32), float(i))


class IterData(tud.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(w, self.n, k):
            yield {"i": i, "x": torch.tensor([i * 0.5])}


class ShardData(fl.ShardedDataset):
    def __init__(self, lens: list) -> None:
        self.lens = lens

    def shards(self) -> list:
        return list(range(len(self.lens)))

    def iter_shard(self, shard: int, start: int = 0):
        return (1000 * shard + o for o in range(start, self.lens[shard]))

    def shard_len(self, shard: int) -> int:
        return self.lens[shard]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def flat(batches: list) -> list:
    out: list = []
    for b in batches:
        out.extend(int(x) for x in (b if isinstance(b, torch.Tensor) and b.dim() else [b]))
    return out


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def memfd_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:ferroloader" in line for line in f)


def shm() -> set:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def settle(cond, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        gc.collect()
        if cond():
            return True
        time.sleep(0.05)
    return cond()


class Soak:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.rounds = 0
        self.batches = 0
        self.faults = {"kill": 0, "break": 0, "hold": 0, "resume": 0, "none": 0}
        self.max_rss = 0
        self.sharded = 0

    def config(self) -> dict:
        r = self.rng
        iterable = r.random() < 0.25
        nw = r.choice([0, 1, 2, 3])
        cfg = {
            "sharded": r.random() < 0.2,
            "lens": [r.choice([0, 1, 3, 7, 20, 40]) for _ in range(r.randint(1, 12))],
            "mode": r.choice(["static", "dynamic"]),
            "iterable": iterable,
            "kind": r.choice(["int", "dict", "tensor"]),
            "n": r.randint(10, 120),
            "batch_size": r.choice([None, 1, 3, 8, 16]),
            "shuffle": (not iterable) and r.random() < 0.5,
            "drop_last": r.random() < 0.3,
            "num_workers": nw,
            "seed": r.randint(0, 2**31),
        }
        if nw:
            cfg["persistent_workers"] = r.random() < 0.3
            cfg["prefetch_factor"] = r.randint(1, 3)
            cfg["in_order"] = r.random() < 0.85
        if cfg["batch_size"] is None:
            cfg["drop_last"] = False
        if cfg["sharded"]:
            cfg["shuffle"] = r.random() < 0.5
        return cfg

    def make(self, lib: Any, cfg: dict, nw: int | None = None) -> Any:
        ds = IterData(cfg["n"]) if cfg["iterable"] else MapData(cfg["n"], cfg["kind"])
        kw = {k: cfg[k] for k in ("batch_size", "shuffle", "drop_last") if k in cfg}
        workers = cfg["num_workers"] if nw is None else nw
        if workers:
            for k in ("persistent_workers", "prefetch_factor", "in_order"):
                if k in cfg:
                    kw[k] = cfg[k]
        if cfg["sharded"]:
            ds = ShardData(cfg["lens"])
            if lib is fl:
                kw.update(seed=cfg["seed"], sharding=fl.Sharding(mode=cfg["mode"], even=False))
            else:
                kw.pop("shuffle", None)
        return lib.DataLoader(ds, num_workers=workers, **kw)

    def sharded_round(self, cfg: dict, fault: str) -> None:
        """A ShardedDataset: the items are torch's (each once), and a static
        in-order epoch is ferroloader's own num_workers=0 epoch."""
        items = sorted(flat(list(self.make(tud, dict(cfg, drop_last=False), 2))))
        ref = list(self.make(fl, cfg, 0))
        ordered = cfg["mode"] == "static" and cfg.get("in_order", True)
        exact = not cfg["drop_last"]  # drop_last drops each lane's short batch
        loader = self.make(fl, cfg)
        k = self.rng.randint(0, max(0, len(ref) - 1))
        if fault == "kill":
            it = iter(loader)
            got = [next(it) for _ in range(min(k, len(ref)))]
            victim = self.rng.choice(it._procs)
            os.kill(victim.pid, signal.SIGKILL)
            try:
                for _ in it:
                    pass
            except RuntimeError:
                pass
            del it
        elif fault == "break":
            got = []
            for b in loader:
                got.append(b)
                if len(got) >= k:
                    break
        else:
            if fault == "resume":
                it = iter(loader)
                got = [next(it) for _ in range(min(k, len(ref)))]
                sd = loader.state_dict()
                del it
                resumed = self.make(fl, cfg, self.rng.choice([0, 1, 2, 3]))
                resumed.load_state_dict(sd)
                got += list(resumed)
                del resumed
            else:
                got = list(loader)
            if exact and sorted(flat(got)) != items:
                raise AssertionError(f"sharded {fault} {cfg}: items differ from torch's")
            self.batches += len(got)
        if ordered:
            self.check(got, ref[: len(got)], True, f"sharded {fault} {cfg}")
        del loader

    def expected(self, cfg: dict) -> list:
        torch.manual_seed(cfg["seed"])
        # map-style batches do not depend on num_workers; an iterable's do
        nw = cfg["num_workers"] if cfg["iterable"] else 0
        kw = dict(cfg, num_workers=nw)
        return list(self.make(tud, kw, nw))

    def check(self, got: list, want: list, ordered: bool, what: str) -> None:
        if ordered:
            ok = len(got) == len(want) and all(map(same, got, want))
        else:
            rest = list(want)
            ok = len(got) == len(want)
            for g in got:
                hit = next((k for k, w in enumerate(rest) if same(g, w)), None)
                if hit is None:
                    ok = False
                    break
                rest.pop(hit)
        if not ok:
            raise AssertionError(f"{what}: {len(got)} batches differ from torch's {len(want)}")
        self.batches += len(got)

    def round(self) -> None:
        cfg = self.config()
        want = [] if cfg["sharded"] else self.expected(cfg)
        ordered = cfg.get("in_order", True)
        fault = self.rng.choice(["none", "kill", "break", "hold", "resume"])
        if fault == "kill" and not cfg["num_workers"]:
            fault = "none"
        if fault == "resume" and cfg["iterable"] and cfg["num_workers"] and not cfg["sharded"]:
            fault = "none"  # iterables resume with the same num_workers only
        self.faults[fault] += 1
        if cfg["sharded"]:
            self.sharded_round(cfg, fault)
            self.rounds += 1
            self.sharded += 1
            return
        torch.manual_seed(cfg["seed"])
        loader = self.make(fl, cfg)
        k = self.rng.randint(0, max(0, len(want) - 1))
        if fault == "none":
            self.check(list(loader), want, ordered, f"plain {cfg}")
        elif fault == "hold":
            held = list(loader)
            self.check(held, want, ordered, f"held {cfg}")
            del held
        elif fault == "break":
            got = []
            for b in loader:
                got.append(b)
                if len(got) >= k:
                    break
            if ordered:
                self.check(got, want[: len(got)], True, f"break {cfg}")
        elif fault == "kill":
            it = iter(loader)
            got = [next(it) for _ in range(min(k, len(want)))]
            if ordered:
                self.check(got, want[: len(got)], True, f"before kill {cfg}")
            victim = self.rng.choice(it._procs)
            os.kill(victim.pid, signal.SIGKILL)
            try:
                for _ in it:
                    pass
            except RuntimeError:
                pass  # the death is named; a replica may also have ended first
            del it
        elif fault == "resume":
            it = iter(loader)
            got = [next(it) for _ in range(min(k, len(want)))]
            sd = loader.state_dict()
            del it
            nw = cfg["num_workers"] if cfg["iterable"] else self.rng.choice([0, 1, 2])
            torch.manual_seed(cfg["seed"] + 1)
            resumed = self.make(fl, cfg, nw)
            resumed.load_state_dict(sd)
            rest = list(resumed)
            self.check(got + rest, want, ordered, f"resume {cfg} at {k} with {nw} workers")
            del resumed
        del loader
        self.rounds += 1
        self.max_rss = max(self.max_rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    soak = Soak(random.Random(args.seed))
    base_fds, base_threads, base_shm = fds(), threading.active_count(), shm()
    end = time.monotonic() + 60 * args.minutes
    worst_fds = base_fds
    while time.monotonic() < end:
        try:
            soak.round()
        except Exception as e:
            print(f"FAIL in round {soak.rounds + 1}: {type(e).__name__}: {e}", flush=True)
            return 1
        ok = settle(
            lambda: (
                not multiprocessing.active_children()
                and memfd_maps() == 0
                and fds() <= base_fds + 2
            ),
            15.0,
        )
        worst_fds = max(worst_fds, fds())
        if not ok:
            print(
                f"LEAK after round {soak.rounds}: children={multiprocessing.active_children()} "
                f"memfd maps={memfd_maps()} fds={fds()} (start {base_fds})",
                flush=True,
            )
            return 1
        if threading.active_count() > base_threads or shm() - base_shm:
            print(f"LEAK after round {soak.rounds}: threads or /dev/shm", flush=True)
            return 1
    print(
        f"soak: {args.minutes:g} min, {soak.rounds} rounds ({soak.sharded} sharded), "
        f"{soak.batches} batches checked against torch, faults {soak.faults}, "
        f"max RSS {soak.max_rss / 1024:.0f} MiB, "
        f"fds start {base_fds} / max {worst_fds} / end {fds()}, memfd maps at end "
        f"{memfd_maps()}, children at end {len(multiprocessing.active_children())}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
