"""Open the next epoch's reader while tf.data still holds this epoch's last batches."""

from __future__ import annotations

from collections.abc import Callable

from keras_dl.data.stream import shutdown


class ReadAhead:
    """``read(epoch, near_end)``, where the end of one epoch's read starts opening the next's.

    When ``ahead()`` says the next epoch will be streamed too, a thread opens its reader and
    pulls its first chunk as soon as this epoch's read calls ``near_end()`` (the reader has
    handed out all but the row groups its workers are still decoding), or at the latest when
    it is exhausted. So the reader's start-up and its first row group overlap the end of this
    epoch instead of stalling the pipeline between epochs (measured on the wide table: 43 ms a
    100,000-row epoch, 16 % of it, when the next reader opened only at the end). The reads are
    the same, in the same order.
    """

    def __init__(self, read: Callable, ahead: Callable[[], bool]):
        import threading

        self.read = read
        self.ahead = ahead
        self.lock = threading.Lock()
        self.pending = None  # (epoch, thread, result dict)
        self.current = None  # the epoch being read by __call__

    def __call__(self, epoch: int):
        with self.lock:
            pending, self.pending = self.pending, None
            self.current = epoch
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
            it = self.read(epoch, self._near_end(epoch))
        yield from it
        self._near_end(epoch)()  # at the latest: this epoch's reader is exhausted

    def _near_end(self, epoch: int) -> Callable[[], None]:
        """What epoch ``epoch``'s read calls near its end: open epoch ``epoch + 1`` once, and
        only while ``epoch`` is the one being read (not while it is itself read ahead)."""

        def near_end() -> None:
            with self.lock:
                if self.current != epoch or (self.pending and self.pending[0] == epoch + 1):
                    return
            if self.ahead():
                self._open(epoch + 1)

        return near_end

    def _open(self, epoch: int) -> None:
        import threading

        box: dict = {}

        def start():
            box["it"] = it = self.read(epoch, self._near_end(epoch))
            try:
                box["first"] = next(it)
            except StopIteration:
                pass
            except BaseException as exc:  # re-raised by the read that takes it
                box["error"] = exc

        start = shutdown.run_tracked(start)  # lifecycle: the exit hook waits for it
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
