"""Best-of-N as an eval mode: accuracy vs N from one draw per problem (verifier or reward-model
ranked) through `evaluate`, the eval stage's `best_of_n` block (parsed, located errors), the
tables, the report, and micro runs of the eval stage on the tiny preset."""

import itertools
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaForSequenceClassification

from temper.cli import main
from temper.data.chat import prompt_ids
from temper.evaluate import best_of_n_metrics, best_of_n_rows, evaluate, format_table
from temper.models.presets import preset_config
from temper.recipe import RecipeError, parse_recipe
from temper.rewards.best_of_n import best_index, bon_kl
from temper.rollout.sampler import Sample
from temper.stats import pass_at_k
from temper.tasks.base import Problem, Score


class OkTask:
    """Right when the completion says "ok"."""

    name = "oks"

    def sample(self, split, n, seed):
        return [Problem("oks", split, f"{split}-{i}", f"question {i}", {"i": i}) for i in range(n)]

    def score(self, problem, completion):
        ok = "ok" in completion
        return Score(float(ok), ok, True, {"reason": "right" if ok else "wrong"})

    def demonstration(self, problem):
        return "ok"

    def corpus_text(self, problem):
        return problem.prompt


SAMPLED = [  # problem i: its 4 samples, in draw order
    ["ok", "no", "no", "no"],
    ["no", "no", "no", "no"],
    ["no", "nope", "ok", "okay"],
    ["ok", "ok", "ok", "ok"],
    ["no", "no", "no", "nah-ok"],
]


class Scripted:
    """A Sampler whose sample j of problem i is SAMPLED[i][j] (greedy: "no"), one token per character."""

    def __init__(self, tokenizer, problems):
        self.by_prompt = {tuple(prompt_ids(tokenizer, p.messages())): s for p, s in zip(problems, SAMPLED)}
        self.calls = []

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, seed=0, **kw):
        self.calls.append((n, temperature))
        out = []
        for prompt in prompts:
            texts = ["no"] * n if temperature == 0.0 else self.by_prompt[tuple(prompt)][:n]
            out.append([Sample(list(prompt), [ord(c) for c in t], [-1.0] * len(t), t, "eos") for t in texts])
        return out

    def sync(self, model):
        pass


def _scripted(tokenizer):
    task = OkTask()
    return task, Scripted(tokenizer, task.sample("test", len(SAMPLED), 0))


KW = dict(n_problems=len(SAMPLED), seed=0, max_new_tokens=8, n_examples=0, temperature=1.0)


def test_verifier_ranked_accuracy_is_unbiased_pass_at_n_from_one_draw(tokenizer):
    task, sampler = _scripted(tokenizer)
    r = evaluate(sampler, tokenizer, task, "test", k=2, best_of_n=[1, 2, 4], **KW)
    assert sampler.calls == [(1, 0.0), (4, 1.0)]  # one greedy draw, ONE sampled draw of max(k, N)
    b = r["best_of_n"]
    assert b["rank"] == "verifier" and b["samples"] == 4 and b["n"] == [1, 2, 4]
    assert b["kl"] == [bon_kl(1), bon_kl(2), bon_kl(4)]
    c = [1, 0, 2, 4, 1]  # correct samples per problem
    for j, size in enumerate([1, 2, 4]):
        assert b["accuracy"][j]["value"] == pytest.approx(sum(pass_at_k(4, ci, size) for ci in c) / 5)
    assert b["accuracy"][0]["value"] == pytest.approx(8 / 20) and b["accuracy"][2]["value"] == 4 / 5
    assert "verifier_ranked" not in b and "score" not in b
    # pass@k reads the first k samples of the draw: what a draw of k alone gives
    alone = evaluate(sampler, tokenizer, task, "test", k=2, **KW)
    assert alone["metrics"] == r["metrics"] and "best_of_n" not in alone
    assert r["graded"] == 5 + 5 * 4 and alone["graded"] == 5 + 5 * 2


