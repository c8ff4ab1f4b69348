"""simulated_search: the ZeroSearch-style environment whose documents a second LM writes. The
simulator's text only ever enters as environment tokens, its weights never change in RL, the noise
knob picks the true fact or the distractor, and the curriculum's values are exact by step."""

from __future__ import annotations

import re

import pytest
import torch

from temper.catalog import make_task
from temper.envs.simulated_search import (
    NoiseCurriculum,
    SimulatedSearchConfig,
    SimulatedSearchTask,
    Simulator,
    document,
    load_simulator,
    parse_action,
    register_simulator,
    simulator_prompt,
    world,
)
from temper.models import build_preset
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import Sample
from temper.train.rl import RLConfig, problems_for_step, train_rl


class PerfectSimulator:
    """A simulator double that writes exactly the document of the fact in its prompt (what the
    fine-tuned simulator is trained to write), so the env's logic is tested apart from an LM."""

    def __init__(self):
        self.calls, self.prompts = 0, []

    def write(self, prompts, seeds, *, max_new_tokens, temperature):
        self.calls += 1
        self.prompts += list(prompts)
        return [re.search(r"fact: (.*)$", p).group(1) for p in prompts]


class Scripted:
    """A policy `Sampler` without a model: `reply(conversation_text, j)` is sample j's text."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply = tokenizer, reply

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop=(), seed=0):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            row = []
            for j in range(n):
                reply = self.reply(text, j)
                ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                row.append(Sample(list(prompt), ids, [-0.5] * len(ids), reply, "eos"))
            out.append(row)
        return out

    def sync(self, model):
        pass


def asked(text: str) -> str:
    """The country the conversation's question asks about."""
    return re.search(r"capital of (\w+)\?", text).group(1)


def search_then_answer(text: str, j: int) -> str:
    """Search the country asked about; answer with the capital the last document names."""
    docs = re.findall(r"doc: The capital of (\w+) is (\w+)\.", text)
    if not docs:
        return "search: " + asked(text)
    return f"answer: {docs[-1][1]}"


def task_with(simulator: str, **options) -> SimulatedSearchTask:
    return make_task("simulated_search", simulator=simulator, **options)


@pytest.fixture
def perfect():
    sim = PerfectSimulator()
    register_simulator("test-perfect", sim)
    return sim


