"""`temper.guard`: user code under a time limit in daemon threads, its failure one line.

Hung calls wait on an event the test sets when it ends (the `release` fixture), after which no
thread of user code may be left; no test depends on the machine's speed beyond a limit of
0.2 s that a call returning at once never reaches."""

from __future__ import annotations

import builtins
import pickle
import threading
import time

import pytest

from temper import guard
from temper.guard import Done, UserCodeError, UserCodeFailure


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()
    for t in guard.user_threads():
        t.join(10)
    assert guard.user_threads() == []


def test_run_all_gives_each_calls_value_error_or_timeout_in_order(release):
    boom = KeyError("k")

    def raises():
        raise boom

    def exits():
        raise SystemExit(3)  # user code never ends the process this way

    done = guard.run_all([lambda: 1, raises, release.wait, exits, lambda: "x"], timeout=0.2, workers=2)
    assert [d.value for d in done] == [1, None, None, None, "x"]
    assert done[1].error is boom and isinstance(done[3].error, SystemExit)
    assert [d.timed_out for d in done] == [False, False, True, False, False]
    assert done[2].seconds == 0.2 and not done[2].ok and done[0].ok
    assert [t.name for t in guard.user_threads()] == ["temper-user-code"]  # the hung one, abandoned


def test_hung_calls_give_their_place_to_the_next_and_never_starve_them(release):
    """Two workers, both taken by hung calls: each gives its place back at its own limit, so the
    calls queued behind them still run (with their own full limit)."""
    ran = []
    calls = [release.wait, release.wait, lambda: ran.append(1) or 1, lambda: ran.append(2) or 2]
    done = guard.run_all(calls, timeout=0.2, workers=2)
    assert [d.timed_out for d in done] == [True, True, False, False]
    assert [d.value for d in done[2:]] == [1, 2] and sorted(ran) == [1, 2]


def test_at_most_workers_calls_run_at_once():
    running, most, lock = [0], [0], threading.Lock()

    def one():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1

    guard.run_all([one] * 12, timeout=10, workers=3)
    assert most[0] <= 3


def test_call_raises_a_failure_naming_what_and_on_what(release):
    def broken(x):
        raise ValueError(f"bad {x}")

    with pytest.raises(UserCodeFailure) as err:
        guard.call(broken, 3, what="reward function r.py:f", context="problem d:1")
    line = err.value.line
    assert line.startswith(
        "reward function r.py:f raised on problem d:1: ValueError: bad 3 (at test_guard.py:"
    )
    assert err.value.kind == "raised" and isinstance(err.value.error, ValueError) and str(err.value) == line
    with guard.time_limit(0.2), pytest.raises(UserCodeFailure) as err:
        guard.call(release.wait, what="env E.reset")
    assert (err.value.kind, err.value.line) == ("timeout", "env E.reset did not return within 0.2 s")
    assert guard.call(lambda a, b=0: a + b, 1, b=2, what="f") == 3


def test_time_limit_is_process_wide_and_restored():
    assert guard.timeout_s() == guard.DEFAULT_TIMEOUT_S == 60.0
    seen = []
    with guard.time_limit(2.5):
        t = threading.Thread(target=lambda: seen.append(guard.timeout_s()))
        t.start()
        t.join()
        with pytest.raises(RuntimeError), guard.time_limit(1.0):
            raise RuntimeError
        assert guard.timeout_s() == 2.5
    assert seen == [2.5] and guard.timeout_s() == 60.0
    with pytest.raises(ValueError, match="must be > 0"), guard.time_limit(0):
        pass


def test_last_line_is_the_class_by_its_name_and_the_message_on_one_line():
    class Mine(Exception):
        pass

    Mine.__module__ = "temper_rewards_0123abcd_rewards"  # as a user's file is loaded
    assert guard.last_line(Mine("two\nlines")) == "Mine: two lines"
    assert guard.last_line(KeyError("k")) == "KeyError: 'k'"
    assert guard.last_line(RuntimeError()) == "RuntimeError"
    assert guard.last_line(ValueError("x" * 1000)) == "ValueError: " + "x" * (guard.MAX_LINE - 15) + "..."
    group_of = getattr(builtins, "ExceptionGroup", None)  # Python 3.11 on (anyio's, the MCP SDK's)
    if group_of is not None:
        group = group_of(
            "unhandled errors in a TaskGroup", [OSError("exited"), OSError("exited"), KeyError("id")]
        )
        assert guard.last_line(group) == "OSError: exited; KeyError: 'id'"


def test_user_frame_is_the_innermost_frame_outside_temper_and_the_libraries(tmp_path):
    import json

    (tmp_path / "mine.py").write_text("import json\n\n\ndef f():\n    return json.loads('{')\n")
    namespace = {}
    exec(compile((tmp_path / "mine.py").read_text(), str(tmp_path / "mine.py"), "exec"), namespace)
    try:
        namespace["f"]()
    except json.JSONDecodeError as err:
        assert guard.user_frame(err) == "mine.py:5"  # not json/decoder.py, where it was raised
    try:
        guard.call(int, "x", what="int")  # the standard library's own code: no frame of the user's
    except UserCodeFailure as err:
        assert guard.user_frame(err.error) is None and "(at " not in err.line


def test_failures_survive_being_handed_between_processes():
    failure = pickle.loads(pickle.dumps(guard.timed_out("env E.step", 2.0, "problem p")))
    assert (type(failure), failure.kind, failure.line) == (UserCodeFailure, "timeout", "env E.step did not return within 2 s on problem p")  # fmt: skip
    stop = pickle.loads(pickle.dumps(UserCodeError("one line", "a hint")))
    assert (str(stop), stop.hint) == ("one line", "a hint")
    assert isinstance(failure, UserCodeError)  # the CLI prints either as one line


def test_raised_keeps_a_failure_already_described():
    first = guard.returned("env E.step", "dict, not a StepResult")
    assert guard.raised(first, "env wrapper.step") is first
    assert Done().ok and not Done(timed_out=True).ok
