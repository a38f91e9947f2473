"""Open the next epoch's reader while tf.data still holds this epoch's last batches."""

from __future__ import annotations

from collections.abc import Callable

from keras_dl.data import reader_lifecycle


class ReadAhead:
    """``read(epoch)``, where the end of one epoch's read starts opening the next epoch's.

    When ``ahead()`` says the next epoch will be streamed too, a thread opens its reader and
    pulls its first chunk as soon as this epoch's reader is exhausted, so the reader's start-up
    overlaps the batches still in the pipeline. The reads are the same, in the same order.
    """

    def __init__(self, read: Callable, ahead: Callable[[], bool]):
        import threading

        self.read = read
        self.ahead = ahead
        self.lock = threading.Lock()
        self.pending = None  # (epoch, thread, result dict)

    def __call__(self, epoch: int):
        with self.lock:
            pending, self.pending = self.pending, None
        if pending is not None and pending[0] == epoch:
            _, thread, box = pending
            thread.join()
            if "error" in box:
                raise box["error"]
            it = box["it"]
            if "first" in box:
                yield box["first"]
        else:
            _close(pending)
            it = self.read(epoch)
        yield from it
        if self.ahead():
            self._open(epoch + 1)

    def _open(self, epoch: int) -> None:
        import threading

        box: dict = {}

        def start():
            box["it"] = it = self.read(epoch)
            try:
                box["first"] = next(it)
            except StopIteration:
                pass
            except BaseException as exc:  # re-raised by the read that takes it
                box["error"] = exc

        start = reader_lifecycle.run_tracked(start)  # lifecycle: the exit hook waits for it
        thread = threading.Thread(target=start, name=f"keras_dl-read-epoch-{epoch}", daemon=True)
        thread.start()
        with self.lock:
            old, self.pending = self.pending, (epoch, thread, box)
        _close(old)

    def close(self) -> None:
        """Stop a reader opened ahead and not taken (training stopped, or moved elsewhere)."""
        with self.lock:
            pending, self.pending = self.pending, None
        _close(pending)


def _close(pending) -> None:
    if pending is None:
        return
    _, thread, box = pending
    thread.join()
    it = box.get("it")
    if it is not None and hasattr(it, "close"):
        it.close()  # the reader's finally: stop and join its threads
