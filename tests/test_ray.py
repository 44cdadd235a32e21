"""Workers on a Ray cluster (``worker_method="ray"``): a local cluster of
two nodes started here (``ray.cluster_utils.Cluster``). The batches equal
``num_workers=0``'s for map-style data (shuffled, seeded, per-sample
seeds), sharded data in every mode and a mixture, with 1 to 4 Ray workers;
a state moves between Ray and local workers; an actor killed, and a node
removed, mid-epoch leave the epoch's batches unchanged; the errors are
clear and come at ``iter()`` (or the first ``next()``, as torch's do)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import ferroloader as fl
import pytest
import torch
from helpers import ferro_only, plain, time_limit
from ray_cases import Drawn, Sequences, Stream, WhoAmI, failing_init, mark
from shard_cases import Counted

ray = pytest.importorskip("ray", reason="the Ray tests need ray (a test extra: ferroloader[ray])")

# One Ray cluster at a time on this machine: these tests, and the docs'
# pages that start one, run in one pytest process (ray_cluster: after the
# rest in scripts/test; --dist loadgroup under xdist). The limits leave room
# for Ray on a busy machine (its processes start several times slower
# beside two busy ones).
pytestmark = [ferro_only, time_limit(360), pytest.mark.xdist_group("ray"), pytest.mark.ray_cluster,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

# A node starved of CPU by other work must not be declared dead, nor a
# worker that takes long to import torch: Ray's health checks and worker
# registration given minutes rather than seconds (the defaults fail nodes
# after about 15 s without an answer, workers after 60 s).
PATIENT = {
    "health_check_period_ms": 5000,
    "health_check_timeout_ms": 30000,
    "health_check_failure_threshold": 24,
    "worker_register_timeout_seconds": 300,
}

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def cluster() -> Any:
    """A head node (the training process's) and a second node, on this
    machine; the actors import this folder's modules."""
    from ray.cluster_utils import Cluster

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, saved) if p)
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "_system_config": PATIENT})
    node = c.add_node(num_cpus=4, resources={"other": 4})
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, node
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def batches(loader: Any, epochs: int = 1) -> list[Any]:
    return [plain(b) for _ in range(epochs) for b in loader]


@pytest.mark.parametrize("nw", [1, 2, 4])
def test_map_style_batches_equal_the_main_processs(cluster, nw):
    make = lambda **kw: fl.DataLoader(Drawn(), batch_size=4, shuffle=True, seed=3,  # noqa: E731
                                      per_sample_seed=True, **kw)
    want = batches(make(), epochs=2)
    got = batches(make(num_workers=nw, worker_method="ray"), epochs=2)
    assert got == want


@pytest.mark.parametrize("mode", ["static", "dynamic", "elastic"])
def test_sharded_batches_equal_the_main_processs(cluster, mode):
    lens = [7, 1, 13, 3, 0, 5, 9]

    def make(**kw: Any) -> fl.DataLoader:
        return fl.DataLoader(Counted(lens), batch_size=3, shuffle=True, seed=1,
                             sharding=fl.Sharding(mode=mode, lanes=3), **kw)

    want = batches(make())
    got = batches(make(num_workers=2, worker_method="ray"))
    if mode == "dynamic":  # (the order is the workers' race; the items are not)
        assert sorted(v for b in got for v in b) == sorted(v for b in want for v in b)
        assert len(got) == len(want)
    else:
        assert got == want


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_object_storage_shards_go_through_each_nodes_cache(cluster, tmp_path, mode):
    """file:// shards (object storage's code path) read through a shard
    cache by the actors: the batches of the main process, the cache
    filled on the actors' node (here the same folder)."""
    from remote_servers import read_ints
    from shard_cases import write_int_shards

    lens = [12, 7, 15, 9]
    urls = ["file://" + p for p in write_int_shards(str(tmp_path / "src"), lens)]

    def make(cache: str, **kw: Any) -> fl.DataLoader:
        ds = fl.FileShards(urls, read_ints, lengths=lens,
                           cache=fl.ShardCache(dir=str(tmp_path / cache), budget="1MiB"))
        return fl.DataLoader(ds, batch_size=4, shuffle=True, seed=3,
                             sharding=fl.Sharding(mode=mode, lanes=2), **kw)

    want = batches(make("main"), epochs=2)
    got = batches(make("ray", num_workers=2, worker_method="ray"), epochs=2)
    if mode == "dynamic":  # (the order is the workers' race; the items are not)
        assert sorted(v for b in got for v in b) == sorted(v for b in want for v in b)
    else:
        assert got == want
    assert any(f.is_file() for f in (tmp_path / "ray").rglob("*"))


