"""Generate torch reference vectors for the Rust sampler engine.

Writes ``src/sampler/testdata/torch_vectors.json``, which
``src/sampler/vectors_test.rs`` checks the engine against. Every value in the
file comes from torch itself (the installed version is recorded), so the Rust
tests pin the engine to torch's draws without needing an interpreter.

Run from anywhere with the project's virtual environment::

    .venv/bin/python scripts/gen_sampler_vectors.py

Generator states are recorded as the SHA-256 of ``get_state()`` bytes; the
full bytes of a freshly seeded generator are stored once per seed
(``fresh_states``) so the Rust side can write its engine into them and hash.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
)

OUT = Path(__file__).resolve().parent.parent / "src" / "sampler" / "testdata" / "torch_vectors.json"

U64 = 1 << 64
# Seeds for explicit generators (and, reused, for torch.manual_seed). 2**32 + 5
# and the top values check that only the low 32 bits seed the engine while the
# full value is kept as the initial seed.
SEEDS = [0, 1, 42, 2**32 + 5, 2**63 - 1, 2**64 - 1]
HEAD = 50
# torch.manual_seed(GLOBAL_SEED) precedes every sampler vector, so samplers with
# generator=None draw from a known default generator.
GLOBAL_SEED = 7


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def state_bytes(g: Optional[torch.Generator]) -> bytes:
    """``get_state()`` of ``g``, or of torch's default generator when ``None``."""
    state = torch.get_rng_state() if g is None else g.get_state()
    return bytes(state.tolist())


def sha(g: Optional[torch.Generator]) -> str:
    return hashlib.sha256(state_bytes(g)).hexdigest()


def state_after(g: Optional[torch.Generator]) -> str:
    """Hash of the generator a sampler drew from: ``g``, or the default one.
    (With an explicit ``g`` the default generator is never touched.)"""
    if g is not None:
        assert torch.get_rng_state().equal(torch.Generator().manual_seed(GLOBAL_SEED).get_state())
    return sha(g)


def take(it: Iterator[Any], k: Optional[int]) -> list[Any]:
    """The first ``k`` items of ``it`` (all of them when ``k`` is None), pulling
    no further than a Python consumer that stops after ``k`` would."""
    if k is None:
        return list(it)
    return [next(it) for _ in range(k)]


def _none_first(v: Optional[int]) -> int:
    return -1 if v is None else v


def checksum(values: Iterable[int]) -> int:
    return sum(i * v for i, v in enumerate(values))


def randperm_vectors() -> list[dict[str, Any]]:
    out = []
    for seed in SEEDS:
        for n in (0, 1, 2, 3, 10, 100, 1000, 5000):
            g = gen(seed)
            perm = torch.randperm(n, generator=g).tolist()
            out.append(
                {
                    "seed": seed,
                    "n": n,
                    "head": perm[:HEAD],
                    "checksum": checksum(perm),
                    "state_sha256": sha(g),
                }
            )
    return out


def randint_vectors() -> list[dict[str, Any]]:
    out = []
    for seed in SEEDS:
        # 2**28 is where the public wheels' randint switches from one 32-bit
        # word to a 64-bit draw per value (DistributionsHelper.h; FBCODE builds
        # switch at 2**32 instead).
        for high in (1, 7, 1000, 2**28 - 1, 2**28, 2**31, 2**32 - 1, 2**32, 2**33, 2**62):
            g = gen(seed)
            values = torch.randint(high, (20,), generator=g).tolist()
            out.append({"seed": seed, "high": high, "values": values, "state_sha256": sha(g)})
    return out


def random_int64_vectors() -> list[dict[str, Any]]:
    out = []
    for seed in SEEDS:
        g = gen(seed)
        values = [
            int(torch.empty((), dtype=torch.int64).random_(generator=g).item()) for _ in range(20)
        ]
        out.append({"seed": seed, "values": values, "state_sha256": sha(g)})
    return out


