"""New tokens/s of `HFSampler` against `model.generate` and against its own generic path.

Three ways to sample the same batches, timed in one process in alternating rounds (best of
`--repeats` after a warm-up each), so machine load hits them alike:
- `model.generate` on the left-padded batch, every prompt repeated n times;
- `HFSampler(fast_decode=False)`: decode steps through the model's own forward (the sampler as it
  was before `LlamaDecodeStep`, and what every non-Llama-family model gets);
- `HFSampler()`: decode steps through `LlamaDecodeStep` with shared-prefix attention.
The model is a randomly initialized preset (speed does not depend on the weights). Fixed-length
rows decode every token (no eos); the "stop" row gives the random model a set of stop ids with
~2.7% probability per token, so rows stop at spread lengths (mean ~35, at most 128) as an SFT'd
model's answers do: `model.generate` decodes its batch until the last row stops, the sampler drops
finished rows. Tokens/s counts the tokens each method returns up to and including each row's stop.

"% bound" is 2 x matmul parameters x tokens/s over the machine's fp32 matmul peak
(benchmarks/common.py): the share of the linear layers' arithmetic the sampler keeps busy.

    OMP_NUM_THREADS=2 PYTHONPATH=src:. python benchmarks/sampler_speed.py [--preset tiny] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# E402: these imports must follow the offline switch above
import torch  # noqa: E402
from transformers import GenerationConfig  # noqa: E402

from benchmarks.common import NoEos, matmul_params, matmul_peak_gflops  # noqa: E402
from temper.catalog import make_task  # noqa: E402
from temper.data.chat import prompt_ids  # noqa: E402
from temper.models import build_preset, build_tokenizer  # noqa: E402
from temper.rollout import HFSampler  # noqa: E402

# (name, prompts, samples per prompt, new tokens, prompt kind, stop at eos)
CONFIGS = [
    ("64 x 4 x 32", 64, 4, 32, "random", False),
    ("256 x 1 x 32", 256, 1, 32, "random", False),
    ("8 x 8 x 32 (one GRPO step, arithmetic prompts)", 8, 8, 32, "arithmetic", False),
    ("16 x 8 x <=128, rows stop (mean ~35)", 16, 8, 128, "arithmetic", True),
]
STOP_IDS = list(range(100, 107))  # 7 of the 263 ids: ~2.7% per token for the random model


def hf_generate(
    model, tokenizer, prompts: list[list[int]], n: int, new: int, eos: list[int] | None = None
) -> int:
    """`model.generate` on a left-padded batch, every prompt repeated n times -> new tokens up to
    each row's first stop id. eos None: every row decodes `new` tokens (min_new_tokens)."""
    rows = [p for p in prompts for _ in range(n)]
    width = max(len(r) for r in rows)
    ids_B_P = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask_B_P = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=new,
        min_new_tokens=new if eos is None else 0,  # fixed length: the same work as the sampler
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id if eos is None else eos,
    )
    with torch.inference_mode():
        out = model.generate(input_ids=ids_B_P, attention_mask=mask_B_P, generation_config=config)
    if eos is None:
        assert out.shape[1] == width + new
        return len(rows) * new
    return sum(next((j + 1 for j, t in enumerate(r) if t in eos), len(r)) for r in out[:, width:].tolist())


def alternating_best(fns: dict[str, Callable[[], int]], repeats: int) -> dict[str, tuple[float, int]]:
    """name -> (fastest seconds, tokens it returned), one warm-up call each, then `repeats` rounds
    that call every function once in turn."""
    for fn in fns.values():
        fn()
    best: dict[str, tuple[float, int]] = {name: (float("inf"), 0) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            tokens = fn()
            seconds = time.perf_counter() - start
            if seconds < best[name][0]:
                best[name] = (seconds, tokens)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny", help="model preset (temper.models.PRESETS)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds; the best counts")
    args = parser.parse_args()

    tokenizer = build_tokenizer()
    model = build_preset(args.preset, tokenizer, seed=0).eval()
    peak = matmul_peak_gflops()
    params = matmul_params(model)
    bound = peak * 1e9 / (2 * params)  # tokens/s if the linear layers ran at the matmul peak
    task = make_task("arithmetic")
    gen = torch.Generator().manual_seed(0)
    print(
        f"preset {args.preset} ({params / 1e6:.2f}M matmul params), torch threads {torch.get_num_threads()}, "
        f"fp32 matmul peak {peak:,.0f} GFLOP/s -> compute bound {bound:,.0f} tok/s\n"
    )
    print(
        "| prompts x samples x new tokens | model.generate tok/s | HFSampler generic tok/s | "
        "HFSampler tok/s | vs generate | vs generic | % bound |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, n_prompts, n, new, kind, stops in CONFIGS:
        if kind == "random":
            lengths = torch.randint(16, 33, (n_prompts,), generator=gen).tolist()
            prompts = [torch.randint(0, 256, (k,), generator=gen).tolist() for k in lengths]
        else:
            prompts = [prompt_ids(tokenizer, p.messages()) for p in task.sample("train", n_prompts, seed=0)]
        eos = [tokenizer.eos_token_id, *STOP_IDS] if stops else None
        model.generation_config.eos_token_id = STOP_IDS if stops else None
        tok = tokenizer if stops else NoEos(tokenizer, never=model.config.vocab_size)
        samplers = {"generic": HFSampler(model, tok, fast_decode=False), "fast": HFSampler(model, tok)}

        def sampled(key: str, prompts=prompts, n=n, new=new, samplers=samplers) -> int:
            out = samplers[key].sample(prompts, n, max_new_tokens=new, temperature=1.0)
            return sum(len(s.token_ids) for r in out for s in r)

        best = alternating_best(
            {
                "generate": lambda prompts=prompts, n=n, new=new, eos=eos: hf_generate(
                    model, tokenizer, prompts, n, new, eos
                ),
                "generic": lambda: sampled("generic"),
                "fast": lambda: sampled("fast"),
            },
            args.repeats,
        )
        rate = {k: tokens / seconds for k, (seconds, tokens) in best.items()}
        print(
            f"| {name} | {rate['generate']:,.0f} | {rate['generic']:,.0f} | {rate['fast']:,.0f} | "
            f"{rate['fast'] / rate['generate']:.2f}x | {rate['fast'] / rate['generic']:.2f}x | "
            f"{100 * rate['fast'] / bound:.0f}% (generic {100 * rate['generic'] / bound:.0f}%) |"
        )


if __name__ == "__main__":
    main()
