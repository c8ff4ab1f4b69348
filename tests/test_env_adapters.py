"""The ecosystem's environments as temper Envs (issue 9, item 8): a gymnasium env, a TRL
environment_factory class and an OpenEnv server on loopback, each played by a scripted policy."""

from __future__ import annotations

import threading
import time

import pytest

from temper.envs.base import Env

# ---------------------------------------------------------------- gymnasium


def _gym_treasure_env(**options):
    pytest.importorskip("gymnasium")
    from temper.envs.adapters.gymnasium_text import GymTextEnv
    from temper.envs.gym_treasure_hunt import GymTreasureHunt
    from temper.envs.treasure_hunt import INSTRUCTIONS, GridMap, parse_move

    grid = GridMap.parse("S..#\n.#^.\n...$\n^...")
    env = GymTextEnv(
        GymTreasureHunt(grid),
        parse_action=lambda text: parse_move(text)[0],
        render_observation=lambda observation, info: info["text"],
        instructions=INSTRUCTIONS,
        seed=0,
        **options,
    )
    return env, grid


def test_gymnasium_text_env_bfs_policy_wins_and_invalid_answers_do_not_move():
    from temper.envs.treasure_hunt import INSTRUCTIONS, shortest_path

    env, grid = _gym_treasure_env(invalid_penalty=-0.5)
    assert isinstance(env, Env)
    messages = env.reset()
    assert messages[0] == {"role": "system", "content": INSTRUCTIONS}
    assert messages[1]["role"] == "user" and messages[1]["content"].startswith("position: row 0, col 0\n")

    bad = env.step("I would rather think about it")  # no move: the gym env is not stepped
    assert not bad.done and bad.reward == -0.5
    assert bad.signals["invalid"] and bad.signals["invalid_moves"] == 1
    assert bad.messages[0]["content"].endswith(messages[1]["content"])  # the observation again
    assert env.env.core.position == grid.start and env.env.core.steps == 0

    path = shortest_path(grid)
    rewards, positions = [], []
    for i, move in enumerate(path):
        result = env.step(f"I go {move}.")
        rewards.append(result.reward)
        positions.append(env.env.core.position)
        assert result.done == (i == len(path) - 1)
        if not result.done:
            assert result.messages == [{"role": "user", "content": env.env.core.observation()}]
            assert result.signals["closer"] is True and result.score is None
    assert positions[-1] == grid.treasure
    assert rewards == [0.0] * (len(path) - 1) + [1.0]
    score = result.score
    assert score.correct and not score.parsed  # won, but one answer was not a move
    assert score.reward == pytest.approx(1.0 - 0.5)  # the return: the treasure plus the penalty
    assert score.details["steps"] == len(path) + 1 and score.details["ending"] == "terminated"
    assert result.signals["terminated"] and result.signals["treasure"]
    with pytest.raises(RuntimeError):
        env.step("up")


def test_gymnasium_text_env_trap_and_step_limit_are_failures():
    env, _ = _gym_treasure_env()
    env.reset()
    for move in ("down", "down", "right"):  # (2, 1): the trap at (1, 2) is up-right
        env.step(move)
    result = env.step("right")  # (2, 2)
    result = env.step("up")  # (1, 2): the trap
    assert result.done and result.reward == -1.0
    assert not result.score.correct and result.score.parsed and result.score.reward == -1.0

    env, _ = _gym_treasure_env(max_steps=3, instructions_as="prefix")
    messages = env.reset()
    assert len(messages) == 1 and messages[0]["content"].startswith("Find the treasure")
    results = [env.step("no idea"), env.step("up"), env.step("?")]  # every action counts, invalid ones too
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].score.details["ending"] == "step_limit" and not results[-1].score.correct


# ---------------------------------------------------------------- TRL environment_factory


class Vault:
    """A TRL-style environment: reset(**row) starts the episode, public methods are tools."""

    def __init__(self):
        self.secret, self.guesses, self.opened = None, 0, False

    def reset(self, secret: int, **row) -> str:
        self.secret, self.guesses, self.opened = secret, 0, False
        return " The code is between 1 and 100."

    def guess(self, number: int) -> str:
        """Try a code on the vault.

        Args:
            number: the code to try
        """
        if not isinstance(number, int):
            raise TypeError("number must be an integer")
        self.guesses += 1
        if number == self.secret:
            self.opened = True
            return "open"
        return "higher" if number < self.secret else "lower"

    def get_reward(self) -> float:
        return 0.5 if self.opened else 0.0

    @property
    def hint(self) -> str:  # a property is not a tool (TRL lists functions on the class)
        raise AssertionError("evaluated")

    def _log(self) -> None:  # private: not a tool
        pass


