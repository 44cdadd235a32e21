"""An epoch running: the one-process and multi-process iterators over the
engine's, and pinning for the GPU."""