def test_a_learned_ranker_gives_the_exact_subset_mean_of_its_picks(tokenizer):
    """Ranked by completion length (longest first, ties to the earlier sample), each problem's
    accuracy at N is the mean over all N-subsets of its 4 samples of its pick's correctness."""
    task, sampler = _scripted(tokenizer)
    seen = []

    def by_length(prompts, completions):
        seen.append(len(completions))
        return [float(len(c)) for c in completions]

    r = evaluate(sampler, tokenizer, task, "test", k=1, best_of_n=[1, 2, 3, 4], ranker=by_length, **KW)
    assert seen == [20]  # one call over every sample of every problem
    b = r["best_of_n"]
    assert b["rank"] == "reward_model"
    for j, size in enumerate(b["n"]):
        want, score = [], []
        for texts in SAMPLED:
            subsets = list(itertools.combinations(range(4), size))
            picks = [s[best_index([float(len(texts[i])) for i in s])] for s in subsets]
            want.append(sum("ok" in texts[p] for p in picks) / len(subsets))
            score.append(sum(len(texts[p]) for p in picks) / len(subsets))
        assert b["accuracy"][j]["value"] == pytest.approx(sum(want) / 5, abs=1e-12)
        assert b["score"][j]["value"] == pytest.approx(sum(score) / 5, abs=1e-12)
        assert b["verifier_ranked"][j]["value"] == pytest.approx(
            sum(pass_at_k(4, ci, size) for ci in [1, 0, 2, 4, 1]) / 5
        )
    # length prefers "nah-ok" and "okay": at N=4 problems 0, 3, 4 are right... and problem 2 is ("okay")
    assert b["accuracy"][3]["value"] == pytest.approx(3 / 5)
    header, rows = best_of_n_rows({"m": {"test": r}})
    assert header[-2:] == ["verifier-ranked (pass@N)", "RM score of pick"] and len(rows) == 4
    assert rows[1][:5] == ["m", "test", "reward_model", "2", f"{bon_kl(2):.3f}"]
    text = format_table({"m": {"test": r}})
    assert "\n\nbest-of-N\nmodel  split  rank" in text and "0.636" in text  # KL of N=4


def test_best_of_n_metrics_refuses_bad_sizes_and_rankers(tokenizer):
    sample = Sample([1], [2], [-1.0], "ok", "eos")
    score = Score(1.0, True, True, {})
    with pytest.raises(ValueError, match="need 1 <= N <= 2"):
        best_of_n_metrics([[sample, sample]], [[score, score]], [1, 4])
    with pytest.raises(ValueError, match="gave 1 scores for 2"):
        best_of_n_metrics([[sample, sample]], [[score, score]], [2], ranker=lambda p, c: [0.0])
    with pytest.raises(ValueError, match="non-finite"):
        best_of_n_metrics([[sample, sample]], [[score, score]], [2], ranker=lambda p, c: [0.0, float("nan")])


RECIPE = """\
name: t
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 1}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0}
  - kind: eval
    n_problems: 4
    best_of_n: BON
"""


def _parse(bon: str, tmp_path: Path | None = None):
    return parse_recipe(RECIPE.replace("BON", bon), "r.yaml", tmp_path)


def test_the_eval_option_parses():
    stage = _parse("{n: [1, 2, 4, 8]}").stages[1]
    assert stage.best_of_n.n == [1, 2, 4, 8] and stage.best_of_n.rank == "verifier"
    assert _parse("{}").stages[1].best_of_n.n == [1, 2, 4, 8, 16]


