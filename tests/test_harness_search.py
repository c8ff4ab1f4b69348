"""Harness optimisation: the harness file and its checks, the env it wraps, the knob search, the
search loop's folders and its best-on-held-out choice, the endpoint proposer against a fake
OpenAI-compatible server, and the stage end to end through `temper run`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from fakes import Script
from temper import guard
from temper.envs.base import StepResult
from temper.harness.env import HarnessEnv
from temper.harness.file import HarnessError, load_harness, with_settings
from temper.harness.proposers import EndpointProposer, KnobSearch, Tried, extract_python
from temper.harness.search import scores_of, search
from temper.rewards.judge import EndpointJudge
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.tasks.base import Score

ROOT = Path(__file__).resolve().parents[1]

HARNESS = '''\
"""A toy harness."""
import time

KNOBS = {"prefix": ["none", "hello"], "memory": ["off", "on"], "boot": ["off", "on"]}
SETTINGS = {"prefix": "hello", "memory": "on", "boot": "off"}


def system(settings):
    return "be brief" if settings["prefix"] == "hello" else ""


def bootstrap(env, settings):
    return f"[{env['task']} {env['split']} {env['max_turns']} turns]\\n" if settings["boot"] == "on" else ""


def build_prompt(observation, memory, first, settings):
    head = "hello " if first and settings["prefix"] == "hello" else ""
    state = f"moves: {memory['moves']}\\n" if settings["memory"] == "on" and memory.get("moves") else ""
    return head + state + observation


def update_memory(memory, action, observation, settings):
    return {"moves": memory.get("moves", "") + action}
'''


def _write(folder: Path, text: str, name: str = "h.py") -> Path:
    path = folder / name
    path.write_text(text)
    return path


class Walk:
    """Three moves, each answered with `at k`; the third wins. Step k's reward is k / 10."""

    stop = ()

    def __init__(self):
        self.k = 0

    def reset(self):
        return [{"role": "user", "content": "at 0"}]

    def step(self, action):
        self.k += 1
        if self.k == 3:
            return StepResult(done=True, reward=0.3, score=Score(1.0, True, True))
        return StepResult(messages=[{"role": "user", "content": f"at {self.k}"}], reward=self.k / 10)


INFO = {"task": "walk", "split": "train", "max_turns": 5}


def _play(harness, tokenizer, n=1):
    envs = [[HarnessEnv(Walk(), harness, INFO, f"p{i}")] for i in range(n)]
    sampler = Script(tokenizer, lambda prompt, j: "go")
    return [
        g[0]
        for g in run_episodes(sampler, tokenizer, envs, [0] * n, EpisodeLimits(max_turns=5), temperature=0.0)
    ]


# --- the harness file ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda t: t.replace("def system(settings):", "def system(settings)"), "h.py:8: does not parse"),
        (lambda t: t.replace("def update_memory", "def remember"), "h.py: defines no update_memory"),
        (
            lambda t: t.replace('"boot": "off"}', '"boot": "maybe"}'),
            "h.py:5: SETTINGS['boot'] = 'maybe' is not one of",
        ),
        (
            lambda t: t.replace('"boot": "off"}', '"boot": "off", "colour": "red"}'),
            "h.py:5: SETTINGS['colour'] is no knob",
        ),
        (lambda t: t.replace('"memory": "on", ', ""), "h.py:5: SETTINGS gives no value for ['memory']"),
        (lambda t: t.replace("SETTINGS = {", "OPTIONS = {"), "h.py: defines no SETTINGS"),
        (
            lambda t: t.replace("import time", "import time\nraise ValueError('no config')"),
            "raised: ValueError: no config (at h.py:3)",
        ),
    ],
    ids=[
        "syntax",
        "missing-function",
        "setting-outside-knob",
        "unknown-knob",
        "unset-knob",
        "no-settings",
        "import-raises",
    ],
)
def test_a_bad_harness_file_is_refused_in_one_line_naming_the_file(tmp_path, edit, said):
    path = _write(tmp_path, edit(HARNESS))
    with pytest.raises(HarnessError) as err:
        load_harness(path)
    line = str(err.value)
    assert "\n" not in line and str(path) in line or "h.py" in line
    assert said in line, line


