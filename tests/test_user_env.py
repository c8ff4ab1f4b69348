"""A recipe names the user's environment factory (`task: dataset` + `env: module:function`)."""

from __future__ import annotations

import json
import time

import pytest

from fakes import Script
from temper.catalog import make_recipe_task
from temper.models import build_preset, save_model
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
    (folder / "broken.py").write_text("import json\nraise ImportError('no such backend')\n")
    with pytest.raises(TaskOptionError) as err:  # an env module is named as one, with the file's line
        task(folder, env="broken.py:make_env")
    assert str(err.value) == (
        f"task 'echo': env module {str((folder / 'broken.py').resolve())!r} raised on import: "
        "ImportError: no such backend (at broken.py:2)"
    )


FAILING = """
import math, os, time
from temper.envs.base import StepResult

RELEASE = os.environ["TEMPER_TEST_RELEASE"]


def hang():
    while not os.path.exists(RELEASE):
        time.sleep(0.01)


class Env:
    stop = ()

    def __init__(self, row):
        self.how = row["how"]

    def reset(self):
        if self.how == "reset raises":
            raise KeyError("no map")
        if self.how == "reset hangs":
            hang()
        if self.how == "reset returns text":
            return "hello"
        return None

    def step(self, action):
        if self.how == "step raises":
            raise ValueError("the backend died")
        if self.how == "step hangs":
            hang()
        if self.how == "step returns a dict":
            return {"done": True}
        if self.how == "step reward inf":
            return StepResult(done=True, reward=math.inf)
        if self.how == "step messages bad":
            return StepResult(messages=[{"role": "user", "content": 3}])
        return StepResult(done=True)

    def close(self):
        if self.how == "close raises":
            raise OSError("workspace busy")


def make_env(row):
    if row["how"] == "factory raises":
        raise RuntimeError("no server")
    if row["how"] == "factory hangs":
        hang()
    if row["how"] == "factory returns int":
        return 42
    return Env(row)
"""

CASES = {  # how the user's code fails -> (stop reason, the line the episode's error holds)
    "factory raises": ("env_error", "env factory fail.py:make_env raised on problem {id}: RuntimeError: no server (at fail.py:{line})"),
    "factory hangs": ("timeout", "env factory fail.py:make_env on problem {id} did not return within 0.3 s"),
    "factory returns int": ("env_error", "env factory fail.py:make_env returned int, not an Env (an object with reset() -> messages and step(action) -> StepResult) on problem {id}"),
    "reset raises": ("env_error", "env Env (env fail.py:make_env).reset raised on problem {id}: KeyError: 'no map' (at fail.py:{line})"),
    "reset hangs": ("timeout", "env Env (env fail.py:make_env).reset on problem {id} did not return within 0.3 s"),
    "reset returns text": ("env_error", "env Env (env fail.py:make_env).reset returned str, not a list of {{role, content}} messages (or None) on problem {id}"),
    "step raises": ("env_error", "env Env (env fail.py:make_env).step raised on problem {id}: ValueError: the backend died (at fail.py:{line})"),
    "step hangs": ("timeout", "env Env (env fail.py:make_env).step on problem {id} did not return within 0.3 s (step_timeout)"),
    "step returns a dict": ("env_error", "env Env (env fail.py:make_env).step returned dict, not a StepResult on problem {id}"),
    "step reward inf": ("env_error", "env Env (env fail.py:make_env).step on problem {id} returned a non-finite reward (inf)"),
    "step messages bad": ("env_error", "env Env (env fail.py:make_env).step returned StepResult.messages that are not {{role, content}} messages on problem {id}"),
    "close raises": ("env_error", "env Env (env fail.py:make_env).close raised on problem {id}: OSError: workspace busy (at fail.py:{line})"),
}  # fmt: skip


@pytest.fixture
def released(tmp_path, monkeypatch):
    """A file whose existence ends the hung calls of the user's code; made when the test ends,
    after which no thread of user code may be left."""
    from temper import guard

    release = tmp_path / "release"
    monkeypatch.setenv("TEMPER_TEST_RELEASE", str(release))
    yield
    release.touch()
    for t in guard.user_threads():
        t.join(10)
    assert guard.user_threads() == []


