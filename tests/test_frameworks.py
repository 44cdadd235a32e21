"""The frameworks users train with keep ferroloader's engine and torch's
batches: Lightning (one device, and DDP on 2 CPU ranks), HF accelerate and
the transformers Trainer (through ferroloader.patch()), HF datasets,
webdataset, plain DDP over gloo, torchvision transforms, tqdm,
torch.compile, pickle and deepcopy. Each test runs the real framework
against torch's loader in the same run."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Any, Iterator

import ferroloader as fl
import pytest
import torch
import torch.utils.data as tud
from helpers import assert_same, time_limit

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_DATALOADER = tud.DataLoader


class Data(tud.Dataset):
    """Deterministic samples: a dict of a float vector and the index."""

    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.rand(4, generator=g), "labels": torch.rand((), generator=g), "i": i}


class Served:
    """Counts the epochs ferroloader's engine serves (its iterators)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.epochs = 0
        get = fl.DataLoader._get_iterator

        def counting(loader: Any) -> Any:
            self.epochs += 1
            return get(loader)

        monkeypatch.setattr(fl.DataLoader, "_get_iterator", counting)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Served:
    return Served(monkeypatch)


# --------------------------------------------------------------------------- #
# Lightning
# --------------------------------------------------------------------------- #


@time_limit(180)
def test_lightning_one_device_trains_on_ferroloader(served):
    """A Lightning fit on one CPU device iterates ferroloader's loader
    (engine used, not rebuilt as torch's), sees torch's batches, and ends
    with the weights a torch-loader run ends with."""
    L = pytest.importorskip("lightning", reason="Lightning is a test extra")

    def fit(lib: Any) -> tuple[list, list, Any]:
        class Model(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)
                self.seen: list = []

            def train_dataloader(self) -> Any:
                return lib.DataLoader(Data(), batch_size=4, shuffle=True, num_workers=2)

            def training_step(self, batch: Any, _: int) -> Any:
                self.seen.append([int(i) for i in batch["i"]])
                return (self.layer(batch["x"]).squeeze(-1) - batch["labels"]).pow(2).mean()

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=0.1)

        L.seed_everything(0, verbose=False)
        model = Model()
        trainer = L.Trainer(
            max_epochs=2,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model)
        return model.seen, list(model.layer.parameters()), trainer.train_dataloader

    t_seen, t_weights, _ = fit(tud)
    before = served.epochs
    f_seen, f_weights, loader = fit(fl)
    assert isinstance(loader, fl.DataLoader)
    assert served.epochs - before == 2, "both epochs ran on ferroloader's engine"
    assert f_seen == t_seen
    for a, b in zip(t_weights, f_weights):
        assert torch.equal(a, b)


