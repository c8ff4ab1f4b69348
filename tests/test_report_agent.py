"""The report's agent parts: episodes with environment turns apart, per-episode metrics tables."""

from __future__ import annotations

from temper.report.agent import episode_html, eval_episode_table, plain, rl_episode_table, transcripts
from temper.report.rl import _rollout


def test_episode_segments_are_drawn_apart_and_escaped():
    html = episode_html(
        [{"by": "policy", "text": "<code>1</code>"}, {"by": "env", "text": "<interpreter>1</interpreter>"}]
    )
    assert html == (
        "<pre class='episode'><span class='pol'>&lt;code&gt;1&lt;/code&gt;</span>"
        "<span class='env'>&lt;interpreter&gt;1&lt;/interpreter&gt;</span></pre>"
    )
    row = {
        "reward": 1.0,
        "parts": {"outcome": 1.0},
        "correct": True,
        "stop": "eos",
        "turns": 2,
        "episode": [{"by": "policy", "text": "a"}, {"by": "env", "text": "b"}],
    }
    shown = _rollout(row)
    assert "turns: 2" in shown and "<span class='env'>b</span>" in shown


def test_rl_episode_table_compares_the_first_and_last_tenth_of_the_steps():
    rows = [
        {
            "step": i + 1,
            "episode/turns": 1.0 + (i >= 10),
            "episode/stop_done": 0.5 + 0.5 * (i >= 10),
            "signal/tool_calls": 0.25 * (i >= 10),
        }
        for i in range(20)
    ]
    html = rl_episode_table(rows)
    assert "<th>first steps (2)</th><th>last steps (2)</th>" in html
    assert "<tr><td>turns</td><td>1</td><td>2</td></tr>" in html
    assert "<tr><td>stop: done</td><td>50%</td><td>100%</td></tr>" in html
    assert "<tr><td>tool calls</td><td>0</td><td>0.25</td></tr>" in html
    assert rl_episode_table([{"step": 1, "reward": 0.5}]) == ""  # single-turn runs: no table


def test_eval_episode_table_has_a_row_per_model_and_split_with_every_signal():
    e = {
        "episodes": 10,
        "turns": 1.5,
        "policy_tokens": 20.0,
        "env_seconds": 0.25,
        "signals": {"tool_calls": 0.5},
        "stop_reasons": {"done": 9, "max_turns": 1},
    }
    by_model = {
        "rl": {"test": {"episodes": e}, "ood": {"episodes": e | {"signals": {"tool_errors": 0.1}}}},
        "base": {"test": {}},
    }
    html = eval_episode_table(by_model)
    assert "<th>tool calls</th><th>tool errors</th>" in html
    assert (
        "<tr><td>rl</td><td>test</td><td>10</td><td>1.5</td><td>20</td><td>0.5</td><td>0</td><td>0.25s</td><td>done 9, max_turns 1</td></tr>"
        in html
    )
    assert "<td>base</td>" not in html  # a single-turn result has no episodes row


def test_a_rewritten_episodes_rows_and_the_gateway_metrics_are_shown():
    html = episode_html(
        [
            {"by": "policy", "text": "a", "row": 0},
            {"by": "env", "text": "p", "row": 1, "row_start": True},
            {"by": "policy", "text": "b", "row": 1},
        ]
    )
    assert html == (
        "<pre class='episode'><span class='pol'>a</span><span class='row'>row 1: the agent rewrote "
        "its history, a new training row starts (its prompt never trained on)</span>"
        "<span class='env'>p</span><span class='pol'>b</span></pre>"
    )
    rows = [{"step": 1, "gateway/segments_per_episode": 1.5, "gateway/rewrites": 2}] * 2
    table = rl_episode_table(rows)
    assert "<tr><td>rows: training rows per episode</td><td>1.5</td><td>1.5</td></tr>" in table
    assert (
        "<tr><td>rows: new training rows started (per step; rewrites, summaries, truncations)</td>"
        "<td>2</td><td>2</td></tr>" in table
    )


def test_a_summarised_and_a_truncated_row_say_why_they_start_and_the_summary_is_marked():
    html = episode_html(
        [
            {"by": "policy", "text": "walk", "row": 0},
            {"by": "policy", "text": "Key in box 3.", "row": 0, "summary": True},
            {"by": "env", "text": "p", "row": 1, "row_start": True, "cause": "summarised"},
            {"by": "env", "text": "q", "row": 2, "row_start": True, "cause": "truncated"},
        ]
    )
    assert "<span class='pol summary' title='self-summary (trained)'>[summary] Key in box 3.</span>" in html
    assert (
        "row 1: the context budget was reached; the new row starts from the task, the summary above" in html
    )
    assert "row 2: the context budget was reached; the oldest turns are dropped" in html
    assert "rewrote" not in html


def test_a_transcript_shows_each_turn_as_the_user_reads_it_without_template_markers():
    episode = [
        {"by": "policy", "text": "pytest<|end|>"},
        {"by": "env", "text": "<|user|>1 failed <b>\n[exit 1]<|end|><|assistant|>"},
        {"by": "policy", "text": "submit<|end|>"},
    ]
    wrong = {
        "id": "t1",
        "prompt": "fix the repo",
        "episode": episode,
        "score": {"correct": False, "reason": "fail"},
    }
    right = wrong | {"id": "t2", "score": {"correct": True, "reason": "pass"}}
    html = transcripts(
        "shell_repo", {"sft": {"test": {"examples": [wrong, right]}}, "rl": {"ood": {"examples": [wrong]}}}
    )
    first, second = html.split("</details>")[:2]
    assert first.startswith(
        "<details><summary>one episode as the agent saw it: shell_repo / sft / test / t2: correct (pass), 2 turns"
    )
    assert (
        "<tr><td>1</td><td><pre>pytest</pre></td><td><pre>1 failed &lt;b&gt;\n[exit 1]</pre></td></tr>"
        in first
    )
    assert (
        "<tr><td>2</td><td><pre>submit</pre></td><td><pre>[the episode ends: correct, pass]</pre></td></tr>"
        in first
    )
    assert second.startswith("<details open><summary>") and "rl / ood / t1: wrong (fail)" in second
    assert plain("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == "hi"
    assert transcripts("t", {"m": {"test": {"examples": [{"id": "x", "completion": "4"}]}}}) == ""
