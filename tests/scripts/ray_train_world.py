"""Ray Train's TorchTrainer over the job's shared queue
(tests/test_world_queue_ranks.py): ``python ray_train_world.py OUT_DIR``
starts a local Ray cluster and 2 training workers (gloo, CPU); each builds
a ferroloader loader with ``Sharding(mode="dynamic", across="world")``
(even counts, unshuffled), hands it to ``ray.train.torch.prepare_data_loader``
as Ray's guide does, and reads 2 epochs. Each worker writes
``OUT_DIR/rank<r>.json``: per epoch len() before it and the items read, and
its state after the last epoch."""

import json
import os
import sys

import ferroloader as fl
import ray
import ray.train
import ray.train.torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

LENS = [17, 40, 9, 33, 25, 12, 30, 21, 8, 35]  # 230 items


class Shards(fl.ShardedDataset):
    def shards(self):
        return list(range(len(LENS)))

    def iter_shard(self, shard, start=0):
        return iter(range(1000 * shard + start, 1000 * shard + LENS[shard]))

    def shard_len(self, shard):
        return LENS[shard]


def train_loop(config):
    rank = ray.train.get_context().get_world_rank()
    loader = fl.DataLoader(Shards(), batch_size=4,
                           sharding=fl.Sharding(mode="dynamic", across="world"))
    prepared = ray.train.torch.prepare_data_loader(loader)
    epochs = []
    for _ in range(2):
        n = len(prepared)
        epochs.append({"len": n, "items": [int(v) for b in prepared for v in b]})
    record = {"epochs": epochs, "state": loader.state_dict(),
              "prepared": type(prepared).__qualname__}
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def main():
    out = sys.argv[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(
        train_loop, train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=os.path.join(out, "ray"), name="world"),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main()