@contextlib.contextmanager
def _reserved_port() -> Iterator[int]:
    """A port for a rendezvous that no other test can be given: below the
    kernel's ephemeral range (where bind(0), which the other DDP tests and
    Lightning's own pick use, never lands), and held by a lock file while
    the job runs, so two such jobs (pytest -n 4) never share one."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    top = min(low, 32768)
    for port in range(top - 4000, top):
        lock = open(os.path.join(tempfile.gettempdir(), f"ferroloader-test-port-{port}.lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # not held by anything else
        except OSError:
            lock.close()
            continue
        try:
            yield port
        finally:
            lock.close()
        return
    raise RuntimeError("no free port below the ephemeral range")


def _lightning_ddp(out: Any, mode: str, script: str = "lightning_ddp.py") -> list[dict[str, Any]]:
    """One 2-rank DDP fit (tests/scripts/<script>): each rank's record."""
    out.mkdir()
    with _reserved_port() as port:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, *sys.path]),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, "scripts", script), str(out), mode],
            capture_output=True,
            text=True,
            timeout=200,
            env=env,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def lightning_ddp_torch(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    pytest.importorskip("lightning", reason="Lightning is a test extra")
    return _lightning_ddp(tmp_path_factory.mktemp("ddp") / "torch", "torch")


@time_limit(240)
@pytest.mark.parametrize("mode", ["ferroloader", "patched"])
def test_lightning_ddp_on_two_cpu_ranks_keeps_ferroloader(tmp_path, mode, lightning_ddp_torch):
    """strategy="ddp" on 2 CPU ranks: Lightning rebuilds the loader to add a
    DistributedSampler. The rebuilt loader is ferroloader's (its engine
    serves both epochs) whether the model built ferroloader's loader or,
    inside ferroloader.patch(), torch's; each rank sees the batches the
    torch-loader job sees, the ranks' samples are disjoint and cover the
    data, and the final weights are equal."""
    ours = _lightning_ddp(tmp_path / mode, mode)
    for r in range(2):
        t, f = lightning_ddp_torch[r], ours[r]
        assert t["loader"] == "torch.utils.data.dataloader.DataLoader" and t["served"] == 0
        assert f["loader"] == "ferroloader.dataloader.DataLoader"
        assert f["sampler"] == t["sampler"] == "DistributedSampler"
        assert f["served"] == 2
        assert f["seen"] == t["seen"]
        assert f["weights"] == t["weights"]
    for epoch in range(2):
        per_epoch = len(ours[0]["seen"]) // 2
        ranks = [
            {i for b in ours[r]["seen"][epoch * per_epoch : (epoch + 1) * per_epoch] for i in b}
            for r in range(2)
        ]
        assert not ranks[0] & ranks[1]
        assert ranks[0] | ranks[1] == set(range(40))


@time_limit(240)
@pytest.mark.parametrize("mode", ["shards", "sampler"])
def test_lightning_ddp_keeps_the_shared_queue_and_shows_its_len(tmp_path, mode):
    """strategy="ddp" on 2 CPU ranks over the job's shared queue (in the
    process group Lightning starts), a ShardedDataset or a map-style dataset
    with DynamicDistributedSampler: Lightning keeps the loader (its dataset
    is iterable: no DistributedSampler goes in), reads len() before each
    epoch (the progress bar's total) and it is what each rank yields; it
    stops after that many batches without asking for the end, and what the
    even counts held back is still read in the next epoch, whose len()
    counts it: 150 items, batches of 4 on 2 ranks, ranges of 8: 17 batches
    ((150 - 7) // 8), 14 items held back, then 19 ((164 - 7) // 8)."""
    pytest.importorskip("lightning", reason="Lightning is a test extra")
    ranks = _lightning_ddp(tmp_path / mode, mode, "lightning_world.py")
    lens = [7, 30, 12, 3, 25, 18, 9, 21, 14, 11]  # (the script's)
    every = ({1000 * s + o for s, n in enumerate(lens) for o in range(n)} if mode == "shards"
             else set(range(sum(lens))))
    read: Counter[int] = Counter()
    for epoch, expected in enumerate([17, 19]):
        for r in ranks:
            assert r["epochs"][epoch]["total"] == r["epochs"][epoch]["batches"] == expected
        read.update(i for r in ranks for i in r["epochs"][epoch]["items"])
    for r in ranks:
        assert r["loader"] == "ferroloader.dataloader.DataLoader" and r["across"] == "world"
        assert r["held_back"] > 0
    # the first epoch's 136 items, then its 14 held back and 138 of the
    # second's 150: every item read, none more than once an epoch
    assert sum(read.values()) == 17 * 8 + 19 * 8
    assert set(read) == every and max(read.values()) <= 2


@time_limit(120)
def test_fabric_setup_dataloaders_prepares_a_torch_loader_under_the_patch(served):
    """Fabric.setup_dataloaders refuses what is not torch's DataLoader. Inside
    the patch it accepts a loader torch's class built before the patch (on
    one device Fabric does not rebuild it, so torch's engine serves it) and
    one torch's class built inside it (ferroloader's engine); both give the
    batches Fabric gives outside the patch."""
    L = pytest.importorskip("lightning", reason="Lightning is a test extra")
    fabric = L.Fabric(accelerator="cpu", devices=1)

    def batches(loader: Any) -> list:
        torch.manual_seed(0)
        return [{k: v for k, v in b.items()} for b in loader]

    want_loader = fabric.setup_dataloaders(tud.DataLoader(Data(), batch_size=4, shuffle=True))
    want = batches(want_loader)
    built_before = tud.DataLoader(Data(), batch_size=4, shuffle=True, num_workers=2)
    with fl.patch():
        kept = fabric.setup_dataloaders(built_before)
        built_inside = fabric.setup_dataloaders(
            tud.DataLoader(Data(), batch_size=4, shuffle=True, num_workers=2)
        )
        before = served.epochs
        got_kept = batches(kept)
        assert served.epochs == before
        got_inside = batches(built_inside)
        assert served.epochs == before + 1
    assert type(kept).__name__ == type(want_loader).__name__ == "_FabricDataLoader"
    assert type(kept._dataloader) is tud.DataLoader
    assert isinstance(built_inside._dataloader, fl.DataLoader)
    assert_same(want, got_kept)
    assert_same(want, got_inside)


# --------------------------------------------------------------------------- #
# HF accelerate and transformers (through ferroloader.patch())
# --------------------------------------------------------------------------- #


def _acc_batches(loader: Any) -> list:
    torch.manual_seed(0)
    return [{k: v for k, v in b.items()} for b in loader]


@time_limit(120)
@pytest.mark.parametrize("dispatch", [False, True], ids=["shard", "dispatch"])
def test_accelerate_may_not_split_the_shared_queue_again(dispatch):
    """accelerate's prepare_data_loader as each of 2 processes runs it: over
    an iterable dataset it splits the batches across the processes itself
    (IterableDatasetShard) or reads them on one and broadcasts them
    (DataLoaderDispatcher). Over the job's shared queue, which already gives
    each rank its own items, either loses most of them: refused, naming the
    way around; a loader without the queue is still prepared."""
    pytest.importorskip("accelerate", reason="accelerate is a test extra")
    from accelerate.data_loader import prepare_data_loader
    from shard_cases import Counted

    sharding = fl.Sharding(mode="dynamic", across="world", store=torch.distributed.HashStore(),
                           rank=0, world_size=2, even=False)
    queue = fl.DataLoader(Counted([5, 6]), batch_size=2, sharding=sharding)
    kw: dict[str, Any] = ({"put_on_device": True, "device": torch.device("cpu")} if dispatch
                          else {"put_on_device": False})
    with pytest.raises(fl.ConfigError, match=r"accelerate is rebuilding .* shared queue.*"
                                             r"without accelerator.prepare"):
        prepare_data_loader(queue, num_processes=2, process_index=0, **kw)
    # (the loader itself is untouched: it reads its share)
    assert sorted(int(v) for b in queue for v in b) == list(range(5)) + list(range(1000, 1006))
    plain = fl.DataLoader(Counted([5, 6]), batch_size=2)
    prepare_data_loader(plain, num_processes=2, process_index=0, put_on_device=False)


@time_limit(120)
def test_accelerate_prepares_every_loader_and_keeps_ferroloader(served):
    """accelerate's prepare() rebuilds a loader as torch's DataLoader. It
    prepares (wraps in DataLoaderShard) every loader, inside the patch and
    out: torch's class rebuilt inside the patch, a torch loader built before
    the patch, and a ferroloader loader without a patch all run on
    ferroloader's engine; torch's class outside the patch stays torch's.
    Every one gives the batches of torch's prepared loader."""
    accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra")
    acc = accelerate.Accelerator(cpu=True)
    want = _acc_batches(acc.prepare(tud.DataLoader(Data(), batch_size=4, shuffle=True)))

    def check(prepared: Any, engine: type) -> None:
        assert type(prepared).__name__ == "DataLoaderShard" or (
            type(prepared.base_dataloader) is engine
        )
        assert type(prepared.base_dataloader) is engine
        before = served.epochs
        assert_same(want, _acc_batches(prepared))
        assert served.epochs == before + (engine is fl.DataLoader)

    check(acc.prepare(tud.DataLoader(Data(), batch_size=4, shuffle=True)), tud.DataLoader)
    # a plain import keeps the engine: accelerate's rebuild is ferroloader's
    check(acc.prepare(fl.DataLoader(Data(), batch_size=4, shuffle=True)), fl.DataLoader)
    built_before = tud.DataLoader(Data(), batch_size=4, shuffle=True, num_workers=2)
    alias = tud.DataLoader
    with fl.patch():
        assert tud.DataLoader is alias is TORCH_DATALOADER, "no name is rebound"
        assert isinstance(built_before, tud.DataLoader)
        check(acc.prepare(built_before), fl.DataLoader)
        check(acc.prepare(tud.DataLoader(Data(), batch_size=4, shuffle=True)), fl.DataLoader)
        check(
            acc.prepare(fl.DataLoader(Data(), batch_size=4, shuffle=True, num_workers=2)),
            fl.DataLoader,
        )
    check(acc.prepare(tud.DataLoader(Data(), batch_size=4, shuffle=True)), tud.DataLoader)


@time_limit(120)
def test_accelerate_stateful_option_keeps_ferroloader_under_the_patch(served):
    """use_stateful_dataloader=True builds torchdata's StatefulDataLoader;
    under the patch it is ferroloader's, gives torchdata's batches, and its
    state (through JSON) resumes the rest of the epoch exactly. A torchdata
    loader handed to prepare() is prepared too."""
    accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra")
    torchdata = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is a test extra"
    )
    config = accelerate.utils.DataLoaderConfiguration(use_stateful_dataloader=True)
    acc = accelerate.Accelerator(cpu=True, dataloader_config=config)

    def make() -> Any:
        torch.manual_seed(5)  # torchdata's sampler seeds itself when built
        return tud.DataLoader(Data(), batch_size=4, shuffle=True)

    want_loader = acc.prepare(make())
    assert type(want_loader.base_dataloader) is torchdata.StatefulDataLoader
    want = _acc_batches(want_loader)
    with fl.patch():
        handed = acc.prepare(torchdata.StatefulDataLoader(Data(), batch_size=4))
        before = served.epochs
        # (accelerate's state_dict() at prepare starts the epoch, as in torchdata)
        prepared = acc.prepare(make())
    assert type(prepared.base_dataloader) is fl.StatefulDataLoader
    assert type(handed.base_dataloader) is fl.StatefulDataLoader
    assert_same(want, _acc_batches(prepared))
    assert served.epochs == before + 1
    # resume mid-epoch through accelerate's own state methods
    # (torchdata's own resume here is not exact: it fast-forwards torch's
    # RandomSampler, which draws a new seed, so other items follow)
    with fl.patch():
        first = acc.prepare(make())
        torch.manual_seed(0)
        it = iter(first)
        head = [next(it) for _ in range(2)]
        state = json.loads(json.dumps(first.state_dict()))
        del it
        again = acc.prepare(make())
    again.load_state_dict(state)
    assert_same(want, [*head, *_acc_batches(again)])


