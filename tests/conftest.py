import os

# Nothing in the suite may touch the network: hub lookups fail fast instead of retrying.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from leaks import descendants, left_running, live_threads  # noqa: E402
from temper.models import build_preset, build_tokenizer  # noqa: E402


def pytest_sessionstart(session):
    """Empty every functools cache in temper, so that a session started inside a process that
    already ran tests (mutmut forks each mutant's run from the process of the clean run) computes
    its results anew: a cached solver answer would hide a mutant of the solver (TESTING.md)."""
    import sys

    for name, module in list(sys.modules.items()):
        if name == "temper" or name.startswith("temper."):
            for obj in list(vars(module).values()):
                if callable(getattr(obj, "cache_clear", None)) and hasattr(obj, "cache_info"):
                    obj.cache_clear()


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def nano(tokenizer):
    return build_preset("nano", tokenizer, seed=0)


@pytest.fixture(scope="module", autouse=True)
def nothing_left_running():
    """Fails a module that leaves a thread or a child process running after its last test
    (TESTING.md): a leak slows every later test and the suite's exit, and hides in them."""
    threads, processes = live_threads(), set(descendants())
    yield
    left = left_running(threads, processes)
    if left:
        pytest.fail("left running after the module's tests: " + "; ".join(left), pytrace=False)