def checksum(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def test_worlds_are_seeded_distinct_names_and_ood_names_are_longer():
    a, b = world(7, 2), world(7, 2)
    assert a == b and len(set(a.values())) == 4
    assert world(8, 2) != a
    task = task_with("test-perfect")
    train = task.sample("train", 5, seed=3)
    assert [p.id for p in train] == [p.id for p in task.sample("train", 5, seed=3)]
    assert train[0].prompt == f"capital of {train[0].data['country']}?"
    ood = task.sample("ood", 20, seed=0)
    test = task.sample("test", 20, seed=0)
    mean = lambda ps: sum(len(p.data["country"]) for p in ps) / len(ps)  # noqa: E731
    assert mean(ood) == mean(test) + 2  # one more consonant-vowel syllable
    assert not {p.id for p in test} & {p.id for p in ood}


def test_curriculum_values_are_exact_by_step():
    linear = NoiseCurriculum(0.1, 0.5, 4, "linear")
    assert [linear.at(s) for s in (0, 1, 2, 4, 9)] == pytest.approx([0.1, 0.2, 0.3, 0.5, 0.5])
    exp = NoiseCurriculum(0.0, 0.6, 2, "exponential", base=4.0)
    # ZeroSearch: p_i = p_s + (b^(i/m) - 1) / (b - 1) * (p_e - p_s)
    assert [exp.at(s) for s in (0, 1, 2, 3)] == pytest.approx([0.0, 0.6 * (2 - 1) / 3, 0.6, 0.6])
    assert NoiseCurriculum(0.25, 0.9, 10, "constant").at(7) == 0.25
    with pytest.raises(ValueError, match="needs noise_steps"):
        NoiseCurriculum(0.0, 1.0, 0, "linear")
    with pytest.raises(ValueError, match="probabilities"):
        NoiseCurriculum(0.0, 1.5, 3, "linear")
    with pytest.raises(ValueError, match="unknown noise schedule"):
        task_with("test-perfect", noise_schedule="cosine", noise_steps=3)


def test_the_rl_loop_draws_training_problems_at_the_curriculum_level_of_their_step():
    task = task_with("test-perfect", noise_start=0.0, noise_end=0.8, noise_steps=4, noise_schedule="linear")
    for step, p in [(0, 0.0), (1, 0.2), (3, 0.6), (6, 0.8)]:
        drawn = problems_for_step([task], 3, seed=0, step=step)
        assert [prob.data["noise"] for _, prob in drawn] == pytest.approx([p] * 3)
    # problems drawn without a step (eval, the gate, SFT) are at the fixed `noise`
    assert {p.data["noise"] for p in task_with("test-perfect", noise=0.3).sample("test", 4, 0)} == {0.3}


def play(task, problems, tokenizer, n=1, reply=search_then_answer):
    envs = [[task.make_env(p) for _ in range(n)] for p in problems]
    return run_episodes(
        Scripted(tokenizer, reply), tokenizer, envs, list(range(len(problems))), EpisodeLimits(4, 0, 48)
    )


def test_noise_0_documents_hold_the_fact_and_a_scripted_search_then_answer_scores_1(tokenizer, perfect):
    task = task_with("test-perfect", noise=0.0)
    problems = task.sample("test", 6, seed=0)
    episodes = play(task, problems, tokenizer, n=2)
    for p, group in zip(problems, episodes, strict=True):
        for t in group:
            assert t.score.correct and t.score.reward == 1.0 and t.stop_reason == "done"
            doc = t.messages[2]["content"]
            assert doc == f"doc: {document(p.data['country'], p.data['capital'])}"
            assert t.signals[0] == {"search": 1, "noisy": 0, "off_topic": 0, "doc_has_answer": 1}
    assert perfect.calls == 1  # one batched simulator call for the round's 12 searches (6 groups)
    assert all(pr.startswith("Write a useful doc") for pr in perfect.prompts)


def test_noise_1_documents_hold_the_distractor_and_the_reader_is_wrong(tokenizer, perfect):
    task = task_with("test-perfect", noise=1.0)
    problems = task.sample("test", 4, seed=0)
    for p, group in zip(problems, play(task, problems, tokenizer), strict=True):
        t = group[0]
        d = p.data
        assert t.messages[2]["content"] == f"doc: {document(d['other_country'], d['other_capital'])}"
        assert d["capital"] not in t.messages[2]["content"]
        assert t.signals[0]["noisy"] == 1 and t.signals[0]["doc_has_answer"] == 0
        assert not t.score.correct and t.score.details["reason"] == "wrong_answer"
    assert all(pr.startswith("Write a noisy doc") for pr in perfect.prompts)


def test_an_off_topic_query_gets_the_distractor_and_a_second_search_can_recover(tokenizer, perfect):
    task = task_with("test-perfect", noise=0.0, max_searches=2)
    p = task.sample("test", 1, seed=0)[0]

    def reply(text, j):
        n = text.count("doc:")
        if n == 0:
            return "search: weather today"
        return f"search: {p.data['country']}" if n == 1 else search_then_answer(text, j)

    t = play(task, [p], tokenizer, reply=reply)[0][0]
    assert [s.get("off_topic") for s in t.signals[:2]] == [1, 0]
    assert t.score.correct and t.score.details["searches"] == 2


def test_each_episode_draws_its_own_noise_reproducibly(tokenizer, perfect):
    task = task_with("test-perfect", noise=0.5)
    problems = task.sample("test", 4, seed=1)
    first = [[t.signals[0]["noisy"] for t in g] for g in play(task, problems, tokenizer, n=8)]
    redrawn = task.sample("test", 4, seed=1)  # a rerun: the same draw, new objects, ordinals from 0
    assert [[t.signals[0]["noisy"] for t in g] for g in play(task, redrawn, tokenizer, n=8)] == first
    # the same problem objects played again (evaluate's sampled episodes after its greedy ones)
    # continue the ordinals: other draws
    assert [[t.signals[0]["noisy"] for t in g] for g in play(task, problems, tokenizer, n=8)] != first
    flat = [x for g in first for x in g]
    assert 0 < sum(flat) < len(flat) and any(0 < sum(g) < len(g) for g in first)


def test_actions_are_parsed_and_an_unanswered_episode_is_graded_wrong(tokenizer, perfect):
    assert parse_action("Search: a b\nmore") == ("search", "a b")
    assert parse_action("hmm\nanswer: Tavor.") == ("answer", "Tavor.")
    assert parse_action("nothing") == ("invalid", "nothing")
    task = task_with("test-perfect", max_searches=1)
    p = task.sample("test", 1, seed=0)[0]
    t = play(task, [p], tokenizer, reply=lambda text, j: "hello")[0][0]
    assert t.turns == 2 and t.signals[0] == {"invalid": 1}
    assert t.score.details["reason"] == "no_answer" and t.score.reward == 0.0
    demo = task_with("test-perfect", demo_noise=1.0, max_searches=2).demonstration_messages(p)
    assert [m["role"] for m in demo] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert (
        demo[-1]["content"] == f"answer: {p.data['capital']}"
        and p.data["other_capital"] in demo[2]["content"]
    )


def test_simulator_text_is_only_environment_tokens_and_its_weights_stay_frozen(tokenizer):
    """A real (untrained) LM as simulator: whatever it writes enters as environment tokens only,
    with no logprobs, and sampling it changes nothing in it."""
    task = task_with("nano", simulator_seed=3, doc_tokens=12)
    sim = task.simulator
    assert sim is load_simulator("nano", 3)  # loaded once, shared by every env
    assert not sim.model.training and not any(p.requires_grad for p in sim.model.parameters())
    before = checksum(sim.model)
    problems = task.sample("test", 3, seed=0)
    episodes = play(
        task,
        problems,
        tokenizer,
        n=2,
        reply=lambda text, j: "search: x" if "doc:" not in text else "answer: y",
    )
    for group in episodes:
        for t in group:
            policy = [
                tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in t.segments[1:] if s.trainable
            ]
            assert policy == ["search: x", "answer: y"]
            env = [s for s in t.segments[1:] if not s.trainable]
            assert env and all(s.logprobs is None for s in env)
            doc = t.messages[2]["content"]
            assert doc.startswith("doc: ")
            env_text = tokenizer.decode([i for s in env for i in s.token_ids], skip_special_tokens=True)
            assert doc in env_text
            mask, ids = t.trainable_mask, t.completion_ids
            assert sum(mask) == sum(len(s.token_ids) for s in t.segments[1:] if s.trainable)
            assert [i for i, m in zip(ids, mask, strict=True) if m] == [
                i for s in t.segments[1:] if s.trainable for i in s.token_ids
            ]
    assert checksum(sim.model) == before
    # greedy documents: a function of the prompt alone, so a replay writes the same text
    again = play(
        task,
        problems,
        tokenizer,
        n=2,
        reply=lambda text, j: "search: x" if "doc:" not in text else "answer: y",
    )
    assert [t.messages for g in again for t in g] == [t.messages for g in episodes for t in g]


def test_a_short_rl_run_trains_the_policy_and_leaves_the_simulator_untouched(tokenizer, tmp_path):
    task = task_with("nano", simulator_seed=5, doc_tokens=8, noise_start=0.0, noise_end=1.0, noise_steps=2,
                     noise_schedule="linear")  # fmt: skip
    sim = task.simulator
    before, calls = checksum(sim.model), sim.calls
    policy = build_preset("nano", tokenizer, seed=0)
    policy_before = checksum(policy)

    capitals = {
        p.data["country"]: p.data["capital"]
        for step in (0, 1)
        for _, p in problems_for_step([task], 2, 0, step)
    }

    def reply(text, j):  # half of each group searches "X?" and then answers wrong: a learning signal
        country = asked(text)
        if "doc:" not in text:
            return f"search: {country}" + ("?" if j % 2 else "")
        return "answer: wrong" if f"search: {country}?" in text else f"answer: {capitals[country]}"

    config = RLConfig(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=24, max_turns=3,
                      max_episode_tokens=200, lr=1e-2, seed=0, progress=False, rewards={"outcome": 1.0})  # fmt: skip
    result = train_rl(policy, tokenizer, [task], config, tmp_path, sampler=Scripted(tokenizer, reply))
    assert sim.calls > calls  # the simulator wrote the documents of this run
    assert checksum(sim.model) == before and not any(p.requires_grad for p in sim.model.parameters())
    assert checksum(policy) != policy_before  # while the policy did train
    assert all(row["reward"] == 0.5 for row in result.history)


def test_the_simulator_prompt_and_task_registration():
    assert simulator_prompt("Tavor", "Tavor", "Mikel", noisy=False).endswith(
        "fact: The capital of Tavor is Mikel."
    )
    assert "noisy" in simulator_prompt("q", "A", "B", noisy=True)
    docs = make_task("search_documents")
    p = docs.sample("train", 1, seed=0)[0]
    assert docs.score(p, docs.demonstration(p)).correct and docs.score(p, "nothing").reward == 0.0
    assert isinstance(load_simulator("nano", 3), Simulator)
    with pytest.raises(ValueError, match="overlap"):
        SimulatedSearchTask.build(SimulatedSearchConfig(test_seed=10), "simulated_search")
