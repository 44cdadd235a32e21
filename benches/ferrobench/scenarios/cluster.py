"""ferroloader's Ray workers against Ray Data, on a local Ray cluster of
two nodes (cluster): the head node runs the training process, the second
node the workers. Jobs: records, memory-mapped images, JPEG
decoding (``benches/peers.py``'s datasets). Each round times each loader,
interleaved, over as many epochs as 2 local workers take about a second
for (the same count for all):

- ferroloader, 2 Ray workers on the second node
  (``worker_method=RayWorkers(avoid_trainer_node=True)``), its batches on a
  stream per worker (the default), and through Ray's object store
  (``transport="object_store"``);
- Ray Data, ``ray.data.range(n).map_batches(fetch and stack)`` iterated
  with ``iter_torch_batches``: its defaults, and a tuned concurrency (2
  tasks, the second node's CPUs);
- ferroloader with 2 local worker processes.

Also: on JPEG, the CPU seconds per batch spent on the training host (the
training process and the processes it starts: Ray's actors are the second
node's) with the Ray workers against local workers; and the bytes per
second of the images job, whose batches cross between the nodes."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ..harness import Check, Settings, Skip


def _epoch(loader: Any, epochs: int = 1) -> Tuple[int, float, float]:
    """``epochs`` epochs (of a loader, or of a fresh iterable each from
    ``loader()``): samples, seconds, CPU seconds of this process and its
    reaped children."""
    t0, c0 = time.perf_counter(), os.times()
    n = 0
    for _ in range(epochs):
        for batch in (loader() if callable(loader) else loader):
            first = batch["x"] if isinstance(batch, dict) else batch
            n += len(first)
    c1 = os.times()
    return n, time.perf_counter() - t0, sum(c1[:4]) - sum(c0[:4])


def _ray_data(ray: Any, ds: Any, batch: int, concurrency: Any) -> Any:
    """Ray Data over the same map-style dataset: indices, fetched and
    stacked in ``map_batches``, iterated as torch batches."""

    def fetch(ids: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        samples = [ds[int(i)] for i in ids["id"]]
        if isinstance(samples[0], dict):
            return {"x": np.stack([s["x"] for s in samples]),
                    "label": np.asarray([s["label"] for s in samples])}
        return {"x": np.stack(samples)}

    kw: Dict[str, Any] = {"batch_size": batch}
    if concurrency is not None:
        kw["concurrency"] = concurrency
    data = ray.data.range(len(ds)).map_batches(fetch, **kw)
    return data.iter_torch_batches(batch_size=batch)


def sc_cluster(st: Settings, fl: Any) -> List[Check]:
    try:
        import ray
        import ray.data
        from ferroloader.ray import release
        from ray.cluster_utils import Cluster
    except ImportError as e:
        raise Skip(f"skipped: needs ray[data] (the bench extra): {e}") from None
    import peers  # benches/peers.py: the datasets

    root = peers.tempdir()
    cluster = None
    try:
        data = peers.make_data(root, jpegs=128)
        # (the actors import the datasets' module from here)
        bench_dir = os.path.dirname(os.path.abspath(peers.__file__))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (bench_dir, os.environ.get("PYTHONPATH")) if p)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        # 6 logical CPUs on 2 cores: the actors of ferroloader's 2 loaders
        # (2 each) stay, idle, while the other loaders' epochs run, and Ray
        # Data would wait forever for CPUs they hold; the loaders run one
        # at a time, so the 2 cores are each one's alone
        cluster.add_node(num_cpus=6)
        ray.init(address=cluster.address, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        remote = fl.RayWorkers(avoid_trainer_node=True)
        via_store = fl.RayWorkers(avoid_trainer_node=True, transport="object_store")
        checks: List[Check] = []
        for job in ("records", "images", "jpeg"):
            ds, batch = data[job]
            loaders: Dict[str, Callable[[], Any]] = {
                "ray": lambda ds=ds, batch=batch: fl.DataLoader(
                    ds, batch_size=batch, shuffle=True, num_workers=2, worker_method=remote),
                "store": lambda ds=ds, batch=batch: fl.DataLoader(
                    ds, batch_size=batch, shuffle=True, num_workers=2, worker_method=via_store),
                "data": lambda ds=ds, batch=batch: _ray_data(ray, ds, batch, None),
                "data2": lambda ds=ds, batch=batch: _ray_data(ray, ds, batch, 2),
                "local": lambda ds=ds, batch=batch: fl.DataLoader(
                    ds, batch_size=batch, shuffle=True, num_workers=2),
            }
            kept = {k: make() for k, make in loaders.items() if k in ("ray", "store", "local")}
            for k in kept:
                _epoch(kept[k])  # warm: the actors and the workers start
            _epoch(loaders["data"]())
            # each timing runs as many epochs as 2 local workers take
            # about a second for: one epoch of these small jobs (4-32
            # batches) would time the start of an epoch, not its throughput
            epochs = max(1, round(1.0 / _epoch(kept["local"])[1]))
            rates: Dict[str, List[float]] = {k: [] for k in loaders}
            cpu: Dict[str, List[float]] = {"ray": [], "local": []}
            for _ in range(st.repeats):
                for k, make in loaders.items():
                    loader = kept[k] if k in kept else make
                    n, secs, host_cpu = _epoch(loader, epochs)
                    rates[k].append(n / secs)
                    if k in cpu:
                        cpu[k].append(host_cpu / max(1, -(-n // batch)))
            # (the stream is the default where it measured faster; on small
            # batches both are within noise, so "not slower" is 0.95)
            for base, name, target in (("store", "its batches through Ray's object store", 0.95),
                                       ("data", "Ray Data (defaults)", 2.0),
                                       ("data2", "Ray Data (concurrency=2)", 2.0),
                                       ("local", "2 local worker processes", 0.8)):
                t = 1.0 if job == "jpeg" and base.startswith("data") else target
                c = Check(f"{job}: 2 Ray workers on the other node", "samples/s", name, target=t)
                for b, f in zip(rates[base], rates["ray"]):
                    c.add(b, f)
                checks.append(c)
            if job == "jpeg":
                c = Check("jpeg: training host CPU s per batch, Ray workers on the other node",
                          "s", "2 local worker processes", target=0.25, higher_is_better=False)
                for b, f in zip(cpu["local"], cpu["ray"]):
                    c.add(b, f)
                checks.append(c)
            if job == "images":
                per = 3 * 224 * 224
                mbs = [r * per / 2**20 for r in rates["ray"]]
                checks[-4].note = (f"batches crossing between the nodes: "
                                   f"{min(mbs):.0f}-{max(mbs):.0f} MiB/s")
            del kept
            release()  # the actors of this job's loader, for the next job's
        return checks
    finally:
        try:
            ray.shutdown()
        finally:
            if cluster is not None:
                cluster.shutdown()
            shutil.rmtree(root, ignore_errors=True)
