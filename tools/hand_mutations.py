"""Hand-written one-line mutations of the trainer wrappers, masks, graders, agent loop and resume
(issue #24 item 8), each applied alone to the worktree's sources and run against the test files
of its area: first the files that existed before item 8 (the "before" verdict), then, if none
failed, item 8's new files (the "after" verdict). Prints one line per mutation and a summary.

    git archive HEAD | tar -x -C /tmp/copy && cd /tmp/copy    # it edits the sources in place
    PYTHONPATH=src python tools/hand_mutations.py [NAME_SUBSTRING ...]
    FROM=4 PART=0/3 ... (skip the first 4; run every 3rd from the 0th, for parallel copies)

The copy must hold every tracked file: some tests read checkpoints/ (a copy of src/ and tests/
alone makes them fail, and every mutant of their area look killed).

Each mutation is (name, file, exact text, replacement, area); the text must occur exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

RL = [
    "tests/test_rl_update.py",
    "tests/test_rl_update_exact.py",
    "tests/test_rlhf.py",
    "tests/test_estimators.py",
]
PREF = [
    "tests/test_objectives.py",
    "tests/test_preference_losses.py",
    "tests/test_preference_pack.py",
    "tests/test_preferences_data.py",
    "tests/test_preference_train.py",
]
MASK = [
    "tests/test_data.py",
    "tests/test_data_exact.py",
    "tests/test_chat_exact.py",
    "tests/test_mask_view_exact.py",
    "tests/test_dataset_exact.py",
    "tests/test_tool_sft.py",
    "tests/test_sft_data.py",
    "tests/test_chat_template.py",
    "tests/test_calculator_env.py",
]
LOOP = [
    "tests/test_agent_loop.py",
    "tests/test_rollouts_exact.py",
    "tests/test_rollout_exact.py",
    "tests/test_turn_credit.py",
]
REPAIR = ["tests/test_code_repair_grader.py", "tests/test_code_repair.py"]
STAGE = ["tests/test_rft.py", "tests/test_prompt_distill.py"]
RESUME = [
    "tests/test_train.py",
    "tests/test_rl.py",
    "tests/test_checkpoint.py",
    "tests/test_supervised_exact.py",
]
NEW = {
    "rl": ["tests/test_config_wiring.py"],
    "pref": ["tests/test_fixture_audit_preference.py"],
    "mask": ["tests/test_fixture_audit_masks.py"],
    "loop": ["tests/test_fixture_audit_loop.py"],
    "repair": ["tests/test_fixture_audit_repair.py"],
    "resume": ["tests/test_resume_rng.py"],
    "stage": ["tests/test_config_wiring.py"],
}
OLD = {"rl": RL, "pref": PREF, "mask": MASK, "loop": LOOP, "repair": REPAIR, "resume": RESUME, "stage": STAGE}

U = "src/temper/train/rl_update.py"
P = "src/temper/train/preference.py"
MUTATIONS = [
    # ---- (a) a trainer wrapper dropping or miswiring a config argument
    ("prepare: gamma <- lam", U, "gamma=config.gamma,", "gamma=config.lam,", "rl"),
    ("prepare: lam <- gamma", U, "lam=config.lam,", "lam=config.gamma,", "rl"),
    ("prepare: whiten always", U, "whiten=config.whiten_advantages,", "whiten=True,", "rl"),
    ("prepare: grpo_eps dropped", U, "grpo_eps=config.grpo_eps,", "grpo_eps=1e-6,", "rl"),
    (
        "prepare: KL in reward whatever kl_mode",
        U,
        'kl_coef=config.kl_coef if config.kl_mode == "reward" else 0.0,',
        "kl_coef=config.kl_coef,",
        "rl",
    ),
    (
        "prepare: reference at T=1",
        U,
        "PolicyWithValue(reference, None, config.temperature)",
        "PolicyWithValue(reference, None)",
        "rl",
    ),
    ("policy: clip_high <- clip_low", U, "clip_high=config.clip_high,", "clip_high=config.clip_low,", "rl"),
    ("policy: dual_clip dropped", U, "dual_clip=config.dual_clip,", "dual_clip=None,", "rl"),
    (
        "value term aggregated like the policy",
        U,
        'LossTerm("value", config.vf_coef, "token", _value)',
        'LossTerm("value", config.vf_coef, config.aggregation, _value)',
        "rl",
    ),
    (
        "entropy bonus sign",
        U,
        'LossTerm("entropy", -config.entropy_coef,',
        'LossTerm("entropy", config.entropy_coef,',
        "rl",
    ),
    ("value_clip dropped", U, "clip=config.value_clip)", "clip=0.2)", "rl"),
    (
        "policy module at T=1",
        U,
        "return PolicyWithValue(model, value, config.temperature)",
        "return PolicyWithValue(model, value)",
        "rl",
    ),
    (
        "constant aggregation by widest row",
        U,
        "aggregation_size(p.mask, agg, config.max_new_tokens)",
        "aggregation_size(p.mask, agg, p.mask.shape[1])",
        "rl",
    ),
    (
        "minibatch shuffle same every step",
        U,
        "manual_seed(config.seed * 7 + step * 1000 + epoch)",
        "manual_seed(config.seed * 7 + epoch)",
        "rl",
    ),
    ("DPO: label smoothing dropped", P, "self.beta, self.label_smoothing)", "self.beta, 0.0)", "pref"),
    (
        "KTO: undesirable weight <- desirable",
        P,
        "self.desirable_weight, self.undesirable_weight",
        "self.desirable_weight, self.desirable_weight",
        "pref",
    ),
    (
        "IPO: chosen/rejected lengths swapped",
        P,
        "n_chosen, n_rejected = tokens.chunk(2)",
        "n_rejected, n_chosen = tokens.chunk(2)",
        "pref",
    ),
    (
        "BT: centering dropped",
        P,
        "bradley_terry_loss(chosen, rejected, margin, self.center_coef)",
        "bradley_terry_loss(chosen, rejected, margin, 0.0)",
        "pref",
    ),
    # ---- (b) masks, data paths, graders with fixtures too simple
    (
        "KTO: KL sequence is its own completion",
        P,
        "mismatched(it.sequence, items[i - 1].sequence)",
        "mismatched(it.sequence, items[i].sequence)",
        "pref",
    ),
    ("preference: micro-batch mean", P, "return losses.sum() / batch_size,", "return losses.mean(),", "pref"),
    (
        "preference logps: mask by pad",
        P,
        "mask_N_T = labels_N_T != IGNORE",
        "mask_N_T = completions_N_T != pad_id",
        "pref",
    ),
    (
        "preference: rewards/accuracies >=",
        P,
        "(r_chosen > r_rejected).float()",
        "(r_chosen >= r_rejected).float()",
        "pref",
    ),
    (
        "SFT chat prompt: last header token trained",
        "src/temper/data/chat.py",
        "labels[:prompt_len] = [IGNORE] * prompt_len",
        "labels[: prompt_len - 1] = [IGNORE] * (prompt_len - 1)",
        "mask",
    ),
    (
        "SFT chat prompt: its assistant turns trained",
        "src/temper/data/chat.py",
        "labels[:prompt_len] = [IGNORE] * prompt_len",
        "labels[:0] = []",
        "mask",
    ),
    (
        "SFT chat: end-of-turn token untrained",
        "src/temper/data/chat.py",
        "labels[len(prompt) : len(upto)] = full[len(prompt) : len(upto)]",
        "labels[len(prompt) : len(upto) - 1] = full[len(prompt) : len(upto) - 1]",
        "mask",
    ),
    (
        "SFT: first token of a packed example labelled",
        "src/temper/data/dataset.py",
        "labels = [IGNORE] + tok.labels[1:]",
        "labels = list(tok.labels)",
        "mask",
    ),
    (
        "SFT untrained span: first occurrence only",
        "src/temper/data/chat.py",
        "        for i in hits:\n",
        "        for i in hits[:1]:\n",
        "mask",
    ),
    (
        "SFT prompt/completion: no eos",
        "src/temper/data/chat.py",
        "completion = completion + [tokenizer.eos_token_id]",
        "completion = completion",
        "mask",
    ),
    (
        "agent loop: env tokens trainable",
        "src/temper/rollout/loop.py",
        "e.trajectory.segments.append(Segment(delta, None, False))",
        "e.trajectory.segments.append(Segment(delta, None, True))",
        "loop",
    ),
    (
        "agent loop: turn index off by one",
        "src/temper/rollout/loop.py",
        "Segment(list(s.token_ids), list(s.logprobs), True, e.actions)",
        "Segment(list(s.token_ids), list(s.logprobs), True, e.actions + 1)",
        "loop",
    ),
    (
        "trajectory: turns without the +1",
        "src/temper/rollout/trajectory.py",
        "return 1 + max((s.turn for s in self.segments), default=-1)",
        "return max((s.turn for s in self.segments), default=0)",
        "loop",
    ),
    (
        "rollouts: process reward of the last turn dropped",
        "src/temper/train/rollouts.py",
        "steps = (t.step_rewards + [0.0] * t.turns)[: t.turns]",
        "steps = (t.step_rewards + [0.0] * t.turns)[: t.turns - 1]",
        "loop",
    ),
    (
        "to_batch: old logprobs at env tokens not 0",
        "src/temper/rollout/trajectory.py",
        "(s.logprobs or [0.0] * len(s.token_ids))",
        "(s.logprobs or [-1.0] * len(s.token_ids))",
        "loop",
    ),
    (
        "grader: any passing case passes",
        "src/temper/envs/code_repair/grader.py",
        "return Verdict(ok == n, ok, n,",
        "return Verdict(ok > 0, ok, n,",
        "repair",
    ),
    (
        "grader: first nonce line",
        "src/temper/envs/code_repair/grader.py",
        "got = json.loads(lines[-1][len(nonce) :])",
        "got = json.loads(lines[0][len(nonce) :])",
        "repair",
    ),
    (
        "grader: symlink followed",
        "src/temper/envs/code_repair/grader.py",
        "os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK",
        "os.O_RDONLY | os.O_NONBLOCK",
        "repair",
    ),
    (
        "grader: short result list accepted",
        "src/temper/envs/code_repair/grader.py",
        "len(got) != n or",
        "len(got) > n or",
        "repair",
    ),
    # ---- (c) resume exactness where randomness matters
    (
        "sft: global seed ignores config.seed",
        "src/temper/train/supervised.py",
        "    torch.manual_seed(config.seed)\n",
        "    torch.manual_seed(0)\n",
        "resume",
    ),
    (
        "rl stage: global RNG not seeded",
        "src/temper/stages/rl.py",
        "    torch.manual_seed(config.seed)\n",
        "",
        "resume",
    ),
    (
        "sft: same permutation every epoch",
        "src/temper/train/supervised.py",
        "manual_seed(seed * 100_003 + epoch)",
        "manual_seed(seed * 100_003)",
        "resume",
    ),
    ("prepare: turn_gamma dropped", U, "turn_gamma=config.turn_gamma,", "turn_gamma=1.0,", "rl"),
    (
        "rft: sampling temperature dropped",
        "src/temper/stages/rft.py",
        "temperature=stage.temperature,",
        "temperature=1.0,",
        "stage",
    ),
    (
        "prompt distill: teacher temperature dropped",
        "src/temper/stages/prompt_distill.py",
        "temperature=stage.temperature,",
        "temperature=1.0,",
        "stage",
    ),
    (
        "sft resume: metrics log not cut back",
        "src/temper/train/supervised.py",
        "        log.truncate_after(start)\n",
        "        pass\n",
        "resume",
    ),
]


def run(old: list[str], new: list[str]) -> tuple[str, str]:
    """One pytest process, -x, the area's older files first: ("before", test) when one of them
    fails, ("after", test) when only a new file fails, ("", "") when none does."""
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    files = [f for f in old + new if (ROOT / f).exists()]
    out = subprocess.run(
        [PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode == 0:
        return "", ""
    first = next(
        (ln.split(" ")[1] for ln in out.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))), ""
    )
    if not first:
        return "before", (out.stdout.strip().splitlines() or [out.stderr[-200:]])[-1]
    return ("after" if first.split("::")[0] in new else "before"), first


def main(only: list[str]) -> None:
    part = os.environ.get("PART")  # "i/k": every k-th mutation from the i-th, for parallel copies
    killed_before = killed_after = total = 0
    for index, (name, path, old, new, area) in enumerate(MUTATIONS):
        if index < int(os.environ.get("FROM", "0")):  # resume a run cut after that many
            continue
        if part and index % int(part.split("/")[1]) != int(part.split("/")[0]):
            continue
        if only and not any(o in name for o in only):
            continue
        file = ROOT / path
        text = file.read_text()
        assert text.count(old) == 1, (name, text.count(old))
        total += 1
        try:
            file.write_text(text.replace(old, new))
            when, why = run(OLD[area], NEW[area])
        finally:
            file.write_text(text)
        killed_before += when == "before"
        killed_after += when != ""
        verdict = {"before": "killed", "after": "killed by new", "": "SURVIVED"}[when]
        print(f"{verdict:14} | {area:6} | {name} | {why}", flush=True)
    print(f"before: {killed_before}/{total}  after: {killed_after}/{total}")


if __name__ == "__main__":
    main(sys.argv[1:])
