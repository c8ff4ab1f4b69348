"""The preference trainer: micro-batching never changes the summed gradient, the gradient is the
objective's, the reference is the starting (or adapter-disabled) model, a resumed run equals an
uninterrupted one, a short DPO run separates chosen from rejected; the dpo and kto stages run
from the CLI on TRL-format files; the verifier pair generator pairs and counts as documented."""

import json

import pytest
import torch

from temper.data.preferences import Pair, tokenize_labelled, tokenize_pairs, unpair
from temper.models import build_preset
from temper.rollout.sampler import Sample
from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.train.preference import DPO, KTO, Preference, kto_items, reference_logps, sequence_logps
from temper.train.supervised import TrainConfig, backward_batch, train_supervised
from tiny_models import perturbed_nano


def _rows(n=8) -> list[Pair]:
    """The answer to i+1 is preferred to a wrong one."""
    return [
        Pair("t", i + 1, [{"role": "user", "content": f"{i}+1"}], [{"role": "assistant", "content": f"{i + 1}"}],
             [{"role": "assistant", "content": f"{i + 7}{i}"}])
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture
def pairs(tokenizer):
    return tokenize_pairs(tokenizer, _rows(), max_len=64)[0]


@pytest.fixture
def labelled(tokenizer):
    return kto_items(tokenize_labelled(tokenizer, unpair(_rows(4)), max_len=64)[0])


@pytest.mark.parametrize(
    "method",
    [
        DPO(beta=0.5),
        DPO(beta=0.5, loss_type="ipo"),
        DPO(beta=0.5, label_smoothing=0.2),
        KTO(beta=0.5, desirable_weight=1.3),
    ],
)
def test_micro_batch_split_never_changes_the_gradient(tokenizer, pairs, labelled, method):
    raw = labelled if isinstance(method, KTO) else pairs
    pad = tokenizer.pad_token_id
    objective = Preference(method, pad)
    items, _ = objective.start(build_preset("nano", tokenizer, seed=3), raw, [], 4)  # the reference
    model = perturbed_nano(tokenizer)
    context = objective.context(model, items)
    grads, losses = [], []
    for micro in (len(items), 3, 1):
        model.zero_grad(set_to_none=True)
        loss, _ = backward_batch(model, objective, items, context, micro, {})
        grads.append([p.grad.clone() for p in model.parameters()])
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], abs=1e-6) and losses[2] == pytest.approx(losses[0], abs=1e-6)
    assert any(g.abs().sum() > 0 for g in grads[0])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    # ... and it is the gradient of the method's mean loss over the whole batch
    model.zero_grad(set_to_none=True)
    refs = torch.stack([it.refs for it in items])
    logp, tokens = sequence_logps(model, method.sequences(raw), pad)
    method.loss(raw, logp, tokens, refs, context[0], {}).mean().backward()
    for a, p in zip(grads[0], model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-6)


def test_reference_is_the_adapter_disabled_base(tokenizer, pairs):
    from temper.models import with_lora

    pad = tokenizer.pad_token_id
    base = build_preset("nano", tokenizer, seed=3)
    columns = DPO().reference_sequences(pairs)
    expected = reference_logps(base, columns, pad, 8)
    model = with_lora(base, {"r": 4, "alpha": 8})
    with torch.no_grad():  # a trained adapter: B away from 0
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.3)
    assert not torch.allclose(sequence_logps(model, columns[0], pad)[0], expected[:, 0])
    torch.testing.assert_close(reference_logps(model, columns, pad, 3), expected)


def _config(**kw):
    return TrainConfig(
        **(
            {
                "max_steps": 12,
                "batch_size": 4,
                "lr": 3e-3,
                "warmup_steps": 0,
                "progress": False,
                "log_every": 1,
            }
            | kw
        )
    )


def test_a_short_dpo_run_separates_chosen_from_rejected(tokenizer, pairs, tmp_path):
    model = build_preset("nano", tokenizer, seed=0)
    result = train_supervised(
        model,
        pairs,
        _config(eval_every=6),
        tmp_path,
        objective=Preference(DPO(beta=0.5), tokenizer.pad_token_id),
        eval_set=pairs[:4],
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    for name in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    ):
        assert name in last and f"eval/{name}" in last
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is the reference
    assert last["eval/rewards/accuracies"] == 1.0 and last["eval/rewards/margins"] > 1.0
    assert last["loss"] < first["loss"] and result.steps == 12