def test_a_mixture_equals_the_main_processs(cluster):
    def make(**kw: Any) -> fl.DataLoader:
        mix = fl.Mixture({"a": list(range(20)), "b": list(range(100, 130))},
                         {"a": 1.0, "b": 2.0}, seed=4)
        return fl.DataLoader(mix, batch_size=5, **kw)

    assert batches(make(num_workers=3, worker_method="ray")) == batches(make())


@pytest.mark.parametrize("first,then", [("ray", "local"), ("local", "ray")])
def test_a_state_moves_between_ray_and_local_workers(cluster, first, then):
    def make(where: str) -> fl.DataLoader:
        kw = {"num_workers": 2, "worker_method": "ray"} if where == "ray" else {"num_workers": 2}
        return fl.DataLoader(Drawn(), batch_size=4, shuffle=True, seed=8, per_sample_seed=True,
                             **kw)

    want = batches(make("local"), epochs=2)
    a = make(first)
    it = iter(a)
    head = [plain(next(it)) for _ in range(4)]
    state = a.state_dict()
    del it
    b = make(then)
    b.load_state_dict(state)
    assert head + batches(b, epochs=2) == want


def test_worker_info_init_fn_packing_and_snapshots_are_those_of_local_workers(cluster):
    """What a worker sees (get_worker_info(), worker_init_fn) and what
    packing and snapshots make: the same with Ray workers as with local
    worker processes."""

    def info(**kw: Any) -> list[Any]:
        loader = fl.DataLoader(WhoAmI(), batch_size=4, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(9),
                               worker_init_fn=mark, **kw)
        return batches(loader)

    local = info()
    assert {int(w) for b in local for w in b[1]} == {0, 1}
    assert {int(m) for b in local for m in b[4]} == {100, 101}
    assert info(worker_method="ray") == local

    def packed(**kw: Any) -> tuple[list[Any], dict[str, Any], list[Any]]:
        packing = fl.Packing(seq_len=64, rows=2, method="best_fit", pad_id=0)
        loader = fl.DataLoader(Sequences(), batch_size=8, shuffle=True, seed=1,
                               collate_fn=packing.collate, num_workers=2,
                               snapshot_every_n_steps=2, **kw)
        wrapped = packing.wrap(loader)
        it = iter(wrapped)
        head = [plain(next(it)) for _ in range(3)]
        state = wrapped.state_dict()
        return head + [plain(b) for b in it], state, head

    want, _, _ = packed()
    got, state, head = packed(worker_method="ray")
    assert got == want
    resumed = fl.Packing(seq_len=64, rows=2, method="best_fit", pad_id=0)
    loader = fl.DataLoader(Sequences(), batch_size=8, shuffle=True, seed=1,
                           collate_fn=resumed.collate, num_workers=2)
    wrapped = resumed.wrap(loader)
    wrapped.load_state_dict(state)
    assert head + [plain(b) for b in wrapped] == want


@pytest.mark.parametrize("transport", ["stream", "object_store"])
def test_an_actor_killed_mid_epoch_changes_no_batch(cluster, transport):
    make = lambda **kw: fl.DataLoader(Drawn(60, delay=0.002), batch_size=4,  # noqa: E731
                                      shuffle=True, seed=5, per_sample_seed=True, **kw)
    want = batches(make())
    loader = make(num_workers=2,
                  worker_method=fl.RayWorkers(max_restarts=2, transport=transport))
    it = iter(loader)
    got = [plain(next(it)) for _ in range(3)]
    ray.kill(loader._ray_pool.actors[0])
    got += [plain(b) for b in it]
    assert got == want
    places = loader.stats().ray
    assert places[0].restarts == 1 and places[1].restarts == 0


