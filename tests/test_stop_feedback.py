"""The first Ctrl-C says at once that the run stops after this round, even while the main
thread cannot run Python (inside a long torch call, or blocked while another thread took
the signal): Python runs a ``signal`` handler only when the main thread next executes
bytecode, so the line comes from a thread woken by the C-level handler.

The child below blocks SIGINT in its main thread (so the signal is taken by another thread
and the Python handler waits) and waits for the announcement with a C-level wait. The
check is the order of two lines, not a time: "asked" before "main thread back". Without
the early announcement the main thread waits out its (very generous) bound first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from sharefl.machine import StopRequest, stop_at_a_safe_point

CHILD = textwrap.dedent(
    """
    import signal, sys, threading
    from sharefl.machine import stop_at_a_safe_point

    heard = threading.Event()

    def on_ask():
        print("asked", flush=True)
        heard.set()

    with stop_at_a_safe_point(on_ask) as stop:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        print("ready", flush=True)
        heard.wait(600)  # only a bound against a hang: the order below is the check
        print("main thread back", flush=True)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # the handler runs
        print(f"stop asked: {stop.asked}", flush=True)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signal masks")
def test_the_first_signal_is_announced_before_the_main_thread_returns_to_python():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGINT)
    lines = child.stdout.read().splitlines()
    assert child.wait() == 0
    assert lines == ["asked", "main thread back", "stop asked: True"]


def test_on_ask_runs_once_for_two_signals_and_the_second_stops():
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt), stop_at_a_safe_point(lambda: calls.append("x")) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        _run_python_until(stop)
        os.kill(os.getpid(), signal.SIGINT)
        _run_python_until(StopRequest())  # the handler raises on the way
    assert calls == ["x"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.set_wakeup_fd(-1) == -1  # the block gave the wakeup fd back


def test_an_event_loops_wakeup_fd_is_left_alone():
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        signal.set_wakeup_fd(write_end)
        calls: list[str] = []
        with stop_at_a_safe_point(lambda: calls.append("x")) as stop:
            assert signal.set_wakeup_fd(write_end) == write_end  # still the loop's
            os.kill(os.getpid(), signal.SIGINT)
            _run_python_until(stop)
        assert calls == ["x"]  # announced by the handler instead
        assert signal.set_wakeup_fd(-1) == write_end
    finally:
        os.close(read_end)
        os.close(write_end)


def _run_python_until(stop: StopRequest) -> None:
    """Execute bytecode (so that a pending handler runs) until ``stop.asked``; a handler
    that raises ends it. Bounded by work: a signal sent to this process by ``os.kill`` is
    handled before ``os.kill`` returns to the next bytecode."""
    for _ in range(1000):
        if stop.asked:
            return