def test_a_short_kto_run_raises_desirable_over_undesirable(tokenizer, labelled, tmp_path):
    model = build_preset("nano", tokenizer, seed=0)
    train_supervised(
        model, labelled, _config(), tmp_path, objective=Preference(KTO(beta=0.5), tokenizer.pad_token_id)
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"kl", "rewards/chosen", "rewards/rejected", "rewards/margins"} <= set(rows[-1])
    assert rows[-1]["rewards/margins"] > 1.0 > rows[0]["rewards/margins"]


def test_a_resumed_run_equals_the_uninterrupted_one(tokenizer, pairs, tmp_path):
    config = _config(max_steps=4, save_every=2)
    whole = build_preset("nano", tokenizer, seed=0)
    train_supervised(
        whole, pairs, config, tmp_path / "a", objective=Preference(DPO(beta=0.5), tokenizer.pad_token_id)
    )
    # interrupted after step 2: its last checkpoint is step 2; a fresh process starts from the
    # same starting model (the reference is recomputed from it, before the checkpoint loads)
    import shutil

    shutil.rmtree(tmp_path / "a" / "checkpoints" / "step-0000004")
    log = tmp_path / "a" / "metrics.jsonl"
    kept = log.read_text().splitlines()[:2]  # steps 1-2, with their timing-dependent tokens_per_s
    resumed = build_preset("nano", tokenizer, seed=0)
    train_supervised(
        resumed, pairs, config, tmp_path / "a", objective=Preference(DPO(beta=0.5), tokenizer.pad_token_id)
    )
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    rows = log.read_text().splitlines()
    assert rows[:2] == kept and [json.loads(r)["step"] for r in rows] == [1, 2, 3, 4]  # resumed, not rerun


def test_a_resumed_run_reports_the_whole_run(tokenizer, pairs, tmp_path):
    """Resumed from step 2 of 4, and rerun once more after the end (a kill in the stage's final
    save): tokens, the final loss, eval loss and the final row are the uninterrupted run's."""
    config = _config(max_steps=4, save_every=2, eval_every=2)
    pad, evals = tokenizer.pad_token_id, pairs[:4]
    whole = train_supervised(
        build_preset("nano", tokenizer, seed=0),
        pairs,
        config,
        tmp_path / "a",
        objective=Preference(DPO(beta=0.5), pad),
        eval_set=evals,
    )
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-0000004")
    for rerun in range(2):
        resumed = train_supervised(
            build_preset("nano", tokenizer, seed=0),
            pairs,
            config,
            tmp_path / "b",
            objective=Preference(DPO(beta=0.5), pad),
            eval_set=evals,
        )
        assert resumed.tokens == whole.tokens and resumed.final_loss == whole.final_loss, rerun
        assert resumed.eval_loss == whole.eval_loss and resumed.seconds > 0
        drop = ("tokens_per_s",)
        assert [{k: v for k, v in r.items() if k not in drop} for r in resumed.history] == [
            {k: v for k, v in r.items() if k not in drop} for r in whole.history
        ]


# ---- the stages, from the CLI -------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path, tokenizer):
    model = tmp_path / "model"
    build_preset("nano", tokenizer, seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    data = tmp_path / "prefs.jsonl"
    data.write_text(
        "".join(
            json.dumps({"chosen": [p.prompt[0], p.chosen[0]], "rejected": [p.prompt[0], p.rejected[0]]})
            + "\n"
            for p in _rows()
        )
    )
    return model, data


@pytest.mark.parametrize("kind", ["dpo", "kto"])
def test_stage_runs_from_the_cli(saved, tmp_path, kind):
    from temper.cli import main

    model, data = saved
    out = tmp_path / kind
    args = [kind, "--model", str(model), "--out", str(out), "--data.files", str(data), "--train.max_steps", "3",
            "--train.warmup_steps", "0", "--train.batch_size", "4", "--train.lr", "0.003", "--beta", "0.5"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / f"{kind}.json").read_text())
    assert summary["steps"] == 3 and summary["data"]["rows"] == (8 if kind == "dpo" else 16)
    assert "rewards/margins" in summary["final"]
    assert (out / "model" / "config.json").exists()