def mixed_vectors() -> list[dict[str, Any]]:
    """Several kernels on one generator, so consumption must chain exactly.
    Long enough (thousands of words) to cross several MT19937 twists."""
    out = []
    for seed in SEEDS:
        g = gen(seed)
        steps: list[dict[str, Any]] = []
        for n, high in ((700, 5), (1, 2**40), (0, 3), (31, 2**32), (1500, 99)):
            perm = torch.randperm(n, generator=g).tolist()
            steps.append(
                {"op": "randperm", "n": n, "head": perm[:HEAD], "checksum": checksum(perm)}
            )
            vals = torch.randint(high, (33,), generator=g).tolist()
            steps.append({"op": "randint", "high": high, "values": vals})
            seed_draw = int(torch.empty((), dtype=torch.int64).random_(generator=g).item())
            steps.append({"op": "random_int64", "values": [seed_draw]})
        out.append({"seed": seed, "steps": steps, "state_sha256": sha(g)})
    return out


def with_generator(
    seed: Optional[int], make: Callable[[Optional[torch.Generator]], Any]
) -> tuple[Optional[torch.Generator], Any]:
    """Seeds torch's default generator with ``GLOBAL_SEED`` and builds a
    sampler with an explicit generator (``seed``) or none (``seed is None``)."""
    torch.manual_seed(GLOBAL_SEED)
    g = None if seed is None else gen(seed)
    return g, make(g)