@time_limit(180)
def test_transformers_trainer_trains_on_ferroloader_inside_patch(tmp_path, served):
    """The transformers Trainer builds its loaders with torch's DataLoader
    and accelerate's prepare; inside ferroloader.patch() the training and
    evaluation loaders are ferroloader's, its engine serves the epochs, and a
    tiny model ends with the weights of the same run on torch's loader.
    After the block the same Trainer trains and evaluates again; its
    rebuilt loaders stay ferroloader's (their datasets are ferroloader
    loaders'), with torch's evaluation loss."""
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: Any, labels: Any = None, i: Any = None) -> dict:
            out = self.layer(x).squeeze(-1)
            return {"loss": (out - labels).pow(2).mean(), "logits": out}

    def train(patched: bool) -> tuple[Any, Any]:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / ("p" if patched else "t")),
            max_steps=6,
            per_device_train_batch_size=4,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            logging_strategy="no",
            remove_unused_columns=False,
            dataloader_num_workers=2 if patched else 0,
            seed=0,
        )
        torch.manual_seed(0)
        model = Tiny()
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=Data(), eval_dataset=Data(8)
        )
        loader = trainer.get_train_dataloader()
        trainer.train()
        return model, loader, trainer

    t_model, t_loader, t_trainer = train(False)
    assert type(t_loader.base_dataloader) is tud.DataLoader
    with fl.patch():
        before = served.epochs
        f_model, f_loader, f_trainer = train(True)
        assert isinstance(f_loader.base_dataloader, fl.DataLoader)
        assert served.epochs > before
        before = served.epochs
        inside = f_trainer.evaluate()
        assert served.epochs == before + 1, "evaluate() inside the patch: ferroloader's"
    for a, b in zip(t_model.parameters(), f_model.parameters()):
        assert torch.equal(a, b)
    # after the block the Trainer rebuilds its loaders over datasets that
    # ferroloader loaders were built on: they stay ferroloader's (a
    # framework's rebuild), and training and evaluating go on
    before = served.epochs
    after = f_trainer.evaluate()
    f_trainer.train()
    assert served.epochs >= before + 2, "rebuilt as ferroloader's after the patch too"
    want = t_trainer.evaluate()
    assert inside["eval_loss"] == after["eval_loss"] == want["eval_loss"]


