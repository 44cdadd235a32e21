"""Side-by-side bench: ``torch.utils.data`` against ``ferroloader`` in one run.

Every scenario times the two libraries on the same data, interleaved (torch,
ferroloader, torch, ferroloader, ... for ``--repeats`` rounds) after one
warm-up each, and reports the ratio ferroloader/torch as the **median of the
per-round ratios** with its spread (min-max). The machines this runs on are
shared and noisy (identical code measured against itself varies by up to
20 %), so the ratios are the result; absolute rates are printed as context only.

Scenarios (``--scenarios``, comma-separated; default all):

=============  ==========================================================  =========
name           what                                                        target
=============  ==========================================================  =========
int64          map-style dataset -> Python int, batch 64, num_workers=0    >= 2x
tensords       TensorDataset (N,32) f32 + i64 labels, batch 256, nw=0      >= 5x
collate        default_collate of 64 dicts of small tensors/ndarrays       >= 2x
int64_w2       Python-int dataset, batch 64, num_workers=2                 >= 10x,
               (and ferroloader nw=2 no slower than its own nw=0)          >= 1x
dict40_w2      samples = dicts of 40 small tensors, batch 16, nw=2         >= 5x
image_w2       samples 3x224x224 f32, batch 32, nw=2, MB/s                 >= 1.5x,
               (and ferroloader >= half a one-thread memcpy of the batch)  >= 0.5x
image_w2_rss   peak PSS/RSS of the process tree for the image_w2 job       <= 1x
cpu_w2         pure-Python CPU-bound __getitem__ (~0.5 ms), nw=2           >= 0.9x
ttfb_w2        time to first batch, nw=2, with fork and with spawn;        <= 1x
               with forkserver in a fresh interpreter: the first epoch    <= 1x
               and the later ones (a new loader per epoch)               <= 0.5x
state_w2       state_dict() mid-epoch, nw=2 and nw=8, against a 1 ms       <= 1x
               budget;
               load_state_dict() + first batch against a fresh epoch's     <= 1.1x
seeds_w2       per_sample_seed=True against unseeded, ~0.5 ms samples,    >= 0.9x
               nw=2 (the note gives the microseconds added per sample)
shards_w2      a ShardedDataset with one shard as large as its 16 small    >= 1.3x
               ones together, ~0.2 ms items, nw=2: dynamic sharding's
               epoch rate against static's
gpu            (CUDA only; skipped without) images 3x224x224, batch 64,
               4 and 8 workers: GB/s reaching the GPU with pin_memory=True  >= 3x,
               against torch's, and against ferroloader's pin=False;       >= 1x
               steps/s of a loop with a ~8.5 ms GPU step against the step  >= 0.95x
               alone on a batch already on the GPU
scaling        throughput against num_workers (1, 2, 4, ... up to the      (curve)
               machine's cores) on the image and CPU-bound jobs, torch and
               ferroloader; --png PATH draws it (default
               bench-results/scaling.png; needs matplotlib, the bench extra)
peers          records (dict of f32[16] + label, batch 256), uint8 images  >= 1x
               from a memory map (batch 32) and PIL-decoded JPEGs (batch
               32), 2 workers or threads each, shuffled: ferroloader's
               threads (worker_method="thread") against torchdata nodes
               threads, SPDL threads and its own processes (also each
               loader alone in a fresh process); its processes against
               torch, nodes threads and Grain processes
strings_mem    summed PSS growth of a 2-worker shuffled epoch over 2 million <= 0.1x
               Python strings with worker threads, against the dataset's
               size; their peak against process workers'                  <= 0.8x
worker_threads PIL JPEG decoding (256x256, batch 32), worker_threads=2:     >= 1.2x
               1 process x 2 threads against 1 process; 2 x 2 against 2   >= 1x
               processes; 2 x 2 against 4 processes (as many workers),    >= 0.9x
               its peak summed PSS against theirs                         <= 1x
packing        20,000 token sequences (geometric lengths, mean 150) packed    >= 1x
               into batches of 8 x 2048 rows, tokens/s: Packing (first and
               best fit) against Grain's FirstFit/BestFitPackIterDataset
table          TableDataset, 1M rows x (8 numeric + 1 string), batch       >= 10x,
               256, shuffled, nw=0, rows/s: numeric columns against torch
               over a per-row pyarrow dataset and over HF datasets'
               with_format("torch"); against a hand-written __getitems__   >= 1x
               with pyarrow take; with the string column against per-row   >= 1x
table_w2       the same with num_workers=2
table_mem      peak summed PSS of a 2-worker epoch over a memory-mapped    <= 1.1x
               Arrow IPC file of 1 GB, against the file's size plus the
               batches in flight
autotune       num_workers="auto" on six jobs (JPEG decoding with a random   >= 0.95x,
               crop, a ~50 us pure-Python dict, 5 ms I/O waits, 3 MB         >= 0.9x,
               samples, 2M strings under a RAM budget, a 20 ms training     >= 1x
               step): a grid of fixed layouts gives the best one (B); auto
               and B each run one long epoch from nothing: auto's second
               half against B's, its whole epoch against B's; auto against
               torch at num_workers=0 and os.cpu_count(); under the budget
               the workers' peak PSS, on the 20 ms loop the workers used
remote         shards on moto's S3 server behind a proxy adding 20 ms per    >= 2x,
               request (200 MiB/s shared), 3x64x64 uint8 images in shards
               of 256, batch 32, 2 workers: a cold epoch streamed through
               FileShards against litdata's and MosaicML Streaming's
               StreamingDataset, each on its own format;
               a warm cache against local disk;                            >= 0.8x
               two ranks sharing one cache: objects downloaded / shards    <= 1x
cluster        a local Ray cluster of 2 nodes (the trainer's, the workers'): >= 0.95x,
               ferroloader's 2 Ray workers on the other node (stream) on
               records, images, JPEG against the same with the batches
               through Ray's object store; against Ray Data (map_batches, >= 2x,
               iter_torch_batches; defaults and concurrency=2), JPEG      >= 1x,
               only at the decode limit; against 2 local worker processes; >= 0.8x
               on JPEG the training host's CPU per batch, Ray workers      <= 0.25x
               against local processes; MiB/s between the nodes (images)
world_queue    4 forked ranks, even=False, batch 32, every rank waiting     <= 0.5x,
               0.3 ms an item: an epoch's seconds (first rank's start to   <= 0.6x,
               last rank's end) with Sharding(across="world") against      <= 0.2x
               static sharding, one rank 10x slower, on 24 file shards of
               10-60 items, one shard per rank, 64 shards of 100; the same
               with equal ranks                                            <= 1.1x
=============  ==========================================================  =========

The ``*_w2`` scenarios are skipped with a note while ferroloader raises
``NotImplementedError`` for ``num_workers > 0``.

Exit status: 0 when the report was produced, whether or not targets were met;
non-zero only when the bench itself (or a library under test) crashed.

Usage::

    python benches/bench_vs_torch.py [--repeats 7] [--scenarios a,b] [--quick] [--json PATH]
"""

import os

# benches/, the folder that holds this package and its entry point (on
# sys.path when the entry point runs; fresh interpreters put it there)
BENCHES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the entry point: the bench's fresh child processes run it with a hidden
# --_*-child option
ENTRY = os.path.join(BENCHES, "bench_vs_torch.py")
