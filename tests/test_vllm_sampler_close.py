"""VLLMSampler.close without vLLM (an engine stand-in): the engine core is shut down once, the
engine is dropped, and a sampler used after close raises one EngineError instead of reaching a
dead engine. The real engine's close runs in tests/test_vllm_recipe.py (each eval model's engine
is closed before the next starts)."""

import pytest

from temper.rollout.vllm_sampler import VLLMSampler
from temper.rollout.vllm_shared import EngineError


class Core:
    def __init__(self):
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1


class Engine:
    def __init__(self):
        self.engine_core = Core()


class LLM:
    def __init__(self):
        self.llm_engine = Engine()


def closed_sampler():
    sampler = VLLMSampler.__new__(VLLMSampler)  # what __init__ sets, with the stand-in engine
    sampler.llm, sampler.broken, sampler._broken_error = LLM(), None, EngineError
    return sampler


def test_close_shuts_the_engine_core_down_once_and_refuses_later_calls():
    sampler = closed_sampler()
    core = sampler.llm.llm_engine.engine_core
    sampler.close()
    sampler.close()
    assert core.shutdowns == 1 and not hasattr(sampler, "llm")
    with pytest.raises(EngineError, match="closed"):
        sampler.sample([[1, 2]], 1, max_new_tokens=2)
    with pytest.raises(EngineError, match="closed"):
        sampler.sync(None)


def test_closing_a_broken_engine_keeps_the_reason_it_broke():
    sampler = closed_sampler()
    sampler.broken = "a sync failed: boom"
    sampler.close()
    with pytest.raises(EngineError, match="boom"):
        sampler.sample([[1, 2]], 1, max_new_tokens=2)