def test_with_settings_rewrites_only_the_settings_line(tmp_path):
    base = load_harness(_write(tmp_path, HARNESS))
    source = with_settings(base.source, {"prefix": "none", "memory": "off", "boot": "on"})
    assert load_harness(_write(tmp_path, source, "h2.py")).settings == {
        "prefix": "none",
        "memory": "off",
        "boot": "on",
    }
    changed = [a for a, b in zip(base.source.splitlines(), source.splitlines(), strict=True) if a != b]
    assert changed == ['SETTINGS = {"prefix": "hello", "memory": "on", "boot": "off"}']


# --- the env through the harness ----------------------------------------------------------


def test_the_harness_changes_what_the_model_reads_and_nothing_it_is_graded_on(tmp_path, tokenizer):
    on = load_harness(
        _write(tmp_path, with_settings(HARNESS, {"prefix": "hello", "memory": "on", "boot": "on"}))
    )
    [t] = _play(on, tokenizer)
    text = [tokenizer.decode(s.token_ids, skip_special_tokens=False) for s in t.segments]
    assert "<|system|>be brief<|end|>" in text[0]
    assert "<|user|>[walk train 5 turns]\nhello at 0<|end|>" in text[0]
    env_turns = [x for s, x in zip(t.segments, text) if not s.trainable][1:]
    assert "<|user|>moves: go\nat 1<|end|>" in env_turns[0]
    assert "moves: gogo\nat 2" in env_turns[1]
    off = load_harness(
        _write(tmp_path, with_settings(HARNESS, {"prefix": "none", "memory": "off", "boot": "off"}), "off.py")
    )
    [u] = _play(off, tokenizer)
    assert (
        tokenizer.decode(u.segments[0].token_ids, skip_special_tokens=False)
        == "<|user|>at 0<|end|><|assistant|>"
    )
    # the rewards, the outcome and the stop are the env's, whatever the harness shows
    assert t.step_rewards == u.step_rewards == [0.1, 0.2, 0.3]
    assert t.score == u.score == Score(1.0, True, True)


def test_harness_code_that_raises_or_hangs_ends_its_episode_with_a_line_naming_the_harness(
    tmp_path, tokenizer
):
    broken = HARNESS.replace('    head = "hello "', '    head = 1 / 0 if not first else "hello "')
    [t] = _play(load_harness(_write(tmp_path, broken)), tokenizer)
    assert t.stop_reason == "env_error"
    assert t.error.startswith(
        "harness h.py:build_prompt raised on problem p0: ZeroDivisionError: division by zero (at h.py:"
    )
    hangs = HARNESS.replace('    return {"moves"', '    time.sleep(3)\n    return {"moves"')
    with guard.time_limit(0.2):
        [t] = _play(load_harness(_write(tmp_path, hangs, "slow.py")), tokenizer)
    assert t.stop_reason == "env_error"
    assert t.error == "harness slow.py:update_memory did not return within 0.2 s on problem p0"
    wrong = HARNESS.replace("    return head + state + observation", "    return 7")
    [t] = _play(load_harness(_write(tmp_path, wrong, "wrong.py")), tokenizer)
    assert t.error == "harness wrong.py:build_prompt returned int, not a str on problem p0"


# --- the knob search and the loop ---------------------------------------------------------

WEIGHTS = {("prefix", "none"): 0.5, ("memory", "off"): 0.3, ("boot", "on"): 0.1}


def _traces(accuracy: float, n: int = 20) -> list[dict]:
    wins = round(accuracy * n)
    return [
        {"problem": f"p{i}", "correct": i < wins, "reward": float(i < wins), "stop_reason": "done", "turns": 1,
         "error": "", "episode": [{"by": "prompt", "text": "x"}]}
        for i in range(n)
    ]  # fmt: skip