@pytest.mark.parametrize(
    ("bon", "error"),
    [
        ("{n: [4, 2]}", "r.yaml:11: stages[1].best_of_n.n: list each N once, in increasing order"),
        ("{n: [1, 1]}", "r.yaml:11: stages[1].best_of_n.n: list each N once"),
        ("{n: [0, 2]}", "r.yaml:11: stages[1].best_of_n.n[0]: must be at least 1, got 0"),
        ("{n: []}", "r.yaml:11: stages[1].best_of_n.n: give at least one N"),
        ("{rank: verifer}", "r.yaml:11: stages[1].best_of_n.rank: "),
        ("{rank: reward_model}", "r.yaml:11: stages[1].best_of_n.reward_model: rank: reward_model needs a reward model"),
        ("{reward_model: rm}", "r.yaml:11: stages[1].best_of_n.reward_model: 'rm' is never used: rank is verifier"),
        ("{rank: reward_model, reward_model: pretrain}", "stages[1].best_of_n.reward_model: stage 'pretrain' is a pretrain stage, not a reward_model stage"),
        ("{rank: reward_model, reward_model: no/such/dir}", "stages[1].best_of_n.reward_model: 'no/such/dir' is neither an earlier reward_model stage [] nor a folder"),
        ("{nn: [1, 2]}", "r.yaml:11: stages[1].best_of_n.nn: unknown key 'nn'; did you mean 'n'?"),
    ],
)  # fmt: skip
def test_bad_values_are_located_errors(bon, error, tmp_path):
    with pytest.raises(RecipeError) as err:
        _parse(bon, tmp_path)
    assert error in str(err.value)
    if "verifer" in bon:
        assert "did you mean 'verifier'" in str(err.value)


def test_best_of_n_at_temperature_0_is_refused_at_its_key():
    with pytest.raises(RecipeError, match=r"r.yaml:11: stages\[1\].temperature: best_of_n needs sampling"):
        parse_recipe(RECIPE.replace("best_of_n: BON", "temperature: 0\n    best_of_n: {}"), "r.yaml")
    parse_recipe(RECIPE.replace("best_of_n: BON", "temperature: 0"), "r.yaml")  # without it, greedy k is fine


def test_a_reward_model_on_an_environment_task_is_refused_at_its_key(tmp_path):
    text = RECIPE.replace("arithmetic: {max_digits: 1}", "arithmetic: {max_digits: 1}\n  treasure_hunt: {}")
    text = text.replace("best_of_n: BON", f"best_of_n: {{rank: reward_model, reward_model: {tmp_path}}}")
    with pytest.raises(
        RecipeError, match=r"stages\[1\].best_of_n.rank: a reward model ranks single-turn .*'treasure_hunt'"
    ):
        parse_recipe(text, "r.yaml", tmp_path)
    # listing only the single-turn tasks is allowed
    parse_recipe(text.replace("n_problems: 4", "n_problems: 4\n    tasks: [arithmetic]"), "r.yaml", tmp_path)


DATA_RECIPE = """\
name: bon
model: {preset: tiny, seed: 0}
tasks:
  even:
    task: dataset
    data: rows.jsonl
    prompt: question
    rewards: [my_rewards:even]
    test_fraction: 0.5
stages:
  - kind: pretrain
    corpus: {tasks: [even], problems_per_task: 20}
    max_len: 32
    train: {max_steps: 2, batch_size: 4, warmup_steps: 0, progress: false}
  - kind: eval
    splits: [test]
    n_problems: 8
    k: 2
    max_new_tokens: 6
    best_of_n: BON
"""