def test_dpo_refuses_unpaired_rows_and_ipo_smoothing(tmp_path, saved, capsys):
    from temper.cli import main

    model, _ = saved
    data = tmp_path / "unpaired.jsonl"
    data.write_text(json.dumps({"prompt": "1+1", "completion": "2", "label": True}) + "\n")
    args = [
        "dpo",
        "--model",
        str(model),
        "--out",
        str(tmp_path / "o"),
        "--data.files",
        str(data),
        "--train.warmup_steps",
        "0",
    ]
    assert main(args) != 0
    assert (
        "unpaired.jsonl:1: field 'label': an unpaired (prompt/completion/label) row: DPO needs"
        in capsys.readouterr().err
    )
    assert main(args + ["--loss", "ipo", "--label_smoothing", "0.1"]) != 0
    assert "label_smoothing" in capsys.readouterr().err
    assert main(["kto", "--model", str(model), "--out", str(tmp_path / "k")]) != 0
    assert "give data.files (preference data sets) and/or data.generate" in capsys.readouterr().err
    assert (
        main(
            [
                "kto",
                "--model",
                str(model),
                "--out",
                str(tmp_path / "k"),
                "--data.files",
                str(data),
                "--train.batch_size",
                "1",
            ]
        )
        != 0
    )
    assert "must be at least 2: KTO estimates its reference point" in capsys.readouterr().err


# ---- the generator --------------------------------------------------------------------------------


class _Scripted:
    """A sampler answering prompt i with the texts of `answers[i]`."""

    def __init__(self, answers):
        self.answers = answers

    def sample(self, prompts, n, **kw):
        assert n == len(self.answers[0])
        return [
            [Sample(p, [1] * (len(t) + 1), [0.0] * (len(t) + 1), t, "eos") for t in texts]
            for p, texts in zip(prompts, self.answers)
        ]

    def sync(self, model):
        pass


def test_generator_pairs_correct_over_incorrect_and_counts_the_rest(tokenizer):
    from temper.stages.preference import generate_pairs

    task = Arithmetic(ArithmeticConfig(max_digits=2))
    problems = task.sample("train", 4, 5)
    right = [task.demonstration(p) for p in problems]
    answers = [
        [right[0], "<answer>-1</answer>", right[0] + " ", "<answer>-2</answer>"],  # mixed: a pair
        [right[1]] * 4,  # all correct
        ["<answer>-1</answer>", "no", "", "x"],  # all wrong
        [right[3], right[3], right[3], ""],  # correct, and an empty answer (never used)
    ]
    kw = dict(k=4, temperature=1.0, max_new_tokens=8, seed=5)
    rows, counts = generate_pairs(_Scripted(answers), tokenizer, task, "train", 4, prefer="correct", **kw)
    assert counts == {
        "prompts": 4,
        "pairs": 1,
        "no_pair": {"all_correct": 2, "all_wrong": 1},
        "no_pair_share": 0.75,
        "sample_accuracy": 9 / 16,
    }
    assert rows[0]["prompt"] == problems[0].messages()
    assert task.score(problems[0], rows[0]["chosen"][0]["content"]).correct
    assert not task.score(problems[0], rows[0]["rejected"][0]["content"]).correct

    rows, counts = generate_pairs(_Scripted(answers), tokenizer, task, "train", 4, prefer="shorter", **kw)
    # prompt 0: the shortest correct answer over the longest; 1 and 3: correct answers of one length
    assert counts["pairs"] == 1 and counts["no_pair"] == {
        "correct_all_same_length": 2,
        "fewer_than_2_correct": 1,
    }
    assert (rows[0]["chosen"][0]["content"], rows[0]["rejected"][0]["content"]) == (right[0], right[0] + " ")


def test_unpaired_generation_labels_every_distinct_answer(tokenizer):
    """KTO's rows: every distinct non-empty answer of every prompt, desirable iff correct, the
    all-correct and all-wrong prompts included."""
    from temper.stages.preference import generate_pairs

    task = Arithmetic(ArithmeticConfig(max_digits=2))
    problems = task.sample("train", 3, 5)
    right = [task.demonstration(p) for p in problems]
    answers = [
        [right[0], "<answer>-1</answer>", right[0], ""],  # mixed; a duplicate and an empty answer
        [right[1]] * 4,  # all correct: no pair, but a desirable row
        ["<answer>-1</answer>", "no", "no", "x"],  # all wrong: three undesirable rows
    ]
    kw = dict(k=4, temperature=1.0, max_new_tokens=8, seed=5, prefer="correct")
    rows, counts = generate_pairs(_Scripted(answers), tokenizer, task, "train", 3, unpaired=True, **kw)
    assert counts == {
        "prompts": 3,
        "rows": 6,
        "desirable": 2,
        "undesirable": 4,
        "no_pair": {"all_correct": 1, "all_wrong": 1},
        "no_pair_share": 2 / 3,
        "sample_accuracy": 6 / 12,
    }
    got = [(r["prompt"], r["completion"][0]["content"], r["label"]) for r in rows]
    assert got == [
        (problems[0].messages(), right[0], True),
        (problems[0].messages(), "<answer>-1</answer>", False),
        (problems[1].messages(), right[1], True),
        (problems[2].messages(), "<answer>-1</answer>", False),
        (problems[2].messages(), "no", False),
        (problems[2].messages(), "x", False),
    ]


