"""The reward-model scorer: save/load through the Auto classes scores identically, padding and
batching do not change a score, and a path that is not a reward model is refused by name."""

import pytest
import torch
from transformers import LlamaForSequenceClassification

from temper.models import build_preset
from temper.models.presets import preset_config
from temper.rewards.reward_model import RewardModel, RewardModelError, find_reward_model, sequence_rewards


def _tiny_rm(tokenizer, seed=0):
    config = preset_config("nano", tokenizer)
    config.num_labels = 1
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
        # a random head near 0 would make every score alike; make scores depend on the input
        torch.nn.init.normal_(model.score.weight, std=1.0)
    return model.eval()


def _pairs(tokenizer):
    prompts = [
        tokenizer.encode("1+2=", add_special_tokens=False),
        tokenizer.encode("17+25=", add_special_tokens=False),
    ]
    prompts.append(tokenizer.encode("a much longer prompt, 3+4=", add_special_tokens=False))
    completions = [tokenizer.encode(t, add_special_tokens=False) for t in ("3", "42<|end|>", "7")]
    return prompts, completions


def test_save_load_scores_identically(tmp_path, tokenizer):
    model = _tiny_rm(tokenizer)
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    prompts, completions = _pairs(tokenizer)
    in_memory = RewardModel(model, tokenizer.pad_token_id).score(prompts, completions)
    loaded = RewardModel.load(tmp_path / "rm", device=torch.device("cpu"))
    assert loaded.score(prompts, completions) == pytest.approx(in_memory, abs=1e-6)
    # each score is the head at the sequence's own last token, computed without any padding
    for p, c, s in zip(prompts, completions, in_memory, strict=True):
        ids = torch.tensor([p + c])
        alone = sequence_rewards(model, ids, torch.ones_like(ids)).item()
        assert s == pytest.approx(alone, abs=1e-5)
    assert len(set(round(s, 4) for s in in_memory)) == 3  # the inputs are told apart


def test_a_float64_reward_model_scores_in_float64(tmp_path, tokenizer):
    model = _tiny_rm(tokenizer).double()
    ids = torch.tensor([_pairs(tokenizer)[0][0]])
    assert sequence_rewards(model, ids, torch.ones_like(ids)).dtype == torch.float64
    assert sequence_rewards(model.bfloat16(), ids, torch.ones_like(ids)).dtype == torch.float32
    model.double().save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    assert RewardModel.load(tmp_path / "rm", device=torch.device("cpu")).model.dtype == torch.float64


def test_padding_and_batching_do_not_change_a_score(tokenizer):
    rm = RewardModel(_tiny_rm(tokenizer), tokenizer.pad_token_id)
    prompts, completions = _pairs(tokenizer)
    batched = rm.score(prompts, completions, batch_size=32)
    one_by_one = [rm.score([p], [c], batch_size=1)[0] for p, c in zip(prompts, completions, strict=True)]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    # the order of the inputs is kept though batches are formed by length
    assert rm.score(prompts[::-1], completions[::-1]) == pytest.approx(batched[::-1], abs=1e-5)


def test_pad_id_missing_from_config_is_taken_from_the_tokenizer(tmp_path, tokenizer):
    """Without pad_token_id the HF head reads the last position, padding included; load sets it."""
    model = _tiny_rm(tokenizer)
    model.config.pad_token_id = None
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    rm = RewardModel.load(tmp_path / "rm", device=torch.device("cpu"))
    prompts, completions = _pairs(tokenizer)
    alone = [rm.score([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    assert rm.score(prompts, completions) == pytest.approx(alone, abs=1e-5)


def test_paths_that_are_not_reward_models_are_refused(tmp_path, tokenizer):
    with pytest.raises(RewardModelError, match="does not exist"):
        RewardModel.load(tmp_path / "nowhere")
    (tmp_path / "stage" / "reward_model").mkdir(parents=True)
    (tmp_path / "stage" / "reward_model" / "config.json").write_text("{}")
    with pytest.raises(RewardModelError, match="did you mean .*reward_model"):
        RewardModel.load(tmp_path / "stage")
    policy = build_preset("nano", tokenizer)
    policy.save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    with pytest.raises(RewardModelError, match="not a reward model.*LlamaForCausalLM"):
        RewardModel.load(tmp_path / "policy")
    two = _tiny_rm(tokenizer)
    two.config.num_labels = 2
    two.save_pretrained(tmp_path / "two")
    with pytest.raises(RewardModelError, match="2 labels"):
        RewardModel.load(tmp_path / "two")


def test_score_checks_its_inputs(tokenizer):
    rm = RewardModel(_tiny_rm(tokenizer), tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        rm.score([[5], [6]], [[7]])
    with pytest.raises(ValueError, match="sequence 0 is empty"):
        rm.score([[]], [[]])


def test_a_recipe_names_a_reward_model_by_stage_or_path(tmp_path):
    run, base = tmp_path / "runs" / "r", tmp_path / "recipes"
    (run / "03-rm" / "reward_model").mkdir(parents=True)
    (run / "03-rm" / "reward_model" / "config.json").write_text("{}")
    (base / "models" / "mine").mkdir(parents=True)
    assert find_reward_model("rm", run, base) == run / "03-rm" / "reward_model"
    assert find_reward_model("models/mine", run, base) == base / "models" / "mine"
    assert find_reward_model(str(run / "03-rm"), run, base) == run / "03-rm" / "reward_model"
    assert find_reward_model("other", run, base) == base / "other"  # RewardModel.load names it
