"""The job's shared shard queue with real ranks: 2 to 4 processes over
gloo on loopback, the queue in the default process group's store (a
TCPStore on rank 0), over local files, files on the test S3 server, Parquet
row groups and a map-style dataset; a rank lost mid-epoch and the job
restarted from the last states; the store's host lost."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from collections import Counter
from typing import Any, Optional, Sequence

import pytest
from helpers import ferro_only, time_limit
from remote_servers import free_port
from shard_cases import ranges, write_int_shards

pytestmark = [ferro_only, pytest.mark.filterwarnings("ignore::UserWarning")]

LENS = [7, 1, 23, 3, 0, 5, 9, 2, 12, 4, 6, 1, 8, 10]
# a rank that has not ended in this long is stuck (a run takes seconds)
STUCK_AFTER = 120.0


def all_items(lens: list[int]) -> list[int]:
    return [1000 * s + o for s, n in enumerate(lens) for o in range(n)]


def run_job(world: int, out: str, spec: dict[str, Any], expect_loss: bool = False
            ) -> list[dict[str, Any]]:
    """Starts `world` ranks, waits for each (a rank lost does not end the
    others, as it would not in a job until its launcher acts), and gathers
    what each wrote. Ranks come from the fork server (it has imported
    torch): a fork of this process, whose threads (the S3 server's) may
    hold the resolver's lock, could hang the rank's first connection."""
    import world_ranks

    port = free_port()
    ctx = multiprocessing.get_context("forkserver")
    procs = [ctx.Process(target=world_ranks.world_rank, args=(r, world, port, out, spec))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(STUCK_AFTER)
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not stuck, f"ranks {stuck} were stuck for {STUCK_AFTER} s"
    if not expect_loss:
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    got = []
    for r in range(world):
        path = os.path.join(out, f"rank{r}.json")
        got.append(json.load(open(path)) if os.path.exists(path) else None)
    return got


def epoch_items(ranks: list[dict[str, Any]], e: int) -> list[int]:
    for r in ranks:
        assert r["error"] is None, r["error"]
    return [v for r in ranks for v in r["epochs"][e]["items"]]


@time_limit(240)
@pytest.mark.parametrize("world,nw", [(2, 0), (3, 2), (4, 0)])
def test_gloo_ranks_read_every_item_once_from_local_files(tmp_path, world, nw):
    paths = write_int_shards(str(tmp_path / "src"), LENS)
    spec = {"kind": "files", "paths": paths, "lens": LENS, "batch": 3, "even": False,
            "epochs": 2, "nw": nw}
    ranks = run_job(world, str(tmp_path), spec)
    for r in ranks:
        assert r["error"] is None, r["error"]
    for e in range(2):
        assert sorted(epoch_items(ranks, e)) == all_items(LENS)
    # (shards cut into ranges of 8 items, shuffle_block=4)
    assert sum(r["queue"]["shards"] for r in ranks) == 2 * ranges(LENS, world, 4)


@time_limit(240)
def test_gloo_ranks_even_counts_hold_back_and_carry(tmp_path):
    paths = write_int_shards(str(tmp_path / "src"), LENS)
    spec = {"kind": "files", "paths": paths, "lens": LENS, "batch": 3, "even": True,
            "epochs": 3, "nw": 0}
    ranks = run_job(3, str(tmp_path), spec)
    for e in range(3):
        sizes = {len(r["epochs"][e]["items"]) for r in ranks}
        assert len(sizes) == 1, sizes
        assert sizes.pop() % 3 == 0
    read = Counter(v for e in range(3) for v in epoch_items(ranks, e))
    # nothing read more often than the epochs allow, and what was held back
    # counted, then read the next epoch
    assert all(n <= 3 for n in read.values())
    assert sum(r["queue"]["held_back"] for r in ranks) > 0
    assert sum(read.values()) <= 3 * sum(LENS)


@time_limit(240)
def test_gloo_ranks_over_s3_tables_and_map_style_data(tmp_path, s3_server):
    bucket = "worldq"
    s3_server.bucket(bucket)
    local = write_int_shards(str(tmp_path / "src"), LENS)
    urls = []
    for p in local:
        with open(p, "rb") as f:
            s3_server.put(bucket, os.path.basename(p), f.read())
        urls.append(f"s3://{bucket}/{os.path.basename(p)}")
    # (the fork server's ranks have its environment, not this process's)
    s3 = {"kind": "s3", "paths": urls, "lens": LENS, "batch": 3, "even": False, "epochs": 1,
          "cache": str(tmp_path / "cache"), "env": s3_server.env}
    os.makedirs(tmp_path / "s3")
    ranks = run_job(2, str(tmp_path / "s3"), s3)
    assert all(r["error"] is None for r in ranks), [r["error"] for r in ranks]
    assert sorted(epoch_items(ranks, 0)) == all_items(LENS)

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table_paths = []
    for k in range(3):
        p = str(tmp_path / f"t{k}.parquet")
        pq.write_table(pa.table({"id": list(range(100 * k, 100 * k + 37))}), p,
                       row_group_size=8)
        table_paths.append(p)
    os.makedirs(tmp_path / "table")
    table = {"kind": "table", "paths": table_paths, "batch": 4, "even": False, "epochs": 1}
    ranks = run_job(3, str(tmp_path / "table"), table)
    assert sorted(epoch_items(ranks, 0)) == [100 * k + i for k in range(3) for i in range(37)]

    os.makedirs(tmp_path / "map")
    mapped = {"kind": "map", "n": 103, "batch": 4, "even": False, "epochs": 2, "nw": 2}
    ranks = run_job(2, str(tmp_path / "map"), mapped)
    for e in range(2):
        assert sorted(epoch_items(ranks, e)) == list(range(103))


@time_limit(300)
@pytest.mark.parametrize("after", [2, 3])
def test_a_rank_lost_mid_epoch_and_the_job_restarted_from_the_last_states(tmp_path, after):
    """Job A checkpoints every rank's state at step 2, then rank 1 dies;
    job B (new processes, a new store, `after` ranks) loads the states and
    reads exactly what was not read before the checkpoint."""
    paths = write_int_shards(str(tmp_path / "src"), LENS)
    spec = {"kind": "files", "paths": paths, "lens": LENS, "batch": 2, "even": False,
            "epochs": 1, "stop": 2, "die": [1]}
    first = run_job(2, str(tmp_path), spec, expect_loss=True)
    before = [v for r in first if r is not None for v in r.get("before_stop", [])]
    assert len(before) == 2 * 2 * 2  # two ranks, two batches of two
    resumed = dict(spec, stop=None, die=[], resume=2)
    for name in ("rank0.json", "rank1.json"):
        os.remove(tmp_path / name)
    second = run_job(after, str(tmp_path), resumed)
    for r in second:
        assert r["error"] is None, r["error"]
    assert sorted(before + epoch_items(second, 0)) == all_items(LENS)


@time_limit(240)
def test_the_store_lost_with_its_rank_is_a_clear_error_not_a_hang(tmp_path):
    """Rank 0 hosts the TCPStore and goes after its first batch; rank 1,
    slower, meets the lost store at its next claim: a ShardQueueError
    naming the store, not a hang."""
    lens = [4] * 40
    paths = write_int_shards(str(tmp_path / "src"), lens)
    spec = {"kind": "files", "paths": paths, "lens": lens, "batch": 2, "even": False,
            "epochs": 1, "store_dies_with": 0, "slow_rank": 1, "delay": 0.02}
    ranks = run_job(2, str(tmp_path), spec, expect_loss=True)
    assert ranks[1] is not None
    assert ranks[1]["error"] is not None and "ShardQueueError" in ranks[1]["error"], ranks[1]
    assert "TCPStore" in ranks[1]["error"]


@time_limit(240)
def test_torchrun_restarts_every_rank_and_each_resumes_from_its_own_state(tmp_path):
    """torchrun --max-restarts=1 with 3 ranks (tests/scripts/world_restart.py):
    every rank saves only its own state after its 3rd batch; rank 1 dies
    after its 5th, torchrun restarts the job, and each rank loads only its
    own last state. What the ranks read up to their states, and after the
    restart, is every item exactly once."""
    out = _run_script(tmp_path, "world_restart.py", 3, "--max-restarts=1")
    lens = [17, 40, 9, 33, 25, 12, 30, 21, 8, 35]  # (the script's)

    def read(name: str) -> list[int]:
        return [v for r in range(3) for v in json.loads((out / name.format(r)).read_text())]

    # (the restarted attempt wrote what each rank read)
    before, after = read("before{}.json"), read("after{}-1.json")
    assert sorted(before + after) == sorted(1000 * s + o for s, n in enumerate(lens)
                                            for o in range(n))


@time_limit(240)
@pytest.mark.parametrize("first,then", [(3, 2), (2, 3)])
def test_a_job_relaunched_on_another_number_of_ranks_resumes_from_each_ranks_own_state(
        tmp_path, first, then):
    """The job of tests/scripts/world_restart.py launched on ``first`` ranks
    with no restarts: every rank saves only its own state after its 3rd
    batch, rank 1 dies after its 5th and the job fails. Launched again by
    hand on ``then`` ranks, each rank loads only its own state (a rank that
    has none, rank 0's). What the ranks read up to their states and after
    the relaunch is every item exactly once."""
    with pytest.raises(AssertionError):
        _run_script(tmp_path, "world_restart.py", first, "--max-restarts=0")
    out = tmp_path / "run"
    assert sorted(p.name for p in out.glob("state*.json")) == [
        f"state{r}.json" for r in range(first)]
    _run_script(tmp_path, "world_restart.py", then, "--max-restarts=0", args=["--relaunch"])
    lens = [17, 40, 9, 33, 25, 12, 30, 21, 8, 35]  # (the script's)
    before = [v for r in range(first) for v in json.loads((out / f"before{r}.json").read_text())]
    after = [v for r in range(then)
             for v in json.loads((out / f"after{r}-relaunch.json").read_text())]
    assert sorted(before + after) == sorted(1000 * s + o for s, n in enumerate(lens)
                                            for o in range(n))


@time_limit(240)
@pytest.mark.ray_cluster
def test_ray_train_keeps_the_shared_queue_through_prepare_data_loader(tmp_path):
    """Ray Train's TorchTrainer, 2 CPU workers (tests/scripts/ray_train_world.py):
    prepare_data_loader leaves a loader over the shared queue as it is (its
    dataset is iterable: no DistributedSampler goes in) and only wraps it;
    len() before each epoch is what each worker reads, and what was read
    over 2 epochs plus what the last held back is every item twice."""
    pytest.importorskip("ray.train", reason="Ray Train is a test extra")
    out = _run_script(tmp_path, "ray_train_world.py", None)
    _two_even_epochs_read_every_item([json.loads((out / f"rank{r}.json").read_text())
                                      for r in range(2)])


def _two_even_epochs_read_every_item(ranks: list[dict[str, Any]],
                                     read_short: int = 0) -> None:
    """Records of 2 ranks over 2 epochs of the scripts' 230 items in
    batches of 4 (unshuffled, even counts): each epoch, len() before it is
    the batches each rank read (in the second, ``read_short`` more); what
    was read plus what is left (from the ranks' states: what the last
    epoch held back, or what is left of it) is every item twice."""
    import ferroloader as fl
    from ferroloader.epoch.accounts import job_accounts, remaining

    lens = [17, 40, 9, 33, 25, 12, 30, 21, 8, 35]  # (the scripts')
    for epoch in range(2):
        counts = {(r["epochs"][epoch]["len"], len(r["epochs"][epoch]["items"]) // 4)
                  for r in ranks}
        assert len(counts) == 1
        n, got = counts.pop()
        assert n - got == (read_short if epoch else 0), (epoch, n, got)
    merged = fl.merge_states([r["state"] for r in ranks])
    left = merged["world_carry"] if merged["epoch"] is None else merged["epoch"]["shards"]
    held = [1000 * s + p for s, e, end in remaining(job_accounts(left))
            for p in range(e, min(end, lens[s]))]
    read = Counter(v for r in ranks for e in r["epochs"] for v in e["items"])
    assert read + Counter(held) == Counter(
        [1000 * s + o for s, n in enumerate(lens) for o in range(n)] * 2)


@time_limit(240)
def test_accelerate_refuses_to_prepare_the_shared_queue_and_it_runs_unprepared(tmp_path):
    """2 processes under torchrun with Accelerator(cpu=True)
    (tests/scripts/accelerate_world.py): accelerator.prepare of a loader
    over the shared queue is refused, naming the way around; the loader
    iterated as it is, beside a prepared model, reads in the process group
    accelerate started: len() before each epoch is each rank's count, and
    every item is read."""
    pytest.importorskip("accelerate", reason="accelerate is a test extra")
    out = _run_script(tmp_path, "accelerate_world.py", 2)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert "without accelerator.prepare" in (r["refused"] or ""), r["refused"]
    _two_even_epochs_read_every_item(ranks)


@time_limit(240)
def test_transformers_trainer_reads_the_shared_queue_from_get_train_dataloader(tmp_path):
    """transformers' Trainer on 2 CPU processes under torchrun
    (tests/scripts/hf_trainer_world.py), the loader returned by an
    overridden get_train_dataloader(), num_train_epochs=2. The Trainer
    counts every epoch as the first's len() (27 batches): the second, 29
    with what the first held back, stops 2 short, and what is left of it is
    in the ranks' states. Nothing of the run is lost (in a third epoch what
    was left of the second would be: the guide says so)."""
    pytest.importorskip("transformers", reason="transformers is a test extra")
    out = _run_script(tmp_path, "hf_trainer_world.py", 2)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [e["len"] for e in ranks[0]["epochs"]] == [27, 29]
    _two_even_epochs_read_every_item(ranks, read_short=2)


def _run_script(tmp_path: Any, name: str, ranks: Optional[int], *flags: str,
                args: Sequence[str] = ()) -> Any:
    """Runs tests/scripts/``name`` with an output folder and ``args`` (under
    torchrun with ``ranks`` processes and ``flags``, or alone with
    ``ranks=None``, on a local Ray cluster of its own if it starts one);
    the folder (kept between runs in one test)."""
    script = os.path.join(os.path.dirname(__file__), "scripts", name)
    out = tmp_path / "run"
    out.mkdir(exist_ok=True)
    launch = ([] if ranks is None else
              ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *flags])
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ADDRESS="local")
    done = subprocess.run([sys.executable, *launch, script, str(out), *args], capture_output=True,
                          text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out
