"""GRPO in one file, top to bottom: the page to read before `temper.train.rl`.

    python examples/minimal_grpo.py                     # arithmetic, the repository's tiny model, CPU
    python examples/minimal_grpo.py --model PATH --steps 50

One step: draw prompts -> sample a group of completions per prompt -> grade them -> group-normalised
advantages -> clipped policy loss -> optimizer step -> sampler weight sync. Plain PyTorch around
temper's sampler (`HFSampler`), a task (`Arithmetic`) and pure functions (`grpo`, `policy_loss`,
`masked_mean`, `lr_at`): no Accelerate, no features, no checkpoints.

`temper.train.rl.train_rl` is this loop with what real runs need: multi-turn environments, data
parallelism, PPO's value head, a KL term, several epochs and minibatches, dynamic sampling and
the other features, logging and resume. Each phase below names where train_rl does it.
tests/test_minimal_grpo.py checks that on a fixed seed the first steps here give train_rl's
rewards, losses, gradient norms and weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from temper.algorithms.advantages import grpo
from temper.algorithms.policy import masked_mean, policy_loss
from temper.data.chat import prompt_ids
from temper.models import load_model, load_tokenizer
from temper.rollout import HFSampler
from temper.rollout.sampler import derive_seed
from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.tasks.base import grade
from temper.train.schedule import lr_at

TINY_MODEL = Path(__file__).resolve().parents[1] / "tests" / "pinned" / "start"
"""The shipped tiny base after a short SFT on arithmetic (tests/pinned/start.yaml): it answers in
the task's format and stops at its end of turn, so its groups have rewards that vary."""


def completion_logprobs(model, prompts, completions, temperature):
    """log pi(token | everything before it) at every completion token, teacher-forced -> (R, T),
    0 past a row's end. train_rl packs the rows without padding instead (`rollouts.pack`) and
    projects onto the vocabulary only at completion positions (`rl_update.PolicyWithValue`)."""
    seqs = [p + c for p, c in zip(prompts, completions)]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], attention[i, : len(s)] = torch.tensor(s), 1
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
    # the sampler's temperature, or the ratio is not 1 on fresh samples; in fp32 at least (bf16
    # loses the small differences the ratio needs), fp64 for a fp64 model (the test's)
    logits = logits / temperature
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    out = logp_all.new_zeros(len(seqs), max(map(len, completions)))
    for i, (p, c) in enumerate(zip(prompts, completions)):
        at = logp_all[i, len(p) - 1 : len(p) - 1 + len(c)]  # position t predicts token t + 1
        out[i, : len(c)] = at.gather(-1, torch.tensor(c, device=device)[:, None]).squeeze(-1)
    return out


