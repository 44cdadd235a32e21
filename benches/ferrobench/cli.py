"""The command line: the scenario registry, the options, and main."""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .harness import (
    LAST_STATS,
    PROGRESS,
    Check,
    Scenario,
    Settings,
    Skip,
    _mw_unavailable,
    ferro_version,
    import_ferro,
    print_scenario,
    print_table,
    write_json,
)
from .scenarios.autotune import sc_autotune
from .scenarios.cluster import sc_cluster
from .scenarios.gpu import sc_gpu
from .scenarios.images import rss_child, sc_image_w2, sc_image_w2_rss, sc_scaling, write_scaling_png
from .scenarios.packing import sc_packing
from .scenarios.records import (
    sc_collate,
    sc_cpu_w2,
    sc_dict40_w2,
    sc_int64,
    sc_int64_w2,
    sc_tensords,
)
from .scenarios.remote import sc_remote
from .scenarios.shards import sc_shards_w2
from .scenarios.startup import sc_ttfb_w2
from .scenarios.state import sc_seeds_w2, sc_state_w2
from .scenarios.tables import sc_table, sc_table_mem, sc_table_w2, table_mem_child
from .scenarios.threads import (
    peer_child,
    sc_peers,
    sc_strings_mem,
    sc_worker_threads,
    strings_child,
    worker_threads_child,
)
from .scenarios.world import sc_world_queue

# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

