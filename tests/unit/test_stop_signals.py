"""stop_on_signals: a signal stops the command whatever the main thread is doing when it
lands (about to block in a wait, or holding the stop event's lock: the handler takes none),
every wait wakes at once, "stop requested" is logged once, and a second signal gets the
default behaviour. Each case runs in a subprocess with a deadline, so a hang fails the test
instead of hanging pytest."""

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:  # run() has killed it
        raise AssertionError(f"no exit within {timeout} s (deadlocked, or never woken)") from None


def test_a_signal_landing_while_the_main_thread_holds_the_events_lock_still_stops() -> None:
    # Event.wait holds its condition's lock on its way into and out of the wait: the signal's
    # Python handler runs on the main thread at the next bytecode, still holding it.
    done = _python("""
import os, signal
from core.commands import stop_on_signals
with stop_on_signals() as stop:
    with stop._cond:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # bytecodes at which the handler runs
            pass
    print("stopped" if stop.wait(10) else "not stopped", flush=True)
""", timeout=10)

    assert done.returncode == 0, done.stderr
    assert done.stdout == "stopped\n"
    assert done.stderr.count("stop requested") == 1, done.stderr


def test_a_signal_the_main_thread_misses_while_blocked_in_a_wait_still_stops() -> None:
    # The handler runs only when the main thread next executes a bytecode: a signal landing
    # just before it blocks in a wait's lock (or, here, delivered to another thread) leaves it
    # asleep for the whole timeout unless something else wakes the wait.
    done = _python("""
import os, signal, threading, time
from core.commands import stop_on_signals
with stop_on_signals() as stop:
    helper = threading.Thread(target=lambda: stop.wait(30))
    helper.start()
    started = time.monotonic()
    signal.pthread_kill(helper.ident, signal.SIGTERM)
    woke = stop.wait(30)
    print(woke, round(time.monotonic() - started), flush=True)
    helper.join(30)
""", timeout=15)

    assert done.returncode == 0, done.stderr
    assert done.stdout == "True 0\n"


def test_sigterm_stops_a_main_thread_looping_on_short_waits_every_time() -> None:
    # Waits that return at once keep the main thread in and out of the event's lock (some 40%
    # of its bytecodes hold it): a handler that takes the lock deadlocks within a few rounds.
    rounds = 200
    child = subprocess.Popen([sys.executable, "-c", f"""
from core.commands import stop_on_signals
for n in range({rounds}):
    with stop_on_signals() as stop:
        print("ready", flush=True)
        while not stop.wait(0):
            pass
    print("stopped", flush=True)
"""], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in child.stdout or ():
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 20

    def next_line() -> str:
        try:
            return lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return "(nothing by the deadline)"

    stopped = 0
    try:
        for _ in range(rounds):
            assert next_line() == "ready\n", f"round {stopped + 1} of {rounds} did not start"
            child.send_signal(signal.SIGTERM)
            assert next_line() == "stopped\n", f"round {stopped + 1} of {rounds} did not stop"
            stopped += 1
        assert child.wait(timeout=max(0.1, deadline - time.monotonic())) == 0
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    assert stopped == rounds


def test_a_wait_on_the_stop_wakes_at_once_in_the_main_thread_and_in_a_helper() -> None:
    done = _python("""
import os, signal, threading, time
from core.commands import stop_on_signals
with stop_on_signals() as stop:
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(stop.wait(30)))
    waiter.start()
    started = time.monotonic()
    threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    woke.append(stop.wait(30))
    waiter.join(30)
    print(woke, time.monotonic() - started, flush=True)
""")

    assert done.returncode == 0, done.stderr
    woke, seconds = done.stdout.rsplit(" ", 1)
    assert woke == "[True, True]"
    # At once: far below the waits' 30 s, with room for a loaded runner (not a 50 ms race).
    assert float(seconds) < 5, done.stdout


def test_the_second_signal_gets_the_default_behaviour() -> None:
    done = _python("""
import os, signal
from core.commands import stop_on_signals
with stop_on_signals() as stop:
    os.kill(os.getpid(), signal.SIGTERM)
    stop.wait(10)
    print("stop set", stop.is_set(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    stop.wait(10)
print("survived", flush=True)
""")

    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "stop set True\n"
    assert done.stderr.count("stop requested") == 1, done.stderr


def test_the_block_restores_the_previous_handlers() -> None:
    done = _python("""
import signal
from core.commands import stop_on_signals
before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
wakeup = signal.set_wakeup_fd(-1)
with stop_on_signals():
    pass
print([signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == before,
      signal.set_wakeup_fd(-1) == wakeup, flush=True)
""")

    assert done.returncode == 0, done.stderr
    assert done.stdout == "True True\n"