# --------------------------------------------------------------------------- #
# HF datasets and webdataset
# --------------------------------------------------------------------------- #


@time_limit(120)
@pytest.mark.parametrize("nw", [0, 2])
def test_hf_datasets_map_style_and_iterable(nw):
    """A HF datasets.Dataset with_format("torch") and its
    to_iterable_dataset(num_shards=4) give torch's batches with workers."""
    datasets = pytest.importorskip("datasets", reason="datasets is a test extra")
    ds = datasets.Dataset.from_dict(
        {"x": [[float(i), i / 2] for i in range(30)], "y": list(range(30))}
    )
    torch_ds = ds.with_format("torch")
    torch.manual_seed(0)
    want = list(tud.DataLoader(torch_ds, batch_size=4, shuffle=True, num_workers=nw))
    torch.manual_seed(0)
    assert_same(want, list(fl.DataLoader(torch_ds, batch_size=4, shuffle=True, num_workers=nw)))
    it = ds.to_iterable_dataset(num_shards=4).with_format("torch")
    want = list(tud.DataLoader(it, batch_size=4, num_workers=nw))
    assert_same(want, list(fl.DataLoader(it, batch_size=4, num_workers=nw)))


def _tar_shard(path: str, n: int) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i in range(n):
            for ext, data in (("txt", f"sample {i}"), ("cls", str(i % 3))):
                info = tarfile.TarInfo(f"{i:04d}.{ext}")
                raw = data.encode()
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))