def test_every_failure_of_the_users_env_ends_its_episode_with_one_line_never_the_batch(
    tmp_path, tokenizer, released
):
    """Each way the factory or the env fails ends that episode (env_error, or timeout for a hang),
    with one line naming the factory, the env's class and method, the problem and the error (its
    line in the user's file), while the sound episode beside it finishes."""
    from temper import guard

    (tmp_path / "fail.py").write_text(FAILING)
    rows = [{"prompt": f"case {i}", "answer": "x", "how": how} for i, how in enumerate(["fine", *CASES])]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"task": "dataset", "data": "rows.jsonl", "env": "fail.py:make_env", "split_column": None}
    t = make_recipe_task("fail", entry | {"test_fraction": 0.01}, base_dir=tmp_path)
    problems = {p.data["row"]["how"]: p for split in ("train", "test") for p in t._splits[split]}
    envs = [[t.make_env(problems[how])] for how in ["fine", *CASES]]
    lines = FAILING.splitlines()
    where = {
        "factory raises": "no server", "reset raises": "no map", "step raises": "the backend died",
        "close raises": "workspace busy",
    }  # fmt: skip
    script = Script(tokenizer, lambda text, j: "Answer: x")
    started = time.monotonic()
    with guard.time_limit(0.3):
        out = run_episodes(script, tokenizer, envs, list(range(len(envs))), EpisodeLimits(step_timeout=0.3))
    # the hung calls (until released, i.e. forever) were not waited for, each limit 0.3 s: the bound
    # only tells waiting from not waiting, generous so that a busy machine passes it
    assert time.monotonic() - started < 60
    [fine], *failed = out
    assert fine.stop_reason == "done" and fine.score.correct
    for how, [episode] in zip(CASES, failed, strict=True):
        reason, said = CASES[how]
        at = next((i + 1 for i, x in enumerate(lines) if where.get(how, "@@") in x), 0)
        assert (episode.stop_reason, episode.error) == (reason, said.format(id=problems[how].id, line=at)), (
            how
        )


def test_a_trl_environment_class_behind_a_factory_shows_its_tools_in_the_prompt(tmp_path, tokenizer):
    """`env:` naming a factory that wraps a TRL environment_factory class: its public methods
    reach the prompt as tool schemas, a call is answered by the tool, the answer graded."""
    (tmp_path / "vault.py").write_text(
        """
from temper.envs.adapters.trl_factory import TRLEnvironment


class Vault:
    def reset(self, **row):
        self.secret = row["secret"]

    def guess(self, number: int) -> str:
        \"\"\"Guess the code.

        Args:
            number: the code to try
        \"\"\"
        return "open" if number == self.secret else "no"


def opened(completions, secret, **kw):
    return [float(str(s) in c[-1]["content"]) for c, s in zip(completions, secret)]


def make_env(row):
    return TRLEnvironment(Vault, row, reward_funcs=[opened])
"""
    )
    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": "Open the vault.", "secret": 7}) + "\n")
    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "m")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"name: v\nmodel: {{path: {tmp_path / 'm'}}}\ntasks:\n  vault:\n    task: dataset\n    data: rows.jsonl\n"
        "    env: vault.py:make_env\n    rewards: [vault.py:opened]\n    test_fraction: 0.01\n"
        "stages:\n  - kind: rl\n    tasks: [vault]\n"
    )
    from temper.recipe import load_recipe

    loaded = load_recipe(recipe)
    t = make_recipe_task("vault", loaded.tasks["vault"], base_dir=tmp_path)
    call = '<tool_call>{"name": "guess", "arguments": {"number": 7}}</tool_call>'
    script = Script(tokenizer, lambda text, j: "The code is 7." if "<|tool|>" in text else call)
    [[episode]] = run_episodes(
        script, tokenizer, [[t.make_env(t.sample("train", 1, 0)[0])]], [0], EpisodeLimits(max_new_tokens=96)
    )
    prompt = tokenizer.decode(episode.prompt_ids)
    assert '"name": "guess"' in prompt and "the code to try" in prompt  # the schema reached the prompt
    assert episode.stop_reason == "done" and episode.turns == 2 and episode.score.correct
    assert episode.messages[2] == {"role": "tool", "name": "guess", "content": "open"}