SCENARIOS: Dict[str, Tuple[str, Callable[[Settings, Any], List[Check]]]] = {
    "int64": ("map-style Python int, batch 64, num_workers=0", sc_int64),
    "tensords": ("TensorDataset (N,32) f32 + i64, batch 256, num_workers=0", sc_tensords),
    "collate": ("default_collate of 64 dicts (2 tensors, 2 ndarrays)", sc_collate),
    "int64_w2": ("map-style Python int, batch 64, num_workers=2", sc_int64_w2),
    "dict40_w2": ("dicts of 40 small tensors, batch 16, num_workers=2", sc_dict40_w2),
    "image_w2": ("3x224x224 f32 samples, batch 32, num_workers=2", sc_image_w2),
    "image_w2_rss": ("peak memory of the process tree, image_w2 job", sc_image_w2_rss),
    "cpu_w2": ("pure-Python ~0.5 ms __getitem__, batch 32, num_workers=2", sc_cpu_w2),
    "ttfb_w2": ("time to first batch, num_workers=2, fork, spawn and forkserver", sc_ttfb_w2),
    "state_w2": ("snapshot and resume, num_workers=2", sc_state_w2),
    "seeds_w2": ("per-sample seeding, ~0.5 ms samples, num_workers=2", sc_seeds_w2),
    "shards_w2": ("dynamic vs static sharding, uneven shards, num_workers=2", sc_shards_w2),
    "scaling": ("throughput against num_workers, image and CPU-bound jobs", sc_scaling),
    "gpu": ("batches to the GPU with pin_memory, and a loop with a GPU step", sc_gpu),
    "peers": ("records, memmap images, JPEG, torchvision pipelines: against the peers",
              sc_peers),
    "strings_mem": ("memory of an epoch over 2M Python strings, threads vs processes",
                    sc_strings_mem),
    "worker_threads": ("JPEG decoding with threads inside worker processes (worker_threads=2)",
                       sc_worker_threads),
    "packing": ("sequences packed into 8 x 2048 rows, against Grain's packers", sc_packing),
    "table": ("TableDataset, 8 numeric + 1 string column, batch 256, nw=0", sc_table),
    "table_w2": ("TableDataset, 8 numeric + 1 string column, batch 256, nw=2", sc_table_w2),
    "table_mem": ("memory of a 2-worker job over a memory-mapped 1 GB Arrow file", sc_table_mem),
    "autotune": ("num_workers='auto' against a grid of fixed layouts, eight jobs", sc_autotune),
    "remote": ("shards on a local S3 server behind a slow proxy: streamed, cached, two ranks",
               sc_remote),
    "cluster": ("Ray workers on a local 2-node cluster against Ray Data: records, images, JPEG",
                sc_cluster),
    "world_queue": ("4 ranks: the job's shared shard queue against static sharding, one slow "
                    "rank and equal ranks", sc_world_queue),
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Side-by-side bench of torch.utils.data vs ferroloader (ratios, one run)."
    )
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 7)")
    p.add_argument(
        "--scenarios",
        default="all",
        help="comma-separated subset of: " + ",".join(SCENARIOS) + " (default all)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds (smoke test)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--png",
        metavar="PATH",
        default="bench-results/scaling.png",
        help="where the scaling scenario's picture goes (default bench-results/scaling.png)",
    )
    p.add_argument("--min-time", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_rss-child", dest="rss_child", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--_table-mem-child", dest="table_mem_child", default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--_strings-child", dest="strings_child", default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--_worker-threads-child", dest="worker_threads_child", default=None,
        help=argparse.SUPPRESS,
    )
    p.add_argument("--_peer-child", dest="peer_child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 7
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.scenarios == "all":
        args.scenarios = list(SCENARIOS)
    else:
        args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        unknown = [s for s in args.scenarios if s not in SCENARIOS]
        if unknown:
            p.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child, args.quick)
        return 0
    if args.table_mem_child:
        table_mem_child(args.table_mem_child)
        return 0
    if args.strings_child:
        strings_child(args.strings_child, args.quick)
        return 0
    if args.worker_threads_child:
        worker_threads_child(args.worker_threads_child, args.quick)
        return 0
    if args.peer_child:
        peer_child(args.peer_child, args.quick)
        return 0
    st = Settings(
        repeats=args.repeats,
        quick=args.quick,
        min_time=args.min_time or (0.02 if args.quick else 0.25),
    )
    fl = import_ferro()
    meta = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "ferroloader": ferro_version(fl),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "repeats": st.repeats,
        "quick": st.quick,
        "min_time_s": st.min_time,
        "argv": sys.argv[1:],
    }
    print(
        "ferroloader vs torch.utils.data, interleaved rounds (torch, ferroloader, ...); "
        f"{st.repeats} rounds, >= {st.min_time} s of work per timing"
    )
    print(
        "  "
        + ", ".join(f"{k} {meta[k]}" for k in ("python", "torch", "numpy", "ferroloader", "cpus"))
    )
    print("  ratios are the result; absolute figures are context (shared, noisy machine)")

    results: List[Scenario] = []
    crashed = False
    t_all = time.perf_counter()
    for name in args.scenarios:
        title, fn = SCENARIOS[name]
        sc = Scenario(name, title)
        t0 = time.perf_counter()
        LAST_STATS.clear()
        PROGRESS.start(name, title)
        try:
            sc.checks = fn(st, fl)
            sc.stats = LAST_STATS[0] if LAST_STATS else ""
        except Skip as exc:
            sc.status, sc.note = "skipped", str(exc)
        except NotImplementedError as exc:
            if name.endswith(("_w2", "_rss")):
                sc.status, sc.note = "skipped", str(_mw_unavailable(exc))
            else:
                crashed = True
                sc.status, sc.note = "error", traceback.format_exc()
        except Exception:
            crashed = True
            sc.status, sc.note = "error", traceback.format_exc()
        PROGRESS.stop()
        sc.seconds = time.perf_counter() - t0
        gc.collect()
        print_scenario(sc)
        results.append(sc)

    print_table(results)
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s")
    if args.json:
        write_json(args.json, meta, results)
        print(f"results written to {args.json}")
    if "scaling" in args.scenarios:
        why_not = write_scaling_png(args.png, meta)
        print(
            f"scaling picture: {why_not}" if why_not else f"scaling picture written to {args.png}"
        )
    return 1 if crashed else 0