@time_limit(120)
def test_webdataset_pipeline_and_webloader(tmp_path, served):
    """A webdataset pipeline over local tar shards gives torch's batches with
    2 workers; wds.WebLoader (which builds torch's DataLoader) runs on
    ferroloader's engine inside ferroloader.patch()."""
    wds = pytest.importorskip("webdataset", reason="webdataset is a test extra")
    urls = []
    for s in range(2):
        path = str(tmp_path / f"shard-{s}.tar")
        _tar_shard(path, 10 + s)
        urls.append(path)

    def pipeline() -> Any:
        return (
            wds.WebDataset(urls, shardshuffle=False, empty_check=False)
            .decode()
            .to_tuple("txt", "cls")
        )

    want = list(tud.DataLoader(pipeline(), batch_size=4, num_workers=2))
    assert_same(want, list(fl.DataLoader(pipeline(), batch_size=4, num_workers=2)))
    with fl.patch():
        before = served.epochs
        got = list(wds.WebLoader(pipeline(), batch_size=4, num_workers=2))
        assert served.epochs == before + 1
    assert_same(want, got)


# --------------------------------------------------------------------------- #
# plain DDP over gloo
# --------------------------------------------------------------------------- #


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_rank(rank: int, world: int, port: int, out: str, lib_name: str) -> None:
    """One rank of a tiny DDP job: DistributedSampler (set_epoch each
    epoch), 2 workers, SGD; writes its batches and final weights."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    lib = fl if lib_name == "ferroloader" else tud
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = Data(40)
        sampler = lib.DistributedSampler(data, shuffle=True, seed=3)
        # ranks started with spawn would spawn their workers too (a fresh
        # interpreter each, seconds apiece): they fork, for both libraries
        loader = lib.DataLoader(
            data, batch_size=4, sampler=sampler, num_workers=2, multiprocessing_context="fork"
        )
        seen = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for batch in loader:
                seen.append([int(i) for i in batch["i"]])
                opt.zero_grad()
                loss = (model(batch["x"]).squeeze(-1) - batch["labels"]).pow(2).mean()
                loss.backward()
                opt.step()
        weights = [float(w) for w in model.module.weight.detach().flatten()]
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"{lib_name}-{rank}.json"), "w") as f:
        json.dump({"seen": seen, "weights": weights, "loader": type(loader).__module__}, f)


@time_limit(240)
def test_ddp_over_gloo_with_ferroloader_equals_torch(tmp_path):
    """Two ranks on gloo, each with a DistributedSampler and 2 workers, train
    a tiny DDP model: the ranks' samples are disjoint and cover the dataset,
    and every rank's batches and the final weights equal the same job on
    torch's loader."""
    import torch.multiprocessing as tmp

    for lib in ("torch", "ferroloader"):
        tmp.start_processes(
            ddp_rank,
            args=(2, _free_port(), str(tmp_path), lib),
            nprocs=2,
            join=True,
            start_method="spawn",
        )
    res = {
        (lib, r): json.loads((tmp_path / f"{lib}-{r}.json").read_text())
        for lib in ("torch", "ferroloader")
        for r in range(2)
    }
    for r in range(2):
        assert res[("ferroloader", r)]["loader"].startswith("ferroloader")
        assert res[("ferroloader", r)]["seen"] == res[("torch", r)]["seen"]
        assert res[("ferroloader", r)]["weights"] == res[("torch", r)]["weights"]
    per_epoch = len(res[("ferroloader", 0)]["seen"]) // 2
    for epoch in range(2):
        ranks = [
            {
                i
                for b in res[("ferroloader", r)]["seen"][
                    epoch * per_epoch : (epoch + 1) * per_epoch
                ]
                for i in b
            }
            for r in range(2)
        ]
        assert not ranks[0] & ranks[1] and ranks[0] | ranks[1] == set(range(40))


