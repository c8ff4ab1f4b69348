"""The handler of `temper gateway` and `serve`: every call sampled here from temper's `Sampler`
and recorded per episode as token-exact `Trajectory` rows.

    recorder = Recorder(sampler, tokenizer)
    with GatewayServer(recorder) as server:   # the agent runs against server.base_url("ep-1")
        ...
    rows = recorder.trajectories("ep-1")      # [Trajectory, ...]: one row unless history was rewritten
    episode = recorder.trajectory("ep-1")     # the same as one Trajectory (`rows` gives them back)
    recorder.new_segments                     # how many calls started a new row

A chat call's messages are rendered with the chat template (with the call's `tools`), an
assistant turn the agent echoes back rendered from the model's own text (`assistant_key`). When
the rendered prompt starts with the episode's row so far (its prompt, the sampled tokens, what
came between), the tokens after it are an environment segment and the sampled turn a policy
segment of the same row; when it does not (the agent rewrote, dropped or summarised earlier
turns, or changed its tools) the call starts a new row, counted in `new_segments`: never a
silent re-tokenisation of what was sampled. A `/v1/completions` call (a text prompt) extends its
row the same way, its prompt tokenised as text.

Sampling is serialised (one sampler call at a time: an in-process sampler holds one model);
`seed` in a request seeds the call, else calls are seeded by their order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from temper.data.chat import prompt_ids
from temper.gateway.openai_format import (
    BadRequest,
    assistant_key,
    chat_messages,
    chat_response,
    completion_response,
    max_tokens,
    stop_strings,
    tools_of_request,
)
from temper.rollout.sampler import Sampler
from temper.rollout.trajectory import Segment, Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class EpisodeRecord:
    """One episode's rows (`rows[-1]` the one calls extend) and the turns it served."""

    rows: list[Trajectory] = field(default_factory=list)
    served: dict[str, str] = field(default_factory=dict)  # assistant_key -> the model's text
    calls: int = 0

    def ids(self) -> list[int]:
        row = self.rows[-1]
        return [t for s in row.segments for t in s.token_ids]


class Recorder:
    def __init__(
        self,
        sampler: Sampler,
        tokenizer: PreTrainedTokenizerBase,
        model_name: str = "temper-policy",
        max_new_tokens: int = 256,
        seed: int = 0,
    ):
        self.sampler, self.tokenizer, self.model_name = sampler, tokenizer, model_name
        self.max_new_tokens, self.seed = max_new_tokens, seed
        self.episodes: dict[str, EpisodeRecord] = {}
        self.new_segments = 0
        self.lock = threading.Lock()

    def trajectories(self, episode: str) -> list[Trajectory]:
        """The episode's rows, in order (a new one per call that did not extend the last)."""
        return list(self.episodes[episode].rows) if episode in self.episodes else []

    def trajectory(self, episode: str) -> Trajectory:
        """The episode as one `Trajectory`, as the trainer holds a rewritten one: its rows' segments
        in order, each later row's prompt marked `starts_row` (`Trajectory.rows` splits them)."""
        rows = self.trajectories(episode)
        if not rows:
            raise KeyError(f"no calls recorded for episode {episode!r}")
        segments = list(rows[0].segments)
        for row in rows[1:]:
            head, *rest = row.segments
            segments += [replace(head, starts_row=True), *rest]
        return replace(rows[-1], segments=segments)

    def chat(self, episode: str, body: dict[str, Any]) -> dict[str, Any]:
        messages = chat_messages(body)
        tools = tools_of_request(body)
        with self.lock:
            record = self.episodes.setdefault(episode, EpisodeRecord())
            own = [
                {"role": "assistant", "content": record.served[assistant_key(m)]}
                if m["role"] == "assistant" and assistant_key(m) in record.served
                else m
                for m in messages
            ]
            try:
                ids = prompt_ids(self.tokenizer, own, tools)
            except Exception as err:  # the template cannot render what the agent sent
                raise BadRequest(f"the chat template cannot render these messages: {err}") from None
            sample = self._turn(record, ids, body)
            response = chat_response(
                self.model_name,
                sample.text,
                sample.stop_reason,
                ids,
                sample.token_ids,
                sample.logprobs if body.get("logprobs") else None,
                self._tokens(sample.token_ids),
            )
            record.served[assistant_key(response["choices"][0]["message"])] = sample.text
            record.rows[-1].messages = [*own, {"role": "assistant", "content": sample.text}]
            return response

    def complete(self, episode: str, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)  # token ids in: nothing tokenised
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            raise BadRequest("`prompt` must be one string or one list of token ids")
        with self.lock:
            record = self.episodes.setdefault(episode, EpisodeRecord())
            sample = self._turn(record, ids, body)
            return completion_response(
                self.model_name,
                sample.text,
                sample.stop_reason,
                ids,
                sample.token_ids,
                sample.logprobs if body.get("logprobs") is not None else None,
                self._tokens(sample.token_ids),
            )

    def _turn(self, record: EpisodeRecord, ids: list[int], body: dict[str, Any]) -> Any:
        """Sample the call's turn and record it: on the episode's row when `ids` extends it,
        else on a new row (counted)."""
        if record.rows and ids[: len(known := record.ids())] == known:
            if len(ids) > len(known):
                record.rows[-1].segments.append(Segment(ids[len(known) :], None, False))
        else:
            if record.rows:
                self.new_segments += 1
            record.rows.append(Trajectory([Segment(list(ids), None, False)]))
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        top_p = float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0)
        seed = int(body["seed"]) if body.get("seed") is not None else self.seed + record.calls
        [[sample]] = self.sampler.sample(
            [ids],
            1,
            max_new_tokens=max_tokens(body, self.max_new_tokens),
            temperature=temperature,
            top_p=top_p,
            stop=stop_strings(body),
            seed=[seed],
        )
        row = record.rows[-1]
        row.segments.append(Segment(list(sample.token_ids), list(sample.logprobs), True, row.turns))
        row.last_stop = sample.stop_reason
        record.calls += 1
        return sample

    def _tokens(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([t]) for t in ids]
