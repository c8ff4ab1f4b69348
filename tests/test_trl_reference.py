"""temper's RL loss and gradient beside TRL's GRPOTrainer._compute_loss on identical tensors.

TRL pads prompts on the left and computes logits for every completion position; temper packs the
sequences and projects only completion positions, so this also checks the packed forward against an
independent implementation. Mapping: TRL loss_type dapo = temper aggregation token, grpo = sample,
dr_grpo = constant. TRL's entropy bonus is always a token mean, temper reduces it like the policy
loss (as verl does), so the entropy term is compared under the token aggregation only; TRL has no
dual clip, so it is off here. TRL 1.16 by default also multiplies the k3 KL by the importance ratio
(`use_bias_correction_kl`, unbiased for samples of an older policy); temper follows GRPO's eq. 4 and verl
(no correction), so the option is off here. Both are equal on the first epoch (ratio 1).
"""

import tempfile

import pytest
import torch

trl = pytest.importorskip("trl")

from temper.models import build_preset  # noqa: E402
from temper.train.rl_config import RLConfig  # noqa: E402
from temper.train.rl_update import Prepared, backward_minibatch, forward_rows, loss_terms, policy_with_value  # noqa: E402
from test_rl_update import _off_policy, _rollouts  # noqa: E402  (tests/ is on sys.path)

MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def trainer(tokenizer):
    from datasets import Dataset

    model = build_preset("nano", tokenizer, seed=1)
    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=9,
        num_generations=3,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=0.7,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,  # set after construction: with beta > 0 TRL would load a reference from the hub
        report_to=[],
        use_cpu=True,
        bf16=False,  # TRL's default autocasts the forward to bf16
        use_bias_correction_kl=False,  # TRL 1.16 multiplies k3 by the ratio by default; temper and verl do not
        save_strategy="no",
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "q"}] * 9),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _trl_inputs(p: Prepared, pad_id: int) -> dict[str, torch.Tensor]:
    R = len(p.prompts)
    width = max(len(x) for x in p.prompts)
    prompt_ids = torch.full((R, width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((R, width), dtype=torch.long)
    for r, x in enumerate(p.prompts):  # left padding, as TRL's generation produces
        prompt_ids[r, width - len(x) :] = torch.tensor(x)
        prompt_mask[r, width - len(x) :] = 1
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": p.completions,
        "completion_mask": p.mask.long(),
        "advantages": p.advantages[:, 0],
        "old_per_token_logps": p.old_logp,
        "ref_per_token_logps": p.ref_logp,
        "num_items_in_batch": p.mask.sum(),
    }


@pytest.mark.parametrize(
    ("loss_type", "aggregation", "entropy_coef"),
    [("dapo", "token", 0.1), ("grpo", "sample", 0.0), ("dr_grpo", "constant", 0.0)],
)
def test_loss_and_gradient_match_trl_grpo(tokenizer, trainer, loss_type, aggregation, entropy_coef):
    config = RLConfig(
        advantage="grpo",
        aggregation=aggregation,
        temperature=0.7,
        max_new_tokens=MAX_NEW_TOKENS,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=None,
        kl_coef=0.2,
        entropy_coef=entropy_coef,
    )
    model = trainer.model
    module = policy_with_value(model, config)
    batch = _off_policy(module, _rollouts(vocab=len(tokenizer)), noise=0.3)
    reference = build_preset("nano", tokenizer, seed=2).requires_grad_(False)
    with torch.no_grad():
        ref_logp = forward_rows(
            policy_with_value(reference, config),
            Prepared(batch.prompts, batch.completions_R_T, batch.mask_R_T, *[None] * 6),
        )[0].logp
    advantages = (
        torch.randn(len(batch.prompts), 1, generator=torch.Generator().manual_seed(3)) * batch.mask_R_T
    )
    p = Prepared(
        batch.prompts,
        batch.completions_R_T,
        batch.mask_R_T,
        batch.old_logprobs_R_T,
        advantages,
        ref_logp,
        None,
        None,
        None,
    )

    model.train()
    model.zero_grad(set_to_none=True)
    stats: dict[str, list[float]] = {}
    backward_minibatch(module, p, loss_terms(config, p), config, stats)
    ours = [q.grad.clone() for q in model.parameters()]

    trainer.loss_type, trainer.beta, trainer.entropy_coef = loss_type, 0.2, entropy_coef
    trainer._entropy_bonus_enabled = entropy_coef != 0
    model.train()
    model.zero_grad(set_to_none=True)
    theirs_loss = trainer._compute_loss(model, _trl_inputs(p, tokenizer.pad_token_id))
    theirs_loss.backward()
    assert stats["loss"][0] == pytest.approx(theirs_loss.item(), abs=1e-5)
    for a, q in zip(ours, model.parameters()):
        torch.testing.assert_close(a, q.grad, rtol=0, atol=1e-5)