def test_a_lane_of_an_actor_killed_goes_on_where_it_stood(cluster):
    lens = [9, 14, 5, 11, 8, 6]

    def make(**kw: Any) -> fl.DataLoader:
        return fl.DataLoader(Counted(lens, delay=0.002), batch_size=3, shuffle=True, seed=2,
                             sharding=fl.Sharding(lanes=4), **kw)

    want = batches(make())
    loader = make(num_workers=2, worker_method="ray")
    it = iter(loader)
    got = [plain(next(it)) for _ in range(5)]
    ray.kill(loader._ray_pool.actors[1])
    got += [plain(b) for b in it]
    assert got == want


def test_release_ends_the_idle_actors_of_loaders_gone(cluster):
    import gc

    import ferroloader.ray as flray

    gc.collect()  # (the loaders of the tests before leave their actors idle)
    flray.release()
    free = ray.available_resources().get("other", 0)
    opts = fl.RayWorkers(resources={"other": 1})
    loader = fl.DataLoader(Drawn(8), batch_size=4, num_workers=2, worker_method=opts)
    assert len(batches(loader)) == 2
    assert ray.available_resources().get("other", 0) == free - 2
    del loader
    gc.collect()
    # (the actors wait for the next loader, holding their resources, until released)
    assert flray.release() == 2
    deadline = time.monotonic() + 60
    while ray.available_resources().get("other", 0) < free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("other", 0) == free
    assert flray.release() == 0


def test_errors_are_clear(cluster):
    # a dataset that cannot travel to the cluster: at iter()
    import threading

    class Locked(Drawn):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()

    with pytest.raises(fl.ConfigError, match="cannot be sent to the Ray workers"):
        iter(fl.DataLoader(Locked(), num_workers=1, worker_method="ray"))
    # a worker whose set-up raises: at the first next(), as torch raises it
    loader = fl.DataLoader(Drawn(), num_workers=1, worker_method="ray",
                           worker_init_fn=failing_init)
    with pytest.raises(ValueError, match="worker_init_fn of worker 0 refuses"):
        next(iter(loader))
    # arguments
    with pytest.raises(fl.ConfigError, match="num_workers >= 1"):
        fl.DataLoader(Drawn(), worker_method="ray")
    with pytest.raises(fl.ConfigError, match="max_restarts"):
        fl.RayWorkers(max_restarts=-1)
    with pytest.raises(fl.ConfigError, match="transport should be one of"):
        fl.RayWorkers(transport="udp")


def test_an_iterable_replica_lost_is_named(cluster):
    loader = fl.DataLoader(Stream(), batch_size=2, num_workers=1, worker_method="ray")
    it = iter(loader)
    next(it)
    ray.kill(loader._ray_pool.actors[0])
    with pytest.raises(RuntimeError, match="IterableDataset's replica cannot move"):
        list(it)


def test_a_node_removed_mid_epoch_changes_no_batch(cluster):
    """The workers run on the second node (avoid_trainer_node); the node is
    removed mid-epoch; their actors start again on the node that is left."""
    c, node = cluster
    make = lambda **kw: fl.DataLoader(Drawn(60, delay=0.002), batch_size=4,  # noqa: E731
                                      shuffle=True, seed=6, per_sample_seed=True, **kw)
    want = batches(make())
    loader = make(num_workers=2, worker_method=fl.RayWorkers(avoid_trainer_node=True))
    it = iter(loader)
    got = [plain(next(it)) for _ in range(3)]
    assert {p.node_id for p in loader.stats().ray} == {node.node_id}
    c.remove_node(node)
    got += [plain(b) for b in it]
    assert got == want
    assert all(p.restarts == 1 and p.node_id != node.node_id for p in loader.stats().ray)


def test_without_ray_the_error_names_the_extra():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["ray"] = None  # as if it were not installed
        import ferroloader
        try:
            ferroloader.DataLoader(list(range(4)), num_workers=2, worker_method="ray")
        except ferroloader.ConfigError as e:
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=90)
    # (ferroloader is not on PyPI: the extra is installed from a checkout)
    assert "pip install ray" in out.stdout and "pip install '.[ray]'" in out.stdout, (
        out.stderr[-2000:])


