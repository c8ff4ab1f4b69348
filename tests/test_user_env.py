"""A recipe names the user's environment factory (`task: dataset` + `env: module:function`)."""

from __future__ import annotations

import json

import pytest
from tests.test_agent_loop import Script

from temper.catalog import make_recipe_task
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.tasks.base import TaskOptionError

ENV_SOURCE = '''
from temper.envs.base import StepResult
from temper.tasks.base import Score


class Echo:
    """Asks for the row's word twice: the first answer is acknowledged, the second ends the
    episode; with `scored`, the env grades itself, else the task's reward functions do."""

    stop = ()

    def __init__(self, row):
        self.row, self.turn = row, 0

    def reset(self):
        return [{"role": "user", "content": "say " + self.row["word"]}] if self.row.get("own_prompt") else []

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return StepResult(messages=[{"role": "user", "content": "again"}], reward=0.5)
        if self.row.get("scored"):
            return StepResult(done=True, score=Score(0.25, False, True))
        return StepResult(done=True)


def make_env(row):
    return Echo(row)


def not_an_env(row):
    return 42
'''


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "envs.py").write_text(ENV_SOURCE)
    rows = [
        {"prompt": "word: cat", "answer": "cat", "word": "cat"},
        {"prompt": "word: dog", "answer": "dog", "word": "dog", "own_prompt": True, "scored": True},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def task(folder, **options):
    entry = {
        "task": "dataset",
        "data": "rows.jsonl",
        "env": "envs.py:make_env",
        "test_fraction": 0.5,
    } | options
    return make_recipe_task("echo", entry, base_dir=folder)


def test_episodes_of_the_users_env_graded_by_the_env_or_the_reward_functions(folder, tokenizer):
    t = task(folder)
    problems = t._splits["train"] + t._splits["test"]
    by_word = {p.data["row"]["word"]: p for p in problems}
    envs = [[t.make_env(by_word["cat"])], [t.make_env(by_word["dog"])]]
    script = Script(tokenizer, lambda text, j: "Answer: cat" if "cat" in text else "Answer: dog")
    [cat], [dog] = run_episodes(script, tokenizer, envs, [0, 1], EpisodeLimits(max_turns=t.max_turns))
    assert cat.messages[0] == {"role": "user", "content": "word: cat"}  # reset gave nothing: the row's prompt
    assert dog.messages[0] == {"role": "user", "content": "say dog"}  # reset's own messages
    assert cat.step_rewards == [0.5, 0.0] and cat.turns == 2
    assert cat.score.correct and cat.score.reward == 1.0  # exact_match on the last assistant turn
    assert dog.score.reward == 0.25 and not dog.score.correct  # the env's own grade wins


def test_the_factory_is_part_of_the_stage_hash(folder):
    before = task(folder).fingerprint()
    (folder / "envs.py").write_text(ENV_SOURCE + "\n# edited\n")
    assert task(folder).fingerprint() != before


def test_bad_factories_are_refused_naming_the_option(folder):
    with pytest.raises(
        TaskOptionError, match=r"env 'envs.py:missing': module 'envs.py' has no function 'missing'"
    ) as err:
        task(folder, env="envs.py:missing")
    assert err.value.option == ("env",)
    with pytest.raises(TaskOptionError, match="env 'nowhere.py:make_env': no file"):
        task(folder, env="nowhere.py:make_env")
    t = task(folder, env="envs.py:not_an_env")
    with pytest.raises(TypeError, match="returned int, not an Env"):
        t.make_env(t._splits["train"][0] if t._splits["train"] else t._splits["test"][0])
