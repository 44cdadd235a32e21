"""An epoch's plan and its state: the record of an epoch (generators,
base seed, a loaded state), the index stream or the shards' lanes, the
job's shared queue, mixtures' draws, and snapshot and resume."""