# --------------------------------------------------------------------------- #
# torchvision, tqdm, torch.compile, pickle and deepcopy
# --------------------------------------------------------------------------- #


class Images(tud.Dataset):
    """Random images through torchvision augmentations (random per sample,
    so the workers' seeding decides them)."""

    def __init__(self) -> None:
        from torchvision.transforms import v2

        self.tf = v2.Compose(
            [v2.RandomResizedCrop(16), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32)]
        )

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 255, (3, 24, 24), generator=g, dtype=torch.uint8)
        return self.tf(img), i


@time_limit(120)
def test_torchvision_transforms_tqdm_compile_pickle_deepcopy():
    """torchvision augmentations under workers give torch's batches (same
    worker seeding); tqdm sees len() and every batch; a torch.compile'd
    model trains on the batches; a loader survives pickle and deepcopy and
    the copy gives the same batches."""
    pytest.importorskip("torchvision", reason="torchvision is a test extra")
    tqdm = pytest.importorskip("tqdm", reason="tqdm is a test extra").tqdm
    torch.manual_seed(0)
    want = list(tud.DataLoader(Images(), batch_size=4, shuffle=True, num_workers=2))
    torch.manual_seed(0)
    loader = fl.DataLoader(Images(), batch_size=4, shuffle=True, num_workers=2)
    bar = tqdm(loader, disable=True)
    assert bar.total == len(loader) == 4
    assert_same(want, list(bar))
    model = torch.compile(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, _ in fl.DataLoader(Images(), batch_size=4, num_workers=2):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    for clone in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert isinstance(clone, fl.DataLoader)
        torch.manual_seed(0)
        assert_same(want, list(clone))