def _by_weights(weights):
    def play(harness):
        traces = _traces(sum(weights.get(kv, 0.0) for kv in harness.settings.items()))
        return scores_of(traces), traces

    return play


def test_the_knob_search_climbs_one_knob_at_a_time_to_the_optimum_and_stops(tmp_path):
    base = load_harness(_write(tmp_path, HARNESS))
    summary = search(base, KnobSearch(max_candidates=20, rounds=10), _by_weights(WEIGHTS), _by_weights(WEIGHTS),
                     _by_weights(WEIGHTS), tmp_path / "out")  # fmt: skip
    settings = [c["settings"] for c in summary["candidates"]]
    assert len(settings) == len({json.dumps(s, sort_keys=True) for s in settings})  # nothing played twice
    assert summary["best_settings"] == {"prefix": "none", "memory": "off", "boot": "on"}
    # the default; round 1: its 3 one-knob changes; round 2: the 2 untried neighbours of the best,
    # round 3: 1 (reaching the optimum), round 4: 1 (the optimum's last untried neighbour, worse),
    # and round 5 is not asked for, since round 4 improved nothing
    assert [len(settings)] == [1 + 3 + 2 + 1 + 1]
    few = search(base, KnobSearch(max_candidates=2), _by_weights(WEIGHTS), _by_weights(WEIGHTS), _by_weights(WEIGHTS),
                 tmp_path / "few")  # fmt: skip
    assert len(few["candidates"]) == 3  # the default + the budget


def test_a_round_that_improves_nothing_ends_the_knob_search(tmp_path):
    base = load_harness(_write(tmp_path, HARNESS))
    summary = search(
        base, KnobSearch(max_candidates=20), _by_weights({}), _by_weights({}), _by_weights({}), tmp_path / "o"
    )
    assert len(summary["candidates"]) == 4  # the default and its 3 neighbours, all tied: stop
    assert summary["best"] == "00-default"  # ties go to the earlier, the default first


class Listed:
    """A proposer handing out fixed sources once."""

    def __init__(self, sources):
        self.sources = sources

    def propose(self, base, tried):
        out, self.sources = self.sources, []
        return out


def test_the_search_keeps_the_best_on_held_out_and_writes_a_folder_per_candidate(tmp_path):
    base = load_harness(_write(tmp_path, HARNESS))
    a = with_settings(HARNESS, {"prefix": "none", "memory": "on", "boot": "off"})  # best on train
    b = with_settings(HARNESS, {"prefix": "hello", "memory": "off", "boot": "off"})  # best held out
    broken = HARNESS.replace("def update_memory", "def forget")
    train = {("prefix", "none"): 0.6, ("memory", "off"): 0.4}
    held = {("prefix", "none"): 0.3, ("memory", "off"): 0.5}
    out = tmp_path / "out"
    summary = search(base, Listed([a, broken, b]), _by_weights(train), _by_weights(held), _by_weights(held), out,
                     select_top=2)  # fmt: skip
    folders = sorted(p.name for p in (out / "candidates").iterdir())
    assert folders == ["00-default", "01-prefix=none", "02-refused", "03-memory=off"]
    for name in ("00-default", "01-prefix=none", "03-memory=off"):
        got = {p.name for p in (out / "candidates" / name).iterdir()}
        assert {"harness.py", "train.json", "traces.jsonl", "held_out.json", "held_out_traces.jsonl"} == got
        rows = (out / "candidates" / name / "traces.jsonl").read_text().splitlines()
        assert len(rows) == 20 and json.loads(rows[0])["episode"]
    refused = out / "candidates" / "02-refused"
    assert {p.name for p in refused.iterdir()} == {"harness.py", "error.txt"}
    assert "defines no update_memory" in (refused / "error.txt").read_text()
    assert (out / "candidates" / "03-memory=off" / "harness.py").read_text() == b
    # train ranks a (0.6) over b (0.4); held out, b (0.5) beats a (0.3) and the default (0.0)
    assert summary["best"] == "03-memory=off"
    assert (out / "best" / "harness.py").read_text() == b
    assert summary["final"]["best"]["accuracy"]["value"] == 0.5
    assert summary["final"]["default"]["accuracy"]["value"] == 0.0
    assert json.loads((out / "harness_search.json").read_text())["best"] == "03-memory=off"


