"""The machine: what a benchmark ran on (printed with every benchmark result), and the
process-wide settings that tune it (malloc's treatment of freed memory, torch's threads)."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine_info() -> dict[str, str | int | bool]:
    """CPU model, core count, AES instructions and library versions, as a flat dict."""
    import cryptography
    import numpy
    from cryptography.hazmat.backends.openssl.backend import backend

    flags = _cpu_flags()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "aes_ni": "aes" in flags,
        "vaes": "vaes" in flags,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "cryptography": cryptography.__version__,
        "openssl": backend.openssl_version_text(),
    }


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(threshold_bytes: int = 256 << 20) -> bool:
    """Ask glibc's malloc to serve blocks below ``threshold_bytes`` from the heap and to keep
    freed memory instead of returning it to the OS.

    Buffers of a few MB are allocated and freed for every vector a process sends or
    receives; by default glibc maps each one fresh (``mmap``) and unmaps it on free, so
    every use pays one page fault per 4 KiB page. Keeping the memory makes reuse free.
    Returns False (and changes nothing) where the C library is not glibc.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(name)
    ok = libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, 2 * threshold_bytes) == 1


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with ``count`` torch intra-op threads, then restore the previous setting
    (also when the block raises). ``None`` leaves the setting alone."""
    if count is None:
        yield
        return
    import torch  # only callers that use torch pay for importing it

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def sigterm_interrupts() -> None:
    """Make SIGTERM raise ``KeyboardInterrupt`` in the main thread, like SIGINT (``simulate``
    and ``launch`` stop the same way on both; here, not in the gRPC code, so that
    ``simulate`` runs with the ``[sim]`` extra alone)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


class StopRequest:
    """Whether a stop was asked while :func:`stop_at_a_safe_point` held the signals."""

    def __init__(self) -> None:
        self.asked = False


@contextlib.contextmanager
def stop_at_a_safe_point(on_ask: Callable[[], None] | None = None) -> Iterator[StopRequest]:
    """Within the block, the first SIGINT or SIGTERM only sets the yielded request's
    ``asked`` (and calls ``on_ask``): the block checks it where its state is whole (a
    simulation after a round: it checkpoints, then raises ``KeyboardInterrupt``). A second
    signal raises ``KeyboardInterrupt`` at once. The previous handlers come back after the
    block. Outside the main thread (where handlers cannot be set) nothing changes.

    ``on_ask`` runs once, the moment the first signal arrives: from a helper thread woken
    by the C-level handler (:func:`signal.set_wakeup_fd`), so a main thread inside a long
    torch call, or blocked while another thread took the signal, still says at once that
    the stop was heard. Python runs ``signal`` handlers only when the main thread next
    executes bytecode; the handler calls ``on_ask`` itself where no wakeup fd could be
    set (another one is in use)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    announce = _Once(on_ask)

    def ask(signum: int, frame: Any) -> None:
        if request.asked:
            raise KeyboardInterrupt
        request.asked = True
        announce()

    previous = {s: signal.signal(s, ask) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _on_signal_arrival(announce, (signal.SIGINT, signal.SIGTERM)):
            yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class _Once:
    """``callback()`` on the first call from any thread, nothing on later calls."""

    def __init__(self, callback: Callable[[], None] | None) -> None:
        self._callback = callback
        self._lock = threading.Lock()
        self._called = False

    def __call__(self) -> None:
        with self._lock:
            if self._called:
                return
            self._called = True
        if self._callback is not None:
            self._callback()


@contextlib.contextmanager
def _on_signal_arrival(
    callback: Callable[[], None], signals: tuple[signal.Signals, ...]
) -> Iterator[None]:
    """Within the block, a thread calls ``callback()`` as soon as one of ``signals`` (each
    with a Python handler) arrives: the C-level handler writes the signal's number to a
    pipe (:func:`signal.set_wakeup_fd`) that the thread reads. Nothing is set up when
    another wakeup fd is in use (an event loop's): that one is left as it is."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        earlier = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        earlier = None
    if earlier is None or earlier != -1:
        if earlier is not None:
            signal.set_wakeup_fd(earlier)
        os.close(read_end)
        os.close(write_end)
        yield
        return
    numbers = {int(s) for s in signals}

    def watch() -> None:
        while data := os.read(read_end, 64):  # b"" once the write end is closed
            if numbers.intersection(data):
                callback()

    watcher = threading.Thread(target=watch, name="sharefl-signal-echo", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
        os.close(write_end)
        watcher.join()
        os.close(read_end)


def forget_caught_interrupt() -> None:
    """Let a ``KeyboardInterrupt`` that was caught be forgotten by the interpreter's exit.

    CPython remembers an interrupt that escaped code run by ``exec`` of a *string*
    (``dataclasses`` and ``namedtuple`` build their methods that way, so any import can be
    inside one when SIGINT or SIGTERM lands) and, when the process ends, kills it with
    SIGINT (exit status -2) whatever status the program chose. Each ``exec`` of a string
    clears that memory before it runs, so one empty ``exec`` makes the chosen status the
    one the process exits with. Call it after handling the interrupt, just before exiting.
    """
    exec("")  # a constant string: clears the flag before running nothing