def test_dpo_and_sft_refuse_unpaired_generation():
    from pydantic import ValidationError

    from temper.stages.dpo import DPOStage
    from temper.stages.kto import KTOStage
    from temper.stages.sft import SFTStage

    gen = {"tasks": ["arithmetic"], "unpaired": True}
    with pytest.raises(ValidationError, match="unpaired.*kind: kto"):
        DPOStage(kind="dpo", data={"generate": gen})
    with pytest.raises(ValidationError, match="chosen answers of pairs"):
        SFTStage(kind="sft", data={"pairs": gen})
    KTOStage(kind="kto", data={"generate": gen})


def test_sft_on_chosen_trains_on_the_pairs_a_dpo_stage_generates(tmp_path, tokenizer, monkeypatch):
    """`sft.data.pairs` and `dpo.data.generate` with one block and one source give the same pairs
    (pairs.jsonl of each), and SFT's examples are the chosen answers, never the rejected."""
    import temper.stages.preference as preference
    from temper.stages.context import StageContext
    from temper.stages.dpo import DPOStage
    from temper.stages.sft import SFTStage, run_sft

    task = Arithmetic(ArithmeticConfig(max_digits=2))
    problems = task.sample("train", 6, 0)
    answers = [[task.demonstration(p), "<answer>-1</answer>"] for p in problems]
    monkeypatch.setattr(preference, "HFSampler", lambda model, tokenizer: _Scripted(answers))
    model_dir = tmp_path / "model"
    build_preset("nano", tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    ctx = StageContext(run_dir=tmp_path, base_dir=tmp_path, tasks={"arithmetic": task}, task_options={})
    gen = {"tasks": ["arithmetic"], "prompts_per_task": 6, "k": 2, "seed": 0}
    train = {"max_steps": 2, "batch_size": 2, "warmup_steps": 0, "progress": False}
    sft = SFTStage(kind="sft", data={"pairs": gen, "eval_problems": 0}, train=train, max_len=64)
    run_sft(sft, ctx, model_dir, tmp_path / "sft")
    dpo = DPOStage(kind="dpo", data={"generate": gen}, train=train)
    preference.preference_rows(dpo, ctx, build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "dpo")
    pairs = (tmp_path / "sft" / "pairs.jsonl").read_text()
    assert pairs == (tmp_path / "dpo" / "pairs.jsonl").read_text() and len(pairs.splitlines()) == 6
    summary = json.loads((tmp_path / "sft" / "sft.json").read_text())
    assert summary["data"]["examples"] == 6 and summary["generated"]["train"]["arithmetic"]["pairs"] == 6
    (shown,) = json.loads((tmp_path / "sft" / "examples.json").read_text())["examples"]
    text = tokenizer.decode(shown["ids"])
    assert "-1" not in text and any(task.demonstration(p) in text for p in problems)


def test_the_new_fields_leave_older_stage_hashes_alone():
    """`sft.data.pairs` and `generate.unpaired` unset: the settings (the stage hash) are those of a
    stage written before the fields existed, so its finished folder is still reused."""
    from temper.stages.dpo import DPOStage
    from temper.stages.markers import stage_settings
    from temper.stages.sft import SFTStage

    assert "pairs" not in stage_settings(SFTStage(kind="sft"))["data"]
    generate = stage_settings(DPOStage(kind="dpo", data={"generate": {"tasks": ["arithmetic"]}}))["data"][
        "generate"
    ]
    assert "unpaired" not in generate and "seed" in generate


def test_the_plan_does_not_count_steps_of_pairs_not_yet_generated(tmp_path):
    from temper.preflight import _epoch_notes
    from temper.stages.sft import SFTStage

    stage = SFTStage(kind="sft", data={"pairs": {"tasks": ["arithmetic"]}}, train={"epochs": 2})
    assert _epoch_notes(stage, tmp_path) == ["sft: 2 epochs; steps counted once the pairs are generated"]
