"""New tokens/s of vLLM (CPU build, in-process engine) against `HFSampler`, side by side in one
process, plus the engine's start-up and the time of a weight sync. Run in the vLLM venv:

    make test-vllm   # builds .venv-vllm once
    PYTHONPATH=src:. .venv-vllm/bin/python benchmarks/vllm_sampler.py [--presets tiny,small] [--repeats 3]

The model is a randomly initialized preset saved to a temporary folder (speed does not depend on
the weights), fp32 in both. Shapes: 64 prompts x 4 samples x 32 new tokens of random prompts, and
one GRPO step's batch (8 arithmetic prompts x 8 samples x 32). Both samplers stop at the
tokenizer's eos (rare for a random model); tokens/s counts the tokens each returned, best of
`--repeats` after a warm-up call, the two samplers alternating so machine load hits them alike.
Start-up is the construction of `VLLMSampler` (engine, KV cache, warm-up); sync is
`VLLMSampler.sync` of the trainer's weights after an update (`reload_weights` + prefix-cache
reset), the median of `--repeats`, with the post-sync check off and on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

import torch  # noqa: E402

from benchmarks.common import machine_line  # noqa: E402
from temper.catalog import make_task  # noqa: E402
from temper.data.chat import prompt_ids  # noqa: E402
from temper.models import build_preset, build_tokenizer  # noqa: E402
from temper.rollout import HFSampler  # noqa: E402


def shapes(tokenizer):
    g = torch.Generator().manual_seed(0)
    random_prompts = [torch.randint(3, 250, (24,), generator=g).tolist() for _ in range(64)]
    task = make_task("arithmetic")
    step = [prompt_ids(tokenizer, p.messages()) for p in task.sample("train", 8, seed=0)]
    return [
        ("64 x 4 x 32, random prompts", random_prompts, 4, 32),
        ("8 x 8 x 32, one GRPO step", step, 8, 32),
    ]


def tokens_per_s(sampler, prompts, n, new, repeats) -> float:
    best = 0.0
    sampler.sample(prompts[:2], 1, max_new_tokens=4, temperature=1.0, seed=0)  # warm-up
    for r in range(repeats):
        t0 = time.perf_counter()
        out = sampler.sample(prompts, n, max_new_tokens=new, temperature=1.0, seed=r)
        seconds = time.perf_counter() - t0
        best = max(best, sum(len(s.token_ids) for row in out for s in row) / seconds)
    return best


def main() -> None:
    from temper.rollout.vllm_sampler import VLLMSampler

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(machine_line())
    tokenizer = build_tokenizer()
    rows = []
    for preset in args.presets.split(","):
        model = build_preset(preset, tokenizer, seed=0).eval()
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            t0 = time.perf_counter()
            engine = VLLMSampler(folder, stop_token_ids=[tokenizer.eos_token_id], max_model_len=256)
            start_up = time.perf_counter() - t0
            hf = HFSampler(model, tokenizer)
            for name, prompts, n, new in shapes(tokenizer):
                a = tokens_per_s(hf, prompts, n, new, args.repeats)
                b = tokens_per_s(engine, prompts, n, new, args.repeats)
                rows.append((preset, name, a, b))
            syncs = {}
            for check in (None, 1e-3):
                engine.check_sync = check
                times = []
                for _ in range(args.repeats):
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 1e-4)  # an update
                    t0 = time.perf_counter()
                    engine.sync(model)
                    times.append(time.perf_counter() - t0)
                syncs[check] = statistics.median(times)
            print(
                f"{preset}: start-up {start_up:.1f} s; sync {syncs[None]:.3f} s "
                f"({syncs[1e-3]:.3f} s with the post-sync check)"
            )
            del engine
    print("| preset | shape | HFSampler tokens/s | vLLM tokens/s | vLLM / HF |")
    print("|---|---|---|---|---|")
    for preset, name, a, b in rows:
        print(f"| {preset} | {name} | {a:.0f} | {b:.0f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
