"""The check conftest.py runs after each test module (tests/leaks.py): it names the threads and
child processes a module started and left running, and lets pass those that end within the grace."""

import subprocess
import sys
import threading

from leaks import descendants, left_running, live_threads


def test_a_thread_left_running_is_named_and_one_that_ends_is_not():
    threads, processes = live_threads(), set(descendants())
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(60,), name="left-behind")
    thread.start()
    try:
        [left] = left_running(threads, processes, grace=0.2)
        assert left.startswith("thread 'left-behind'")
        daemon = threading.Thread(target=stop.wait, args=(60,), name="abandoned", daemon=True)
        daemon.start()
        assert sorted(left_running(threads, processes, grace=0.2))[0].startswith("daemon thread 'abandoned'")
    finally:
        stop.set()
    assert left_running(threads, processes, grace=5.0) == []  # both end once told to, within the grace


def test_a_child_process_left_running_is_named_until_it_is_reaped():
    threads, processes = live_threads(), set(descendants())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        [left] = left_running(threads, processes, grace=0.2)
        assert left.startswith(f"process {child.pid} ")
        child.kill()
        [left] = left_running(threads, processes, grace=0.2)  # killed but not waited for: a zombie
        assert left.startswith(f"process {child.pid} ") and left.endswith("(Z)")
    finally:
        child.kill()
        child.wait()
    assert left_running(threads, processes, grace=0.2) == []


def test_grandchildren_count_too():
    processes = set(descendants())
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):  # until the grandchild is up
            found = set(descendants()) - processes
            if len(found) == 2:
                break
            threading.Event().wait(0.05)
        assert len(found) == 2 and child.pid in found
    finally:
        for pid in set(descendants()) - processes - {child.pid}:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        child.kill()
        child.wait()
