"""`run_tests`: the agent's own test run, the visible test file executed in its episode workspace.

This is the agent's tool, not the grade: it runs whatever the workspace holds (an edited test file
passes if the edit made it pass), so nothing here needs to resist the agent; the oracle is
grader.py. The output is one short line a tiny policy can read:

    PASS                              every assert held
    FAIL assert f(2, 5) == 11         the source line of the first failing assert
    ERROR NameError                   anything else raised (at import of sol.py, a syntax error...)
    ERROR timeout                     the run hit the wall clock
"""

from __future__ import annotations

from temper.envs.code_repair.generator import TESTS

MAX_OUTPUT_CHARS = 60

_DRIVER = f"""\
import os, sys, traceback
sys.path.insert(0, os.getcwd())
try:
    src = open({TESTS!r}).read()
    exec(compile(src, {TESTS!r}, "exec"), {{"__name__": "test_sol"}})
    print("PASS")
except AssertionError as e:
    frames = [fr for fr in traceback.extract_tb(e.__traceback__) if fr.filename == {TESTS!r}]
    print("FAIL " + (frames[-1].line if frames else ""))
except BaseException as e:
    print("ERROR " + type(e).__name__)
"""


def run_visible(sandbox) -> str:
    """Run the visible tests in `sandbox`'s workspace; the one-line result (module docstring)."""
    from temper.sandbox.sandbox import default_python

    result = sandbox.run_cmd([default_python(), "-I", "-S", "-B", "-c", _DRIVER])
    if result.timed_out:
        return "ERROR timeout"
    lines = result.stdout.strip().splitlines()
    text = lines[-1] if lines else "ERROR no output"
    return text[:MAX_OUTPUT_CHARS]