def _data_project(folder: Path, bon: str) -> Path:
    folder.mkdir(exist_ok=True)
    rows = [{"question": f"say something about {i}", "answer": "x"} for i in range(40)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # about half of an untrained model's completions are right: best-of-N has room to help
    (folder / "my_rewards.py").write_text(
        "def even(completions, **kw):\n    return [float(len(c) % 2 == 0) for c in completions]\n"
    )
    recipe = folder / "r.yaml"
    recipe.write_text(DATA_RECIPE.replace("BON", bon))
    return recipe


def test_micro_eval_on_the_tiny_preset_best_of_4_beats_best_of_1(tmp_path, capsys):
    recipe = _data_project(tmp_path / "proj", "{n: [1, 2, 4]}")
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    b = json.loads((run / "02-eval" / "eval.json").read_text())["even"]["pretrain"]["test"]["best_of_n"]
    acc = [m["value"] for m in b["accuracy"]]
    assert b["rank"] == "verifier" and b["samples"] == 4
    assert acc[2] >= acc[1] >= acc[0] and acc[2] > acc[0]  # verifier-ranked: more samples, more right
    assert 0 < acc[0] < 1
    out = capsys.readouterr().out
    assert "best-of-N" in out and f"{bon_kl(4):.3f}" in out
    html = (run / "report.html").read_text()
    assert "even best-of-N accuracy vs N" in html and "analytic KL of best-of-N" in html
    assert (run / "plots" / "02-eval-even-best_of_n.png").exists()


def _save_rm(folder: Path, tokenizer, seed: int = 0) -> Path:
    config = preset_config("nano", tokenizer)
    config.num_labels = 1
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
        torch.nn.init.normal_(model.score.weight, std=1.0)  # scores that depend on the input
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_micro_eval_ranked_by_a_reward_model_folder(tmp_path, tokenizer):
    from temper.recipe import load_recipe
    from temper.runner import _stage_hash
    from temper.stages.context import StageContext

    project = tmp_path / "proj"
    project.mkdir()
    _save_rm(project / "rm", tokenizer)
    recipe = _data_project(project, "{n: [1, 4], rank: reward_model, reward_model: rm}")
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    b = json.loads((run / "02-eval" / "eval.json").read_text())["even"]["pretrain"]["test"]["best_of_n"]
    assert b["rank"] == "reward_model" and b["reward_model"] == str(project / "rm")
    assert b["verifier_ranked"][1]["value"] >= b["accuracy"][1]["value"]  # no ranker beats the verifier
    assert b["score"][1]["value"] >= b["score"][0]["value"]  # the proxy rises with N, by construction
    html = (run / "report.html").read_text()
    assert "verifier-ranked (pass@N)" in html
    # the stage hash covers the reward model's files: another reward model reruns the eval
    parsed = load_recipe(recipe)
    ctx = StageContext(run, project, {}, {})
    ctx.model_hashes["pretrain"] = "x"
    before = _stage_hash(parsed, 1, ctx)
    _save_rm(project / "rm", tokenizer, seed=1)
    assert _stage_hash(parsed, 1, ctx) != before


@pytest.mark.slow
def test_a_reward_model_stage_named_by_eval_and_sft(tmp_path):
    """pretrain -> reward_model (pairs labelled by the verifier) -> eval and sft ranking best-of-N
    by that stage's reward model, named by the stage."""
    project = tmp_path / "proj"
    recipe = _data_project(project, "{n: [1, 4], rank: reward_model, reward_model: rm}")
    text = recipe.read_text().replace(
        "  - kind: eval\n",
        "  - kind: reward_model\n"
        "    name: rm\n"
        "    data: {generate: {tasks: [even], prompts_per_task: 8, k: 4, max_new_tokens: 6}}\n"
        "    train: {max_steps: 2, batch_size: 4, warmup_steps: 0, progress: false}\n"
        "  - kind: sft\n"
        "    data:\n"
        "      best_of_n: {tasks: [even], n: 4, prompts_per_task: 6, max_new_tokens: 6, keep_truncated: true,\n"
        "                  rank: reward_model, reward_model: rm}\n"
        "      eval_problems: 0\n"
        "    train: {max_steps: 1, batch_size: 2, warmup_steps: 0, progress: false}\n"
        "  - kind: eval\n",
    )
    recipe.write_text(text)
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    rm_dir = str(run / "02-rm" / "reward_model")
    sft = json.loads((run / "03-sft" / "sft.json").read_text())["best_of_n"]["even"]
    assert sft["reward_model"] == rm_dir and sft["rows"] == 6  # every prompt has a usable answer
    by_model = json.loads((run / "04-eval" / "eval.json").read_text())["even"]
    assert set(by_model) == {"pretrain", "sft"}
    for r in by_model.values():
        b = r["test"]["best_of_n"]
        assert b["rank"] == "reward_model" and b["reward_model"] == rm_dir and b["n"] == [1, 4]