def test_the_default_is_always_compared_held_out(tmp_path):
    base = load_harness(_write(tmp_path, HARNESS))
    a = with_settings(HARNESS, {"prefix": "none", "memory": "on", "boot": "off"})
    train = {("prefix", "none"): 0.6}
    held = {("prefix", "hello"): 0.7}  # the default is best held out, though last on train
    summary = search(base, Listed([a]), _by_weights(train), _by_weights(held), _by_weights(held), tmp_path / "o",
                     select_top=1)  # fmt: skip
    assert [c["folder"] for c in summary["candidates"] if c["held_out"]] == ["00-default", "01-prefix=none"]
    assert summary["best"] == "00-default"


# --- the endpoint proposer ----------------------------------------------------------------


class _Fake(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that answers with `reply` and keeps the requests."""

    reply = ""
    seen: list[dict] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": self.reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    httpd = HTTPServer(("127.0.0.1", 0), _Fake)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Fake.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_the_endpoint_proposer_sends_code_scores_and_failures_and_reads_back_a_file(tmp_path, endpoint):
    base = load_harness(_write(tmp_path, HARNESS))
    new = with_settings(HARNESS, {"prefix": "none", "memory": "off", "boot": "on"})
    _Fake.reply = f"Here is a better one.\n```python\n{new}```\nGood luck."
    folder = tmp_path / "c0"
    folder.mkdir()
    (folder / "traces.jsonl").write_text(json.dumps(_traces(0.0, 1)[0] | {"problem": "map7"}) + "\n")
    proposer = EndpointProposer(EndpointJudge(endpoint, "big-model", max_tokens=4096), rounds=1, per_round=2)
    tried = [Tried("00-default", base.source, base.settings, 0.25, folder)]
    assert proposer.propose(base, tried) == [new, new]
    assert proposer.propose(base, tried) == []  # one round
    prompt = _Fake.seen[0]["messages"][0]["content"]
    assert "- 00-default: 0.250" in prompt and base.source in prompt and "problem map7 (done)" in prompt
    assert _Fake.seen[0]["model"] == "big-model"
    _Fake.reply = "I would rather not."
    again = EndpointProposer(EndpointJudge(endpoint, "big-model"), rounds=1, per_round=1)
    assert again.propose(base, tried) == [] and again.skipped == ["I would rather not."]


def test_extract_python_takes_the_first_block():
    assert extract_python("a\n```python\nx = 1\n```\n```python\ny = 2\n```") == "x = 1\n"
    assert extract_python("```\nz = 3\n```") == "z = 3\n"
    assert extract_python("no code") is None


# --- the stage ----------------------------------------------------------------------------

RECIPE = """\
name: hs
model: {{path: {model}}}
tasks:
  treasure_hunt: {{size: 4, train_maps: 8, instructions: false}}
stages:
  - kind: harness_search
    task: treasure_hunt
    harness: {harness}
    proposer: {{kind: knobs, max_candidates: 2}}
    train_problems: 2
    held_out: {{split: test, select_problems: 2, final_problems: 2}}
    select_top: 1
"""


def test_the_stage_runs_through_temper_run_and_its_report_lists_the_candidates(tmp_path):
    from temper.cli import main

    harness = tmp_path / "h.py"
    harness.write_text((ROOT / "recipes" / "harnesses" / "treasure_hunt.py").read_text())
    recipe = tmp_path / "hs.yaml"
    recipe.write_text(RECIPE.format(model=ROOT / "tests" / "pinned" / "start", harness=harness))
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "run")]) == 0
    out = tmp_path / "run" / "01-harness_search"
    summary = json.loads((out / "harness_search.json").read_text())
    assert [c["folder"] for c in summary["candidates"]][0] == "00-default" and len(summary["candidates"]) == 3
    trace = json.loads((out / "candidates" / "00-default" / "traces.jsonl").read_text().splitlines()[0])
    assert trace["episode"][0]["by"] == "prompt" and "You are an explorer" in trace["episode"][0]["text"]
    html = (tmp_path / "run" / "report.html").read_text()
    assert "candidate harnesses" in html and "00-default" in html
    # editing the harness file reruns the stage (its bytes are in the stage hash)
    mtime = (out / "harness_search.json").stat().st_mtime
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "run")]) == 0
    assert (out / "harness_search.json").stat().st_mtime == mtime
    edited = load_harness(harness).settings | {"bootstrap": "map"}
    harness.write_text(with_settings(harness.read_text(), edited))
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "run")]) == 0
    assert (
        json.loads((out / "harness_search.json").read_text())["candidates"][0]["settings"]["bootstrap"]
        == "map"
    )


@pytest.mark.parametrize(
    "edit, line, key, said",
    [
        ("    harness: nowhere.py", 8, "stages[0].harness", "no such file"),
        ("    proposer: {kind: magic}", 9, "stages[0].proposer", "kind"),
        ("    train_problems: 0", 10, "stages[0].train_problems", "greater than 0"),
    ],
    ids=["missing-harness", "unknown-proposer", "no-problems"],
)
def test_a_bad_stage_is_refused_at_its_line_and_key(tmp_path, capsys, edit, line, key, said):
    from temper.cli import main

    text = RECIPE.format(
        model=ROOT / "tests" / "pinned" / "start", harness=ROOT / "recipes" / "harnesses" / "treasure_hunt.py"
    )
    lines = text.splitlines()
    lines[line - 1] = edit
    recipe = tmp_path / "hs.yaml"
    recipe.write_text("\n".join(lines) + "\n")
    assert main(["run", str(recipe), "--dry-run", "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    located = [r.strip() for r in err.splitlines() if r.strip().startswith(f"{recipe}:{line}: {key}")]
    assert located and any(said in r for r in located), err


def test_an_unreachable_proposer_endpoint_stops_the_search_in_one_line_naming_it(tmp_path):
    import socket

    from temper.rewards.judge import JudgeUnreachable
    from temper.stages.harness_search import HarnessSearchStage, make_proposer

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    spec = HarnessSearchStage.model_validate(
        {"kind": "harness_search", "task": "t", "harness": "h.py",
         "proposer": {"kind": "openai", "url": url, "model": "m", "retries": 0, "timeout": 2}}
    )  # fmt: skip
    base = load_harness(_write(tmp_path, HARNESS))
    tried = [Tried("00-default", base.source, base.settings, 0.0, tmp_path)]
    with pytest.raises(JudgeUnreachable) as err:
        make_proposer(spec).propose(base, tried)
    assert str(err.value).startswith(f"proposer endpoint {url}/chat/completions unreachable after 1 attempts")
    assert isinstance(
        make_proposer(HarnessSearchStage(kind="harness_search", task="t", harness="h.py")), KnobSearch
    )


def test_the_shipped_recipes_search_runs_shrunk_from_the_pinned_start_with_its_bootstrap_knob(tmp_path):
    """recipes/harness_search_treasure_hunt.yaml's harness_search stage, its budgets cut, on the
    tests' pinned start model: the first round (one knob changed each) includes the environment
    bootstrap, whose line opens that candidate's first prompt."""
    import yaml

    from temper.cli import main

    shipped = yaml.safe_load((ROOT / "recipes" / "harness_search_treasure_hunt.yaml").read_text())
    [stage] = [s for s in shipped["stages"] if s["kind"] == "harness_search"]
    stage |= {
        "harness": str(ROOT / "recipes" / stage["harness"]),
        "proposer": stage["proposer"] | {"max_candidates": 7},
        "train_problems": 2,
        "held_out": stage["held_out"] | {"select_problems": 2, "final_problems": 2},
        "select_top": 1,
    }
    recipe = {
        "name": "shipped",
        "model": {"path": str(ROOT / "tests" / "pinned" / "start")},
        "tasks": {"treasure_hunt": shipped["tasks"]["treasure_hunt"]},
        "stages": [stage],
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["run", str(path), "--output-dir", str(tmp_path / "run")]) == 0
    root = tmp_path / "run" / "01-harness_search" / "candidates"
    assert sorted(p.name for p in root.iterdir())[-1] == "07-bootstrap=map"
    first = json.loads((root / "07-bootstrap=map" / "traces.jsonl").read_text().splitlines()[0])
    assert first["episode"][0]["text"].startswith("<|system|>You are an explorer")
    assert "<|user|>4x4 map, 10 moves.\nFind $." in first["episode"][0]["text"]
    default = json.loads((root / "00-default" / "traces.jsonl").read_text().splitlines()[0])
    assert "moves." not in default["episode"][0]["text"]


def test_the_stage_with_an_endpoint_proposer_plays_what_the_endpoint_wrote(tmp_path, endpoint):
    from temper.cli import main

    harness = ROOT / "recipes" / "harnesses" / "treasure_hunt.py"
    base = load_harness(harness)
    written = with_settings(base.source, base.settings | {"system": "none", "memory": "none"})
    _Fake.reply = f"```python\n{written}```"
    text = RECIPE.format(model=ROOT / "tests" / "pinned" / "start", harness=harness).replace(
        "proposer: {kind: knobs, max_candidates: 2}",
        f"proposer: {{kind: openai, url: '{endpoint}', model: strong, rounds: 1, per_round: 1}}",
    )
    recipe = tmp_path / "hs.yaml"
    recipe.write_text(text)
    assert main(["run", str(recipe), "--output-dir", str(tmp_path / "run")]) == 0
    out = tmp_path / "run" / "01-harness_search"
    summary = json.loads((out / "harness_search.json").read_text())
    assert [c["folder"] for c in summary["candidates"]] == ["00-default", "01-system=none,memory=none"]
    assert (out / "candidates" / "01-system=none,memory=none" / "harness.py").read_text() == written
    assert len(_Fake.seen) == 1 and _Fake.seen[0]["model"] == "strong"
    assert "00-default:" in _Fake.seen[0]["messages"][0]["content"]


PROPOSER = """\
from temper.harness.file import with_settings


class OneShot:
    def __init__(self, value):
        self.value, self.done = value, False

    def propose(self, base, tried):
        if self.value == "boom":
            raise RuntimeError("no ideas")
        if self.done:
            return []
        self.done = True
        return [with_settings(base.source, base.settings | {"bootstrap": self.value})]


def make(value):
    return OneShot(value)
"""


def test_a_users_proposer_plugs_in_by_function_and_its_failure_is_one_line_naming_it(tmp_path, capsys):
    from temper.cli import main

    (tmp_path / "prop.py").write_text(PROPOSER)
    harness = ROOT / "recipes" / "harnesses" / "treasure_hunt.py"
    recipe = tmp_path / "hs.yaml"
    for value in ("map", "boom"):
        recipe.write_text(
            RECIPE.format(model=ROOT / "tests" / "pinned" / "start", harness=harness).replace(
                "proposer: {kind: knobs, max_candidates: 2}",
                f"proposer: {{kind: python, function: 'prop.py:make', options: {{value: {value}}}}}",
            )
        )
        code = main(["run", str(recipe), "--output-dir", str(tmp_path / value)])
        if value == "map":
            assert code == 0
            summary = json.loads((tmp_path / value / "01-harness_search" / "harness_search.json").read_text())
            assert [c["folder"] for c in summary["candidates"]] == ["00-default", "01-bootstrap=map"]
    assert code != 0
    err = capsys.readouterr().err
    assert "proposer prop.py:make.propose raised: RuntimeError: no ideas (at prop.py:10)" in " ".join(
        err.split()
    )
