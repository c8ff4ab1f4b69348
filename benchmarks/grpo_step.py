"""Seconds per GRPO step: temper's `train_rl` vs TRL's `GRPOTrainer`, side by side in one run.

Both train the same freshly initialized preset (or a saved model, see below; fp32, CPU) on the
same arithmetic prompts in the same order (rendered with the chat template), with the same shape
of step: P prompts x G samples x at most T new tokens, temperature 1, one optimizer update per
step over the whole batch, no KL (beta = 0, no reference model), clip 0.2, token-mean loss (TRL
loss_type="dapo" = temper aggregation="token"), group-std advantages, AdamW (betas 0.9/0.99, no
weight decay), constant lr, grad clip 1.0. The reward is the task's verifier (`task.score`) in both.

Seconds/step is the median over the steps after `--warmup` (timestamps taken at the end of every
step by a callback, so a step's interval includes its sampling, reward, update and logging);
temper and TRL runs alternate `--repeats` times and the best median of each is kept. Completions
stop at EOS in both (temper drops finished rows; `model.generate` in TRL keeps decoding the
batch until every row has stopped); a random-init model seldom emits EOS, so the mean completion
length is reported for both. `--fixed-length` makes neither stop early (temper: an EOS id the
model cannot produce; TRL: `min_new_tokens`).

`--presets` also takes saved model directories (e.g. an SFT checkpoint that has learned to stop), to
see the EOS saving that a random-init model cannot show; each run reloads the model afresh.

For context the run also times temper's sampler against `model.generate` on one step's batch
(P x G x T, fixed length, best of `--sampler-repeats`), as benchmarks/sampler_speed.py does.

`--staleness 1,2` adds temper runs with bounded-staleness rollouts (`async_rollouts.max_staleness`
k: a forked worker with one thread samples while the trainer trains), in the same alternation.

    PYTHONPATH=src:. python benchmarks/grpo_step.py [--presets tiny] [--steps 10] [--repeats 2]
        [--prompts 8] [--group 8] [--tokens 32] [--fixed-length] [--staleness 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from functools import partial
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames, once per TRL run

# E402: these imports must follow the offline switch above
import torch  # noqa: E402

from benchmarks.common import NoEos, best_time, median  # noqa: E402
from benchmarks.sampler_speed import hf_generate  # noqa: E402
from temper.catalog import make_task  # noqa: E402
from temper.data.chat import prompt_ids  # noqa: E402
from temper.models import PRESETS, build_preset, build_tokenizer, load_model, load_tokenizer  # noqa: E402
from temper.rollout import HFSampler  # noqa: E402
from temper.tasks.base import Problem  # noqa: E402
from temper.train.features.async_rollouts import AsyncRollouts  # noqa: E402
from temper.train.rl import RLConfig, problems_for_step, train_rl  # noqa: E402
from temper.train.user_code import UserCodeConfig  # noqa: E402

LR = 1e-5
SEED = 0


def load(name: str):
    """(model, tokenizer): a freshly initialized preset, or a saved model directory (fp32, CPU)."""
    if name in PRESETS:
        tokenizer = build_tokenizer()
        return build_preset(name, tokenizer, seed=SEED), tokenizer
    return load_model(name, device=torch.device("cpu"), dtype=torch.float32), load_tokenizer(name)


def step_problems(task, steps: int, prompts: int) -> list[list[Problem]]:
    """The problems of every step, exactly as `train_rl` draws them (a pure function of seed, step)."""
    return [[p for _, p in problems_for_step([task], prompts, SEED, step)] for step in range(steps)]


def per_step_seconds(stamps: list[float], warmup: int) -> list[float]:
    """Durations of steps warmup+1..N from end-of-step timestamps (stamps[i] ends step i+1)."""
    return [b - a for a, b in zip(stamps[warmup - 1 :], stamps[warmup:])]


def run_temper(preset: str, args, precision: str = "fp32", k: int = 0) -> dict[str, Any]:
    task = make_task("arithmetic")
    model, tokenizer = load(preset)
    sampler = None
    if args.fixed_length:
        model.generation_config.eos_token_id = None
        sampler = HFSampler(model, NoEos(tokenizer, never=model.config.vocab_size))
    config = RLConfig(
        steps=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_new_tokens=args.tokens,
        temperature=1.0,
        advantage="grpo",
        aggregation="token",
        epochs=1,
        minibatches=1,
        lr=LR,
        schedule="constant",
        grad_clip=1.0,
        clip_low=0.2,
        clip_high=0.2,
        kl_coef=0.0,
        seed=SEED,
        progress=False,
        precision=precision,
        async_rollouts=AsyncRollouts(max_staleness=k),
        # a random-init model's groups all score 0: train on them anyway, as TRL does (the
        # default stops a run after 5 such steps)
        user_code=UserCodeConfig(zero_variance_steps=0),
    )
    stamps: list[float] = []
    rows: list[dict[str, Any]] = []

    def on_step(step: int, row: dict[str, Any]) -> None:
        stamps.append(time.perf_counter())
        rows.append(row)

    with tempfile.TemporaryDirectory() as out:
        result = train_rl(model, tokenizer, [task], config, out, sampler=sampler, callbacks=[on_step])
    measured = rows[args.warmup :]
    return {
        "precision": result.precision.get("dtype", precision),
        "s_per_step": median(per_step_seconds(stamps, args.warmup)),
        "sample": median([r["time/sample"] for r in measured]),
        "prepare": median([r["time/prepare"] for r in measured]),
        "train": median([r["time/train"] for r in measured]),
        "mean_length": sum(r["response_length"] for r in measured) / len(measured),
    }


def run_trl(preset: str, args) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = make_task("arithmetic")
    model, tokenizer = load(preset)
    problems = [p for step in step_problems(task, args.steps, args.prompts) for p in step]
    dataset = Dataset.from_dict(
        {"prompt": [p.messages() for p in problems], "idx": list(range(len(problems)))}
    )

    def verifier(completions, idx, **kwargs) -> list[float]:
        return [task.score(problems[i], c[0]["content"]).reward for c, i in zip(completions, idx)]

    stamps: list[float] = []
    lengths: list[float] = []
    generate_s: list[float] = []
    generate = model.generate

    def timed_generate(*a, **kw):  # TRL calls the module's own generate (one process, no wrapper)
        start = time.perf_counter()
        out = generate(*a, **kw)
        generate_s.append(time.perf_counter() - start)
        return out

    model.generate = timed_generate

    class Stamp(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):
            stamps.append(time.perf_counter())

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.group,  # completions per optimizer step
            num_generations=args.group,
            generation_batch_size=args.prompts * args.group,  # one generation per step
            gradient_accumulation_steps=1,
            num_iterations=1,
            max_completion_length=args.tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            epsilon=0.2,
            loss_type="dapo",  # token mean over the batch = temper aggregation="token"
            scale_rewards="group",  # (r - mean) / std per group = temper advantage="grpo"
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.99,
            max_grad_norm=1.0,
            max_steps=args.steps,
            shuffle_dataset=False,  # the same prompts, in the same order, as temper
            generation_kwargs={"min_new_tokens": args.tokens} if args.fixed_length else None,
            use_vllm=False,
            use_cpu=True,
            bf16=False,
            fp16=False,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=SEED,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=verifier,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Stamp()],
        )
        trainer.remove_callback(PrinterCallback)  # its per-step log lines would flood the table
        trainer.train()
    if len(generate_s) != args.steps:
        raise RuntimeError(
            f"expected one generate call per step, timed {len(generate_s)} in {args.steps} steps"
        )
    measured = lengths[args.warmup :]
    return {
        "s_per_step": median(per_step_seconds(stamps, args.warmup)),
        "generate": median(generate_s[args.warmup :]),
        "mean_length": sum(measured) / len(measured),
    }


def sampler_vs_generate(preset: str, args) -> dict[str, float]:
    """New tokens/s of temper's sampler and `model.generate` on step 1's prompts, fixed length."""
    task = make_task("arithmetic")
    model, tokenizer = load(preset)
    model.eval()
    prompts = [prompt_ids(tokenizer, p.messages()) for p in step_problems(task, 1, args.prompts)[0]]
    model.generation_config.eos_token_id = None
    sampler = HFSampler(model, NoEos(tokenizer, never=model.config.vocab_size))
    tokens = args.prompts * args.group * args.tokens
    t_hf = best_time(
        partial(hf_generate, model, tokenizer, prompts, args.group, args.tokens), args.sampler_repeats
    )
    t_ours = best_time(
        partial(sampler.sample, prompts, args.group, max_new_tokens=args.tokens, temperature=1.0),
        args.sampler_repeats,
    )
    return {"sampler_tok_s": tokens / t_ours, "generate_tok_s": tokens / t_hf}


def check_prompts_match(preset: str, args) -> None:
    """TRL renders a conversational prompt with apply_chat_template(add_generation_prompt=True):
    make sure that gives the ids temper samples from."""
    task = make_task("arithmetic")
    _, tokenizer = load(preset)
    for p in step_problems(task, 1, args.prompts)[0]:
        trl_ids = tokenizer.apply_chat_template(
            conversation=[p.messages()], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"][0]
        assert list(trl_ids) == prompt_ids(tokenizer, p.messages()), (p, trl_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets",
        default="tiny",
        help="comma-separated model presets (freshly initialized) or saved model directories",
    )
    parser.add_argument("--steps", type=int, default=10, help="RL steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    parser.add_argument("--repeats", type=int, default=2, help="alternating temper/TRL runs per preset")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="max new tokens")
    parser.add_argument("--fixed-length", action="store_true", help="no early stop at EOS in either")
    parser.add_argument("--sampler-repeats", type=int, default=2, help="timed sampler runs (best counts)")
    parser.add_argument("--staleness", default="", help="comma-separated k > 0: also time temper async")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    ks = [int(k) for k in args.staleness.split(",") if k]
    if args.warmup < 1 or args.steps < args.warmup + 2:
        parser.error("need --warmup >= 1 and --steps >= --warmup + 2 (a median needs timed steps)")

    import transformers
    import trl

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
        f"{torch.get_num_threads()} threads; {args.prompts} prompts x {args.group} samples x "
        f"{args.tokens} tokens, {args.steps} steps ({args.warmup} warm-up), "
        f"{'fixed length' if args.fixed_length else 'stop at EOS'}\n"
    )
    results = []
    for preset in args.presets.split(","):
        check_prompts_match(preset, args)
        ours, theirs = [], []
        stale: dict[int, list[dict[str, Any]]] = {k: [] for k in ks}
        for i in range(args.repeats):  # alternate, so drift in machine load hits both
            ours.append(run_temper(preset, args))
            theirs.append(run_trl(preset, args))
            for k in ks:
                stale[k].append(run_temper(preset, args, k=k))
            print(
                f"{preset} repeat {i + 1}: temper {ours[-1]['s_per_step']:.3f} s/step, "
                f"TRL {theirs[-1]['s_per_step']:.3f} s/step"
                + "".join(f", temper k={k} {stale[k][-1]['s_per_step']:.3f} s/step" for k in ks),
                flush=True,
            )
        auto = run_temper(preset, args, "auto")  # what `precision: auto` picks on this machine
        best_ours = min(ours, key=lambda r: r["s_per_step"])
        best_theirs = min(theirs, key=lambda r: r["s_per_step"])
        params = sum(p.numel() for p in load(preset)[0].parameters())
        results.append(
            {
                "preset": preset,
                "params": params,
                "prompts": args.prompts,
                "group": args.group,
                "tokens": args.tokens,
                "fixed_length": args.fixed_length,
                "temper_s_per_step": best_ours["s_per_step"],
                "trl_s_per_step": best_theirs["s_per_step"],
                "async_s_per_step": {k: min(r["s_per_step"] for r in runs) for k, runs in stale.items()},
                "ratio": best_theirs["s_per_step"] / best_ours["s_per_step"],
                "temper_split": {k: best_ours[k] for k in ("sample", "prepare", "train")},
                "trl_generate": best_theirs["generate"],
                "temper_mean_length": best_ours["mean_length"],
                "trl_mean_length": best_theirs["mean_length"],
                "auto_s_per_step": auto["s_per_step"],
                "auto_precision": auto["precision"],
                "temper_runs": ours,
                "trl_runs": theirs,
                **sampler_vs_generate(preset, args),
            }
        )

    print(
        "\n| preset | params | prompts x group x tokens | temper s/step | TRL s/step | TRL/temper | "
        "temper sample / prepare / train (s) | TRL generate / rest (s) | mean completion length temper / TRL | "
        "temper precision auto (chose) s/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["temper_split"]
        print(
            f"| {r['preset']} | {r['params'] / 1e6:.2f}M | {r['prompts']} x {r['group']} x {r['tokens']} | "
            f"{r['temper_s_per_step']:.3f} | {r['trl_s_per_step']:.3f} | {r['ratio']:.2f}x | "
            f"{s['sample']:.3f} / {s['prepare']:.3f} / {s['train']:.3f} | "
            f"{r['trl_generate']:.3f} / {r['trl_s_per_step'] - r['trl_generate']:.3f} | "
            f"{r['temper_mean_length']:.1f} / {r['trl_mean_length']:.1f} | "
            f"{r['auto_s_per_step']:.3f} ({r['auto_precision']}) |"
        )
    print("\nSampler alone, one step's batch, fixed length (new tokens/s):\n")
    print("| preset | temper HFSampler | model.generate | ratio |")
    print("|---|---|---|---|")
    for r in results:
        print(
            f"| {r['preset']} | {r['sampler_tok_s']:,.0f} | {r['generate_tok_s']:,.0f} | "
            f"{r['sampler_tok_s'] / r['generate_tok_s']:.2f}x |"
        )
    if ks:
        print("\n| preset | temper k | temper s/step | TRL s/step | TRL/temper |")
        print("|---|---|---|---|---|")
        for r in results:
            for k, seconds in {0: r["temper_s_per_step"], **r["async_s_per_step"]}.items():
                print(
                    f"| {r['preset']} | {k} | {seconds:.3f} | {r['trl_s_per_step']:.3f} | "
                    f"{r['trl_s_per_step'] / seconds:.2f}x |"
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"args": vars(args), "threads": torch.get_num_threads(), "results": results}, f, indent=2
            )


if __name__ == "__main__":
    main()
