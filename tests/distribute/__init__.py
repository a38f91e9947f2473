"""Distributed training: MirroredStrategy, Horovod on this host and on a Spark cluster."""
