"""A split's training and evaluation read: from the shard plan to ``tf.data``.

Lowest first: ``shards`` and ``row_ranges`` plan which rows each rank reads (no I/O);
``features``, ``arrays``, ``packing`` and ``blocks`` turn row groups into batches of tensors;
``row_group_worker``, ``shard_epochs`` and ``unischema_epochs`` read a shard's row groups on
Petastorm's pools, and ``shutdown`` stops them; ``shuffle``, ``memory_cache``,
``preprocess_hook``, ``next_epoch`` and ``epoch_position`` shape an epoch; ``epoch_stream`` is
one shard's epochs of one split, and ``tfdata`` its ``tf.data.Dataset``.
"""
