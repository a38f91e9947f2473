"""A process using the disk cache, for the kill and concurrency tests: ``python cache_child.py
ROOT MAX_BYTES KEY SIZE MODE``. It loads :mod:`keras_dl.data.tables.disk_cache` alone (no
TensorFlow) and fills entry KEY with SIZE bytes of ``KEY[0]``, 64 KiB at a time:

- ``fill``: slowly (a pause between chunks), appending a line to ROOT.fills per fill run;
- ``hang``: writes half, prints "half", then waits to be killed;
- ``hold``: gets the entry (pinning it) and keeps it until a line arrives on stdin;
- any other: fills it at once.

Prints the entry's path (or "None") when done.
"""

import importlib.util
import os
import sys
import time

spec = importlib.util.spec_from_file_location(
    "disk_cache",
    os.path.join(os.path.dirname(__file__), "../../../keras_dl/data/tables/disk_cache.py"),
)
disk_cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(disk_cache)

root, max_bytes, key, size, mode = sys.argv[1:]
size = int(size)
chunk = 64 << 10


def fill(path: str) -> int:
    with open(root + ".fills", "a") as log:
        log.write(f"{os.getpid()}\n")
    with open(path, "r+b") as f:
        while f.tell() < size:
            if mode == "hang" and f.tell() >= size // 2:
                f.flush()
                print("half", flush=True)
                time.sleep(600)
            f.write(key[0].encode() * min(chunk, size - f.tell()))
            if mode == "fill":
                time.sleep(0.05)
        return f.tell()


cache = disk_cache.DiskCache(root, None if max_bytes == "none" else int(max_bytes))
print(cache.get(key, "part.parquet", size, fill), flush=True)
if mode == "hold":
    sys.stdin.readline()
