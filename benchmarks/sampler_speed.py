"""New tokens/s of `HFSampler` against `model.generate` on the same model.

Both decode a fixed number of tokens (no eos, no stop string), so this measures decoding speed
alone; in RL the sampler also saves the work after each sample's stop, which this leaves out.
The model is a randomly initialized preset (speed does not depend on the weights).

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/sampler_speed.py [--preset tiny] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
from functools import partial

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# E402: these imports must follow the offline switch above
import torch  # noqa: E402
from transformers import GenerationConfig  # noqa: E402

from benchmarks.common import NoEos, best_time  # noqa: E402
from temper.models import build_preset, build_tokenizer  # noqa: E402
from temper.rollout import HFSampler  # noqa: E402

# (prompts, samples per prompt, new tokens)
CONFIGS = [(64, 4, 32), (256, 1, 32)]


def hf_generate(model, tokenizer, prompts: list[list[int]], n: int, new: int) -> None:
    """`model.generate` on a left-padded batch, every prompt repeated n times."""
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
        min_new_tokens=new,  # no early stop: the same work as the sampler
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.inference_mode():
        out = model.generate(input_ids=ids_B_P, attention_mask=mask_B_P, generation_config=config)
    assert out.shape[1] == ids_B_P.shape[1] + new


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny", help="model preset (temper.models.PRESETS)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement; the best counts")
    args = parser.parse_args()

    tokenizer = build_tokenizer()
    model = build_preset(args.preset, tokenizer, seed=0).eval()
    model.generation_config.eos_token_id = None
    sampler = HFSampler(model, NoEos(tokenizer, never=model.config.vocab_size))
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(0)
    print(f"preset {args.preset} ({params / 1e6:.2f}M params), torch threads {torch.get_num_threads()}\n")
    print("| prompts x samples x new tokens | model.generate tok/s | HFSampler tok/s | ratio |")
    print("|---|---|---|---|")
    for n_prompts, n, new in CONFIGS:
        lengths = torch.randint(16, 33, (n_prompts,), generator=gen).tolist()
        prompts = [torch.randint(0, 256, (k,), generator=gen).tolist() for k in lengths]
        tokens = n_prompts * n * new
        t_hf = best_time(partial(hf_generate, model, tokenizer, prompts, n, new), args.repeats)
        t_ours = best_time(
            partial(sampler.sample, prompts, n, max_new_tokens=new, temperature=1.0), args.repeats
        )
        print(
            f"| {n_prompts} x {n} x {new} | {tokens / t_hf:,.0f} | {tokens / t_ours:,.0f} | {t_hf / t_ours:.2f}x |"
        )


if __name__ == "__main__":
    main()