def test_trl_environment_factory_tools_binary_search_and_grading():
    pytest.importorskip("transformers")
    from temper.envs.adapters.trl_factory import TRLEnvironment

    seen = {}

    def opened(prompts, completions, completion_ids, environments, secret, **kwargs):
        seen.update(prompts=prompts, completions=completions, secret=secret, environments=environments)
        return [
            1.0 if env.opened and str(s) in c[-1]["content"] else 0.0
            for env, c, s in zip(environments, completions, secret)
        ]

    row = {"prompt": [{"role": "user", "content": "Open the vault."}], "secret": 37}
    env = TRLEnvironment(Vault, row, reward_funcs=[opened])
    assert isinstance(env, Env)
    assert [t["function"]["name"] for t in env.tools] == ["guess"]
    assert env.tools[0]["function"]["parameters"]["properties"]["number"]["type"] == "integer"
    messages = env.reset()
    assert messages == [{"role": "user", "content": "Open the vault. The code is between 1 and 100."}]
    assert row["prompt"][0]["content"] == "Open the vault."  # the row is left untouched

    # readable errors, not crashes: bad JSON, an unknown tool, a wrong argument, a tool that raises
    result = env.step(
        '<tool_call>{"name": "guess", "arguments": {number: 1}}</tool_call>\n'
        '<tool_call>{"name": "open_door", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "guess", "arguments": {"code": 5}}</tool_call>\n'
        '<tool_call>{"name": "guess", "arguments": {"number": "five"}}</tool_call>'
    )
    assert not result.done and [m["role"] for m in result.messages] == ["tool"] * 4
    contents = [m["content"] for m in result.messages]
    assert "not valid JSON" in contents[0] and "Tool open_door not found." in contents[1]
    assert (
        "missing a required argument: 'number'" in contents[2] and "number must be an integer" in contents[3]
    )
    assert result.signals == {"tool_calls": 4, "tool_errors": 4, "malformed_tool_calls": 3}

    low, high = 1, 100
    for _ in range(8):  # a scripted binary search through the tool
        mid = (low + high) // 2
        result = env.step(
            f'Let me try.<tool_call>{{"name": "guess", "arguments": {{"number": {mid}}}}}</tool_call>'
        )
        assert result.messages[0]["name"] == "guess" and result.reward == 0.0
        answer = result.messages[0]["content"]
        if answer == "open":
            break
        low, high = (mid + 1, high) if answer == "higher" else (low, mid - 1)
    assert answer == "open" and env.instance.opened
    final = env.step(f"The code is {mid}.")
    assert final.done and final.messages == [] and final.signals["malformed_tool_calls"] == 3
    score = final.score
    assert score.correct and score.reward == pytest.approx(1.0 + 0.5)  # opened + get_reward (weight 1)
    assert not score.parsed  # the malformed calls of the first turn
    assert score.details["rewards"] == {"opened": 1.0, "Vault": 0.5}
    assert seen["secret"] == [37] and seen["environments"] == [env.instance]
    episode = seen["completions"][0]  # the whole episode after the prompt, as TRL passes it
    assert episode[0]["role"] == "assistant" and episode[1]["role"] == "tool"
    assert episode[-1] == {"role": "assistant", "content": "The code is 37."}
    assert len(episode) == (1 + 4) + 2 * env.instance.guesses + 1  # every turn and tool message
    assert seen["prompts"] == [messages]


# ---------------------------------------------------------------- OpenEnv


def _serve(app):
    """The app on 127.0.0.1 on a free port (uvicorn picks it), in a thread; (server, url)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the OpenEnv test server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


def test_openenv_server_on_loopback_played_through_the_adapter():
    pytest.importorskip(
        "openenv.core", reason="openenv-core is not installed (pip install 'temper[openenv]')"
    )
    from openenv.core import GenericEnvClient, create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field

    from temper.envs.adapters.openenv import OpenEnvEnv

    class Move(Action):
        step: int = Field(ge=-1, le=1)

    class Position(Observation):
        position: int = 0
        goal: int = 0

    class NumberLine(Environment):
        """Walk from 0 to the goal (the seed) on a line; reward 1 on arrival, done after 10 steps."""

        def __init__(self):
            super().__init__()
            self._state, self.position, self.goal = State(step_count=0), 0, 0

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state, self.position, self.goal = State(episode_id=episode_id, step_count=0), 0, seed or 3
            return Position(position=0, goal=self.goal)

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            self.position += action.step
            arrived = self.position == self.goal
            done = arrived or self._state.step_count >= 10
            return Position(position=self.position, goal=self.goal, done=done, reward=1.0 if arrived else 0.0)

        @property
        def state(self):
            return self._state

    server, thread, url = _serve(create_app(NumberLine, Move, Position, env_name="number_line"))
    try:
        moves = {"left": -1, "stay": 0, "right": 1, "jump": 5}  # "jump" is outside the server's schema
        env = OpenEnvEnv(
            GenericEnvClient(base_url=url),
            render_observation=lambda obs: f"position {obs['position']}, goal {obs['goal']}",
            make_action=lambda text: {"step": moves[text.strip()]} if text.strip() in moves else None,
            instructions="Reach the goal. Answer left, stay or right.",
            reset_kwargs={"seed": 2},
        )
        assert isinstance(env, Env)
        assert env.reset()[1] == {"role": "user", "content": "position 0, goal 2"}
        result = env.step("hmm")  # not an action: never sent
        assert (
            result.signals["invalid_reason"] == "unparsed"
            and "position 0, goal 2" in result.messages[0]["content"]
        )
        result = env.step("jump")  # sent, rejected by the server's schema: invalid, the session lives on
        assert result.signals["invalid_reason"] == "rejected" and not result.done
        result = env.step("right")
        assert result.messages == [{"role": "user", "content": "position 1, goal 2"}] and result.reward == 0.0
        result = env.step("right")
        assert result.done and result.reward == 1.0 and result.messages == []
        assert result.score.correct and not result.score.parsed and result.score.reward == 1.0
        assert result.score.details["steps"] == 4 and result.score.details["invalid_moves"] == 2
        assert env.closed  # the episode's end closed the client's session
    finally:
        server.should_exit = True
        thread.join(timeout=10)
