"""What an epoch reads: sharded datasets and their options, shards in
object storage through the shard cache, tar and table shards, sequence
packing, map-style data through the shared queue."""