def test_an_unreachable_cluster_is_a_clear_error_at_iter():
    code = textwrap.dedent(
        """
        import ferroloader, torch
        loader = ferroloader.DataLoader(torch.arange(8), num_workers=1,
                                        worker_method=ferroloader.RayWorkers(address="127.0.0.1:9"))
        try:
            iter(loader)
        except ferroloader.ConfigError as e:
            print("refused:", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert "refused: worker_method='ray': cannot reach the Ray cluster" in out.stdout, (
        out.stdout[-2000:] + out.stderr[-2000:]
    )





# Each of these actors asks 1.5 of a node's 3 "room": two fit at once.
HALF = {"room": 1.5}


@pytest.fixture(scope="module")
def room(cluster: Any) -> Any:
    """A node with room for two actors of ``HALF`` (the cluster's second
    node may have been removed by a test before)."""
    c, _ = cluster
    node = c.add_node(num_cpus=2, resources={"room": 3})
    c.wait_for_nodes()
    assert _wait_for(lambda: _free_other() == 3.0)
    yield node


def _free_other() -> float:
    return ray.available_resources().get("room", 0.0)


def _wait_for(cond: Any, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(cond())


def test_a_train_and_a_val_loader_take_turns_on_a_cluster_with_room_for_one(cluster, room):
    """Room for 2 actors, two loaders of 2 workers each: the val loader
    takes the actors the train loader handed back at its epoch's end (it
    waited 120 s and failed when the train loader kept them), and so on
    for two rounds; then a loader placed otherwise (num_cpus=0) ends the
    idle actors for their room. Worker counts 1, 2, 2, 1, 2 one after
    the other all place."""
    import ferroloader.ray as flray

    flray.release()
    assert _wait_for(lambda: _free_other() == 3.0)
    opts = fl.RayWorkers(resources=HALF, place_within=120)
    kw = {"batch_size": 4, "seed": 1, "per_sample_seed": True}
    train = fl.DataLoader(Drawn(16), shuffle=True, num_workers=2, worker_method=opts, **kw)
    val = fl.DataLoader(Drawn(8), num_workers=2, worker_method=opts, **kw)
    want_train = batches(fl.DataLoader(Drawn(16), shuffle=True, **kw), 2)
    want_val = batches(fl.DataLoader(Drawn(8), **kw), 2)
    got_train, got_val = [], []
    for _ in range(2):
        got_train += batches(train)
        got_val += batches(val)
    assert got_train == want_train and got_val == want_val
    other = fl.RayWorkers(resources=HALF, num_cpus=0, place_within=120)
    for n in (1, 2, 2, 1, 2):
        assert len(batches(fl.DataLoader(Drawn(8), batch_size=4, num_workers=n,
                                         worker_method=other))) == 2
    flray.release()


def test_a_loader_that_cannot_place_says_so_then_names_who_holds_the_room(
        cluster, room, monkeypatch, caplog):
    import logging

    import ferroloader.hosts.ray.pool as ray_pool
    import ferroloader.ray as flray

    flray.release()
    assert _wait_for(lambda: _free_other() == 3.0)
    monkeypatch.setattr(ray_pool, "WARN_PLACING_AFTER", 0.5)
    train = fl.DataLoader(Drawn(16), batch_size=4, num_workers=2,
                          worker_method=fl.RayWorkers(resources=HALF))
    it = iter(train)
    next(it)  # the train loader holds its 2 actors mid-epoch
    caplog.clear()
    val = fl.DataLoader(Drawn(8), batch_size=4, num_workers=1,
                        worker_method=fl.RayWorkers(resources=HALF, place_within=2))
    with caplog.at_level(logging.WARNING, logger="ferroloader.ray"):
        t0 = time.monotonic()
        with pytest.raises(fl.ConfigError, match="could not be placed within 2 s") as e:
            iter(val)
        assert time.monotonic() - t0 < 60
    assert f"id {id(train):#x}" in str(e.value) and "holds 2 actors" in str(e.value)
    said = [r.getMessage() for r in caplog.records if r.name == "ferroloader.ray"]
    assert len(said) == 1 and "wait for room" in said[0], said
    del it
    train.close()
    flray.release()


@pytest.mark.parametrize("ask", [{"num_cpus": 100}, {"resources": {"no_such_thing": 1}}],
                         ids=["cpus", "resource"])
def test_actors_no_node_can_hold_fail_at_once(cluster, ask):
    t0 = time.monotonic()
    loader = fl.DataLoader(Drawn(8), num_workers=1, worker_method=fl.RayWorkers(**ask))
    with pytest.raises(fl.ConfigError, match="no node of the Ray cluster can hold"):
        iter(loader)
    assert time.monotonic() - t0 < 60  # (it waited the full 120 s)


def test_an_address_other_than_the_connected_clusters_is_an_error(cluster):
    loader = fl.DataLoader(Drawn(8), num_workers=1,
                           worker_method=fl.RayWorkers(address="127.0.0.1:1"))
    with pytest.raises(fl.ConfigError, match="connected to the Ray cluster at"):
        iter(loader)
    c, _ = cluster
    same = fl.DataLoader(Drawn(8), batch_size=4, num_workers=1,
                         worker_method=fl.RayWorkers(address=c.address))
    assert len(batches(same)) == 2


def test_actors_go_back_at_an_epochs_end_on_close_and_after_a_with_block(cluster, room):
    """With idle_timeout=0 an actor handed back ends at once: its room is
    free. Without persistent workers it is handed back when the epoch
    ends; persistent ones are kept until close() or the with block ends."""
    import ferroloader.ray as flray

    flray.release()
    assert _wait_for(lambda: _free_other() == 3.0)
    opts = fl.RayWorkers(resources=HALF, idle_timeout=0)
    loader = fl.DataLoader(Drawn(8), batch_size=4, num_workers=2, worker_method=opts)
    assert len(batches(loader)) == 2
    assert _wait_for(lambda: _free_other() == 3.0), _free_other()
    kept = fl.DataLoader(Drawn(8), batch_size=4, num_workers=2, worker_method=opts,
                         persistent_workers=True)
    assert len(batches(kept)) == 2
    time.sleep(1.0)
    assert _free_other() == 0.0
    kept.close()
    assert _wait_for(lambda: _free_other() == 3.0), _free_other()
    with fl.DataLoader(Drawn(8), batch_size=4, num_workers=2, worker_method=opts,
                       persistent_workers=True) as held:
        it = iter(held)
        next(it)
        assert _free_other() == 0.0
    assert _wait_for(lambda: _free_other() == 3.0), _free_other()
    with pytest.raises(RuntimeError, match=r"DataLoader was closed"):
        list(it)  # (its workers are gone: no silent end of the epoch)
    assert len(batches(held)) == 2  # a closed loader starts workers again


def test_a_worker_lost_for_good_is_a_ray_worker_lost_that_tells_its_story(cluster):
    loader = fl.DataLoader(Drawn(60, delay=0.002), batch_size=4, num_workers=2,
                           worker_method=fl.RayWorkers(max_restarts=0))
    it = iter(loader)
    next(it)
    ray.kill(loader._ray_pool.actors[0])
    with pytest.raises(fl.RayWorkerLost) as e:
        list(it)
    err = e.value
    assert isinstance(err, fl.WorkerDiedError) and isinstance(err, fl.FerroloaderError)
    text = str(err)
    assert text.startswith("DataLoader worker 0 (a Ray actor on node "), text
    assert "reading indices [" in text and "killed (ray.kill)" in text, text
    assert "max_restarts=0" in text and "Traceback" not in text, text
    assert err.worker_id == 0 and err.task[0] == "ints" and err.exit_code is None
    # a process that ends itself: replaced once, it ends again on the same task
    from ray_cases import ExitsAt

    loader = fl.DataLoader(ExitsAt(40, at=5), batch_size=4, num_workers=1,
                           worker_method=fl.RayWorkers(max_restarts=1))
    with pytest.raises(fl.RayWorkerLost, match=r"reading indices \[4, 5, 6, 7\].*after 1 "
                                               r"restarts") as e:
        list(loader)
    assert "exit" in str(e.value)