def random_sampler_vectors() -> list[dict[str, Any]]:
    out = []
    grid = []
    for n in (1, 3, 7, 10, 40):
        samples = {None, 1, max(n - 1, 1), n, n + 1, 2 * n, 3 * n + 2, 32, 33, 64, 100}
        for num_samples in sorted(samples, key=_none_first):
            for replacement in (False, True):
                grid.append((n, num_samples, replacement))
    # Datasets too large to permute here, but cheap with replacement: either
    # side of randint's 2**28 switch to 64-bit draws.
    for n in (2**28 - 1, 2**28 + 3):
        for num_samples in (5, 40):
            grid.append((n, num_samples, True))
    for i, (n, num_samples, replacement) in enumerate(grid):
        # Rotate the seeds (and generator=None) through the grid to keep it small.
        seed = [*SEEDS, None][i % (len(SEEDS) + 1)]
        total = n if num_samples is None else num_samples
        takes = [None, total] + ([total // 2] if total > 1 else []) + ([0] if n == 3 else [])
        for k in takes:
            g, sampler = with_generator(
                seed,
                lambda g, n=n, r=replacement, s=num_samples: RandomSampler(
                    range(n), replacement=r, num_samples=s, generator=g
                ),
            )
            epochs = [take(iter(sampler), k) for _ in range(2)]
            out.append(
                {
                    "seed": seed,
                    "n": n,
                    "num_samples": num_samples,
                    "replacement": replacement,
                    "take": k,
                    "epochs": epochs,
                    "state_sha256": state_after(g),
                }
            )
    return out


def subset_random_vectors() -> list[dict[str, Any]]:
    out = []
    subsets = [[], [5], [9, 2], [3, 1, 4, 1, 5, 9, 2, 6], list(range(100, 160, 3))]
    for i, indices in enumerate(subsets):
        for seed in (SEEDS[i % len(SEEDS)], None):
            for k in (None, len(indices) // 2):
                g, sampler = with_generator(
                    seed, lambda g, idx=indices: SubsetRandomSampler(idx, generator=g)
                )
                epochs = [take(iter(sampler), k) for _ in range(2)]
                out.append(
                    {
                        "seed": seed,
                        "indices": indices,
                        "take": k,
                        "epochs": epochs,
                        "state_sha256": state_after(g),
                    }
                )
    return out


def distributed_vectors() -> list[dict[str, Any]]:
    out = []
    runs = [(False, 0, 0), (True, 0, 0), (True, 42, 3), (True, 2**32 + 9, 1), (True, -1, 0)]
    for n, num_replicas, drop_last, (shuffle, seed, epoch) in itertools.product(
        (0, 1, 3, 10, 17), (1, 2, 3, 4, 8), (False, True), runs
    ):
        per_rank = []
        sizes = None
        for rank in range(num_replicas):
            s = DistributedSampler(
                range(n),
                num_replicas=num_replicas,
                rank=rank,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
            )
            s.set_epoch(epoch)
            per_rank.append(list(s))
            sizes = (s.num_samples, s.total_size)
        assert sizes is not None
        out.append(
            {
                "n": n,
                "num_replicas": num_replicas,
                "shuffle": shuffle,
                "seed": seed,
                "epoch": epoch,
                # What torch passes to manual_seed, as the u64 it becomes.
                "torch_seed": (seed + epoch) % U64,
                "drop_last": drop_last,
                "num_samples": sizes[0],
                "total_size": sizes[1],
                "per_rank": per_rank,
            }
        )
    return out


def batch_vectors() -> list[dict[str, Any]]:
    out = []
    grid = [
        # (source, n, num_samples, replacement, batch_size)
        ("sequential", 10, None, False, 3),
        ("sequential", 9, None, False, 3),
        ("sequential", 0, None, False, 2),
        ("random", 10, None, False, 3),
        ("random", 10, None, False, 5),
        ("random", 10, None, False, 1),
        ("random", 10, 25, False, 4),
        ("random", 64, None, False, 7),
        ("random", 64, 128, False, 64),
        ("random", 5, 40, True, 8),
        ("random", 5, 64, True, 32),
        ("random", 50, 70, True, 9),
        ("random", 3, 3, True, 5),
        ("subset", 8, None, False, 3),
    ]
    for i, (source, n, num_samples, replacement, batch_size) in enumerate(grid):
        seed = [*SEEDS, None][i % (len(SEEDS) + 1)]
        for drop_last in (False, True):

            def make(g, source=source, n=n, s=num_samples, r=replacement):
                if source == "sequential":
                    return SequentialSampler(range(n))
                if source == "subset":
                    return SubsetRandomSampler(list(range(100, 100 + 7 * n, 7)), generator=g)
                return RandomSampler(range(n), replacement=r, num_samples=s, generator=g)

            n_batches = len(BatchSampler(make(None), batch_size, drop_last))
            for k in sorted({None, n_batches, n_batches // 2, 0}, key=_none_first):
                g, inner = with_generator(seed, make)
                batches = take(iter(BatchSampler(inner, batch_size, drop_last)), k)
                out.append(
                    {
                        "source": source,
                        "seed": seed,
                        "n": n,
                        "num_samples": num_samples,
                        "replacement": replacement,
                        "batch_size": batch_size,
                        "drop_last": drop_last,
                        "take": k,
                        "len": n_batches,
                        "batches": batches,
                        "state_sha256": state_after(g),
                    }
                )
    return out


def main() -> None:
    fresh = {}
    for seed in SEEDS:
        bytes_ = state_bytes(gen(seed))
        torch.manual_seed(seed)
        # The default generator after torch.manual_seed is a fresh one too, so
        # the same buffers serve the generator=None vectors.
        assert state_bytes(None) == bytes_, seed
        fresh[str(seed)] = bytes_.hex()
    fresh[str(GLOBAL_SEED)] = state_bytes(gen(GLOBAL_SEED)).hex()

    data = {
        "torch_version": torch.__version__,
        "generated_by": "scripts/gen_sampler_vectors.py",
        "state_bytes": len(state_bytes(gen(0))),
        "global_seed": GLOBAL_SEED,
        "fresh_states": fresh,
        "randperm": randperm_vectors(),
        "randint": randint_vectors(),
        "random_int64": random_int64_vectors(),
        "mixed": mixed_vectors(),
        "random_sampler": random_sampler_vectors(),
        "subset_random": subset_random_vectors(),
        "distributed": distributed_vectors(),
        "batch": batch_vectors(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, separators=(",", ":"))
    OUT.write_text(text + "\n")
    counts = {k: len(v) for k, v in data.items() if isinstance(v, list)}
    print(f"wrote {OUT} ({len(text)} bytes): {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
