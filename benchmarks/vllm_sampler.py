"""New tokens/s of vLLM (CPU build: an in-process engine, and an OpenAI-compatible server) against
`HFSampler`, side by side in one process, plus each engine's start-up, the time of a weight sync
(full weights, and a LoRA model's merged ones), and a request's fixed cost. Run in the vLLM venv:

    make test-vllm   # builds .venv-vllm once
    PYTHONPATH=src:. .venv-vllm/bin/python benchmarks/vllm_sampler.py [--presets tiny,small] [--repeats 3]
        [--no-server]

The model is a randomly initialized preset saved to a temporary folder (speed does not depend on
the weights), fp32 in both. Shapes: 64 prompts x 4 samples x 32 new tokens of random prompts, and
one GRPO step's batch (8 arithmetic prompts x 8 samples x 32). Both samplers stop at the
tokenizer's eos (rare for a random model); tokens/s counts the tokens each returned, best of
`--repeats` after a warm-up call, the two samplers alternating so machine load hits them alike.
Start-up is the construction of `VLLMSampler` (engine, KV cache, warm-up); sync is
`VLLMSampler.sync` of the trainer's weights after an update (`reload_weights` + prefix-cache
reset; the server's: the weights written to a folder + its /collective_rpc reload), the median of
`--repeats`, with the post-sync check off and on; a LoRA sync is the same after merging the adapter
(r 8 on q/k/v/o: what `VLLMSampler.sync` does with a PEFT model; vLLM's own LoRA path is not used).
A request's fixed cost is the median time of one prompt x 1 sample x 1 new token.
The server runs the whole time the in-process engine is timed (idle: it costs memory, not CPU).
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


def sync_seconds(engine, model, repeats: int, check: float | None) -> float:
    """Median seconds of `engine.sync(model)` after a small update of `model`'s trainable weights."""
    engine.check_sync = check
    times = []
    for _ in range(repeats):
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 1e-4)  # an update
        t0 = time.perf_counter()
        engine.sync(model)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def request_seconds(sampler, prompt, repeats: int) -> float:
    """Median seconds of a one-token request: the fixed cost of a call."""
    times = []
    for r in range(max(5, repeats)):
        t0 = time.perf_counter()
        sampler.sample([prompt], 1, max_new_tokens=1, temperature=1.0, seed=r)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def with_lora(model):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return get_peft_model(model, config)


def main() -> None:
    from temper.rollout.vllm_sampler import VLLMSampler
    from temper.rollout.vllm_server import VLLMServerSampler

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-server", action="store_true", help="time the in-process engine only")
    args = parser.parse_args()
    print(machine_line())
    tokenizer = build_tokenizer()
    rows, costs = [], []
    for preset in args.presets.split(","):
        model = build_preset(preset, tokenizer, seed=0).eval()
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            stop = [tokenizer.eos_token_id]
            engines = {}
            t0 = time.perf_counter()
            engines["vLLM in-process"] = VLLMSampler(folder, stop_token_ids=stop, max_model_len=256)
            start = {"vLLM in-process": time.perf_counter() - t0}
            if not args.no_server:
                t0 = time.perf_counter()
                engines["vLLM server"] = VLLMServerSampler(folder, stop_token_ids=stop, max_model_len=256)
                start["vLLM server"] = time.perf_counter() - t0
            hf = HFSampler(model, tokenizer)
            for name, prompts, n, new in shapes(tokenizer):
                speeds = {"HFSampler": tokens_per_s(hf, prompts, n, new, args.repeats)}
                for kind, engine in engines.items():
                    speeds[kind] = tokens_per_s(engine, prompts, n, new, args.repeats)
                rows.append((preset, name, speeds))
            prompt = shapes(tokenizer)[1][1][0]
            for kind, engine in {"HFSampler": hf, **engines}.items():
                line = {"request": request_seconds(engine, prompt, args.repeats), "start": start.get(kind)}
                if kind != "HFSampler":
                    line["sync"] = sync_seconds(engine, model, args.repeats, None)
                    line["sync checked"] = sync_seconds(engine, model, args.repeats, 1e-3)
                costs.append((preset, kind, line))
            lora = with_lora(model)
            for kind, engine in engines.items():
                costs.append(
                    (preset, f"{kind}, LoRA merged", {"sync": sync_seconds(engine, lora, args.repeats, None)})
                )
            for engine in engines.values():
                engine.close()
    kinds = list(rows[0][2])
    print(
        "| preset | shape | "
        + " | ".join(f"{k} tokens/s" for k in kinds)
        + " | "
        + " | ".join(f"{k} / HF" for k in kinds[1:])
        + " |"
    )
    print("|---|---|" + "---|" * (2 * len(kinds) - 1))
    for preset, name, speeds in rows:
        base = speeds["HFSampler"]
        cells = [f"{speeds[k]:.0f}" for k in kinds] + [f"{speeds[k] / base:.2f}x" for k in kinds[1:]]
        print(f"| {preset} | {name} | " + " | ".join(cells) + " |")
    print()
    print("| preset | sampler | start-up s | one-token request ms | sync s | sync with check s |")
    print("|---|---|---|---|---|---|")

    def cell(value, scale=1.0, fmt="{:.3f}"):
        return "" if value is None else fmt.format(value * scale)

    for preset, kind, line in costs:
        print(
            f"| {preset} | {kind} | {cell(line.get('start'), fmt='{:.1f}')} | "
            f"{cell(line.get('request'), 1e3, '{:.1f}')} | {cell(line.get('sync'))} | {cell(line.get('sync checked'))} |"
        )


if __name__ == "__main__":
    main()