def minimal_grpo(
    model, tokenizer, task, *, steps=20, prompts_per_step=8, group_size=8, max_new_tokens=24,
    temperature=1.0, lr=1e-4, warmup_steps=0, schedule="constant", clip_low=0.2, clip_high=0.28,
    dual_clip=3.0, aggregation="token", grpo_eps=1e-6, grad_clip=1.0, seed=0, log=print,
):  # fmt: skip
    """Train `model` in place with GRPO on `task`; -> one metrics row per step. The defaults are
    RLConfig's but clip_high (DAPO's clip-higher, as the recipes use) and a smaller batch."""
    sampler = HFSampler(model, tokenizer)  # reads `model` itself, no copy of the weights
    # train_rl's optimizer: AdamW, betas 0.9/0.99, RLConfig's weight_decay 0 (torch's default is 0.01)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    model.eval()  # dropout off in sampling and in the update: the first update is exactly on-policy
    device, history = next(model.parameters()).device, []
    for step in range(steps):
        # 1. draw problems: a pure function of (seed, step), so a resumed run redraws the same
        # ones (train_rl: collect.problems_for_step; with several tasks, index i is the task's)
        problems = task.sample("train", prompts_per_step, seed=derive_seed(seed, step, 0, 0))
        prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]  # chat template + header

        # 2. sample a group per prompt: one call, n = group_size, a seed per prompt (prompt i's
        # samples depend on nothing else). train_rl plays each problem as a one-step environment
        # (envs.base.TaskEnv, rollout.loop.run_episodes), which makes this same call
        seeds = [derive_seed(seed, step, 0, i) for i in range(len(prompts))]
        groups = sampler.sample(
            prompts, group_size, max_new_tokens=max_new_tokens, temperature=temperature, seed=seeds
        )

        # 3. grade: the task's verifier on each completion's text (train_rl: rollouts.grade_episodes,
        # the weighted reward components of `config.rewards`; here the outcome alone)
        scores = [[grade(task, p, s.text) for s in g] for p, g in zip(problems, groups)]
        rewards_G_N = torch.tensor([[s.reward for s in g] for g in scores])

        # 4. advantages: A = (r - group mean) / (group std + eps), one per sample, exactly 0 in a
        # group whose rewards are all equal (train_rl: the `advantage` estimator, estimators.py)
        advantages_R = grpo(rewards_G_N, eps=grpo_eps).reshape(-1)

        # 5. the batch, R = prompts x group_size rows: every sampled token is trained on, its
        # old logprob is the sampler's (no second forward pass; train_rl: rollouts.to_batch)
        samples = [s for g in groups for s in g]
        completions = [s.token_ids for s in samples]
        T = max(map(len, completions))
        mask = torch.tensor([[t < len(c) for t in range(T)] for c in completions], device=device)
        old_logp = torch.tensor([s.logprobs + [0.0] * (T - len(s.logprobs)) for s in samples], device=device)
        advantages = torch.where(mask, advantages_R[:, None].to(device), 0.0)  # each sample's, on its tokens

        # 6. loss: PPO's clipped surrogate per token with DAPO's clip-higher and the dual clip,
        # reduced by the aggregation: "token" (DAPO), "sample" (GRPO), "constant" (Dr. GRPO).
        # train_rl adds entropy, KL and value terms (rl_update.loss_terms) and splits micro-batches.
        # On fresh samples the ratio is 1 and a group's advantages sum to 0, so the loss is near 0;
        # its gradient, the mean of -A x grad log pi, is not
        logp = completion_logprobs(model, [s.prompt_ids for s in samples], completions, temperature)
        per_token, stats = policy_loss(
            logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
        )
        loss = masked_mean(per_token, mask, aggregation, max_new_tokens)

        # 7. one optimizer step: the schedule's lr, clip the gradient norm (logged before
        # clipping), step (train_rl: rl_update.update, `epochs` x `minibatches` of these)
        step_lr = lr_at(step, lr=lr, max_steps=steps, warmup_steps=warmup_steps, schedule=schedule)
        for group in optimizer.param_groups:
            group["lr"] = step_lr
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        # 8. sync the sampler: a no-op for HFSampler (same module); vLLM copies the weights here
        sampler.sync(model)

        # 9. log (train_rl: rl_metrics, and a checkpoint every `save_every` steps)
        n = len(samples)
        row = {
            "step": step + 1,
            "reward": sum(s.reward for g in scores for s in g) / n,
            "accuracy": sum(s.correct for g in scores for s in g) / n,
            "response_length": sum(map(len, completions)) / n,
            "loss": float(loss.detach()),
            "grad_norm": float(grad_norm),
            "clip_frac": float(stats["clip_frac"]),
            "lr": step_lr,
        }
        log(row)
        history.append(row)
    return history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(TINY_MODEL), help="a local model folder")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()  # no global RNG to seed: the sampler seeds itself from (seed, step, prompt)
    tokenizer, model = load_tokenizer(args.model), load_model(args.model)
    task = Arithmetic(ArithmeticConfig(max_digits=2, ood_digits=3))  # the tiny model's SFT task
    log = lambda r: print(  # noqa: E731
        f"step {r['step']:3d}  reward {r['reward']:.3f}  loss {r['loss']:+.4f}  grad {r['grad_norm']:.3f}"
    )
    minimal_grpo(model, tokenizer, task, steps=args.steps, seed=args.seed, log=log)


if __name__ == "__main__":
    main()
