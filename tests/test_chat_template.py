"""model.chat_template and model.eos_token on a user's own Qwen2-style base whose eos
(`<|endoftext|>`) is not the ChatML end of turn (`<|im_end|>`)."""

import json

import pytest
import torch

from temper.catalog import make_task
from temper.cli import main
from temper.data.chat import prompt_ids
from temper.evaluate import evaluate
from temper.models import (
    ChatOptions,
    ChatTemplateError,
    apply_chat_options,
    load_model,
    load_tokenizer,
    require_chat_template,
    save_model,
    save_trained,
)
from temper.models.chat import TEMPLATES, template_warning, turn_end_token
from temper.rollout import HFSampler
from temper.rollout.hf_sampler import stop_ids
from tiny_qwen import ENDOFTEXT, IM_END, IM_START, always_emit, build_model, build_tokenizer

CHATML = ChatOptions(chat_template="chatml")
FIXED = ChatOptions(chat_template="chatml", eos_token=IM_END)
MESSAGES = [{"role": "user", "content": "What is 12+34?"}]


@pytest.fixture
def base(tmp_path):
    """A saved base that, once prompted, emits <|im_end|> forever: what an SFT'd model does when
    generation does not stop at the template's end of turn."""
    tokenizer = build_tokenizer()
    model = always_emit(build_model(tokenizer), tokenizer.convert_tokens_to_ids(IM_END))
    return save_model(model, tokenizer, tmp_path / "base")


def test_a_tokenizer_without_template_is_refused_naming_the_option(base):
    tokenizer = load_tokenizer(base)
    assert not tokenizer.chat_template
    with pytest.raises(ChatTemplateError, match=r"no chat template; set model\.chat_template"):
        require_chat_template(tokenizer, base)


def test_a_builtin_template_is_saved_with_the_model_and_reloads(base, tmp_path):
    tokenizer, model = load_tokenizer(base), load_model(base)
    apply_chat_options(model, tokenizer, CHATML)
    rendered = tokenizer.decode(prompt_ids(tokenizer, MESSAGES))
    assert rendered == "<|im_start|>user\nWhat is 12+34?<|im_end|>\n<|im_start|>assistant\n"
    save_trained(model, tokenizer, tmp_path / "out")
    assert (tmp_path / "out" / "chat_template.jinja").read_text() == TEMPLATES["chatml"]
    again = load_tokenizer(tmp_path / "out")
    assert again.chat_template == TEMPLATES["chatml"]
    assert prompt_ids(again, MESSAGES) == prompt_ids(tokenizer, MESSAGES)


def test_a_template_file_resolves_against_the_recipe_folder(base, tmp_path):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    tokenizer = load_tokenizer(base)
    apply_chat_options(None, tokenizer, ChatOptions(chat_template="t.jinja"), base_dir=tmp_path)
    assert tokenizer.decode(prompt_ids(tokenizer, MESSAGES)) == "[What is 12+34?]"
    with pytest.raises(ChatTemplateError, match=r"neither a built-in template \(temper, chatml"):
        apply_chat_options(None, tokenizer, ChatOptions(chat_template="chatmlx"), base_dir=tmp_path)


def test_eos_option_sets_tokenizer_sampler_and_generation_config_and_survives_save(base, tmp_path):
    tokenizer, model = load_tokenizer(base), load_model(base)
    end, text_end = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    assert stop_ids(model, tokenizer) == [text_end]
    apply_chat_options(model, tokenizer, FIXED)
    assert tokenizer.eos_token == IM_END
    assert stop_ids(model, tokenizer) == [end, text_end]  # the base's eos is kept
    assert model.generation_config.eos_token_id == [end, text_end]
    save_trained(model, tokenizer, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert config["eos_token_id"] == [end, text_end]
    again, again_tok = load_model(tmp_path / "out"), load_tokenizer(tmp_path / "out")
    assert again_tok.eos_token == IM_END and stop_ids(again, again_tok) == [end, text_end]
    # plain generate on the saved folder stops at the end of turn, as temper's sampler does
    ids = torch.tensor([prompt_ids(again_tok, MESSAGES)])
    assert again.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :].tolist() == [end]
    base_model = load_model(base)
    assert len(base_model.generate(ids, max_new_tokens=6, do_sample=False)[0]) == ids.shape[1] + 6


def test_save_syncs_generation_config_to_the_tokenizer_eos(base, tmp_path):
    """A tokenizer whose eos was set by hand (not through the option) still reaches generate."""
    tokenizer, model = load_tokenizer(base), load_model(base)
    tokenizer.eos_token = IM_END
    save_model(model, tokenizer, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert config["eos_token_id"] == [tokenizer.convert_tokens_to_ids(IM_END), 0]


def test_an_eos_that_is_not_one_token_is_refused(base):
    tokenizer = load_tokenizer(base)
    with pytest.raises(ChatTemplateError, match=r"'</answer>' is not one token.*'<\|im_end\|>'"):
        apply_chat_options(None, tokenizer, ChatOptions(eos_token="</answer>"))


def test_the_template_turn_end_is_found_and_a_missing_stop_is_named(base):
    tokenizer, model = load_tokenizer(base), load_model(base)
    apply_chat_options(model, tokenizer, CHATML)
    assert turn_end_token(tokenizer) == IM_END
    said = template_warning(tokenizer, stop_ids(model, tokenizer))
    assert said and "ends each turn with '<|im_end|>'" in said and "set model.eos_token: '<|im_end|>'" in said
    apply_chat_options(model, tokenizer, FIXED)
    assert template_warning(tokenizer, stop_ids(model, tokenizer)) is None


def _eval(base, options, k=2):
    tokenizer, model = load_tokenizer(base), load_model(base)
    apply_chat_options(model, tokenizer, options)
    sampler = HFSampler(model, tokenizer)
    return evaluate(
        sampler, tokenizer, make_task("arithmetic"), "test", n_problems=4, k=k, max_new_tokens=5, n_examples=1
    )


def test_eval_names_the_unstopped_end_of_turn_and_shows_it_marked(base):
    r = _eval(base, CHATML)
    assert r["metrics"]["truncation_rate"]["value"] == 1.0
    assert r["special_tokens"] == {IM_END: 12}  # 4 greedy + 4 x 2 sampled completions
    assert r["stop_warning"] == (
        "12 of 12 completions contain '<|im_end|>' (the chat template's end of turn) but generation "
        "stops only at '<|endoftext|>'; set model.eos_token: '<|im_end|>'"
    )
    example = r["examples"][0]
    assert example["completion"] == "⟨<|im_end|>⟩" * 5  # marked, not stripped
    assert example["graded"] == ""  # what the task graded
    fixed = _eval(base, FIXED)
    assert fixed["stop_warning"] is None and fixed["special_tokens"] == {}
    assert fixed["metrics"]["truncation_rate"]["value"] == 0.0
    assert fixed["examples"][0]["completion"] == "" and "graded" not in fixed["examples"][0]


def test_gate_blames_the_stop_token_not_sft(base):
    from temper.stages.rl import GateError, GateSpec, format_gate

    tokenizer, model = load_tokenizer(base), load_model(base)
    apply_chat_options(model, tokenizer, CHATML)
    tasks = {"arithmetic": make_task("arithmetic")}
    with pytest.raises(GateError) as err:
        format_gate(
            GateSpec(min_parse_rate=0.5, n_problems=4), HFSampler(model, tokenizer), tokenizer, tasks, 5
        )
    said = str(err.value)
    assert "set model.eos_token: '<|im_end|>'" in said and "SFT is not done" not in said
    assert "gate.on_fail: warn" in said
    warned = format_gate(
        GateSpec(min_parse_rate=0.5, n_problems=4, on_fail="warn"),
        HFSampler(model, tokenizer),
        tokenizer,
        tasks,
        5,
    )
    assert "set model.eos_token" in warned["stop_warnings"]["arithmetic"]


def test_probe_names_the_unstopped_end_of_turn(base, capsys):
    from temper.stages.rl import reachability_probe
    from temper.train.rl import RLConfig

    tokenizer, model = load_tokenizer(base), load_model(base)
    apply_chat_options(model, tokenizer, CHATML)
    config = RLConfig(prompts_per_step=2, group_size=2, max_new_tokens=4, progress=False)
    stats = reachability_probe(HFSampler(model, tokenizer), tokenizer, [make_task("arithmetic")], config, 2)
    assert stats["zero_variance/truncated"] == 1.0
    assert stats["stop_warning"].endswith("set model.eos_token: '<|im_end|>'")
    said = capsys.readouterr().err
    assert "raise max_new_tokens" not in said and "generation does not stop" in said


def test_eval_command_refuses_a_templateless_tokenizer_then_takes_the_flags(base, tmp_path, capsys):
    common = ["eval", "--model", str(base), "--tasks", "arithmetic", "--splits", "test"]
    common += ["--n_problems", "3", "--k", "1", "--max_new_tokens", "4"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "has no chat template; set model.chat_template" in err and "Traceback" not in err
    flags = ["--model.chat_template", "chatml", "--model.eos_token", IM_END]
    assert main([*common, "--out", str(tmp_path / "b"), *flags]) == 0
    out = capsys.readouterr().out
    assert "warning:" not in out
    assert main([*common, "--out", str(tmp_path / "c"), "--model.chat_template", "chatml"]) == 0
    assert "set model.eos_token: '<|im_end|>'" in capsys.readouterr().out  # the console table names it


HASHED = """
name: h
model: {{preset: nano{extra}}}
tasks: {{arithmetic: {{}}}}
stages:
  - {{kind: pretrain, corpus: {{tasks: [arithmetic]}}}}
  - {{kind: sft, data: {{tasks: [arithmetic]}}}}
  - {{kind: eval}}
"""


def _hashes(tmp_path, extra):
    from temper.catalog import make_recipe_task
    from temper.recipe import parse_recipe
    from temper.runner import _stage_hash
    from temper.stages.context import StageContext

    recipe = parse_recipe(HASHED.format(extra=extra))
    ctx = StageContext(
        run_dir=tmp_path,
        base_dir=tmp_path,
        tasks={"arithmetic": make_recipe_task("arithmetic", {})},
        task_options=recipe.tasks,
        chat=recipe.model.chat(),
    )
    out = []
    for i, stage in enumerate(recipe.stages):  # as run_recipe chains them
        out.append(_stage_hash(recipe, i, ctx))
        if stage.kind != "eval":
            ctx.models[stage.name], ctx.model_hashes[stage.name] = tmp_path / stage.name, out[-1]
    return out


def test_chat_options_rerun_the_stages_that_chat_but_never_the_pretraining(tmp_path):
    (tmp_path / "t.jinja").write_text(TEMPLATES["chatml"])
    plain = _hashes(tmp_path, "")
    eos = _hashes(tmp_path, ", eos_token: '<|end|>'")
    file = _hashes(tmp_path, ", chat_template: t.jinja")
    assert eos[0] == plain[0] == file[0]  # the base is not retrained for a chat option
    assert len({plain[1], eos[1], file[1]}) == 3 and len({plain[2], eos[2], file[2]}) == 3
    (tmp_path / "t.jinja").write_text(TEMPLATES["zephyr"])
    assert _hashes(tmp_path, ", chat_template: t.jinja")[1] != file[1]  # the file's text counts


def test_a_missing_template_file_is_refused_before_any_stage(tmp_path):
    from temper.preflight import check_inputs
    from temper.recipe import RecipeError, parse_recipe

    text = HASHED.format(extra=", chat_template: missing.jinja")
    with pytest.raises(
        RecipeError, match=r"r\.yaml:3: model\.chat_template: .*missing\.jinja does not exist"
    ):
        check_inputs(parse_recipe(text), text, "r.yaml", tmp_path)


def test_other_special_tokens_are_named_only_when_the_model_keeps_emitting_them():
    from collections import Counter

    from temper.models.chat import stop_warning

    tokenizer = build_tokenizer()  # no template, so no end of turn to compare with
    tokenizer.pad_token = IM_START
    stops = [tokenizer.eos_token_id]
    assert stop_warning(tokenizer, Counter(), 10, stops) is None
    assert stop_warning(tokenizer, Counter({IM_END: 4}), 10, stops) is None  # stray, undertrained
    assert stop_warning(tokenizer, Counter({IM_START: 10}), 10, stops) is None  # padding ends no turn
    assert stop_warning(tokenizer, Counter({IM_END: 5, IM_START: 10}), 10, stops) == (
        "5 of 10 completions contain the special token '<|im_end|>' but generation stops only at "
        "'<|endoftext|>'; if it ends the answer, set model.eos_token: '<|im_end|>'"
    )


def test_rl_rollouts_show_the_special_tokens_marked(base):
    from temper.train.rl import RLConfig, collect_groups
    from temper.train.rollouts import rollout_record

    tokenizer, model = load_tokenizer(base), load_model(base)
    apply_chat_options(model, tokenizer, CHATML)
    config = RLConfig(prompts_per_step=1, group_size=2, max_new_tokens=3, progress=False)
    groups, _ = collect_groups(
        HFSampler(model, tokenizer), tokenizer, [make_task("arithmetic")], config, step=0
    )
    rows = rollout_record(1, groups[0], tokenizer)
    assert [(r["completion"], r["graded"]) for r in rows] == [("⟨<|im_end|>⟩" * 3, "")] * 2
    plain = rollout_record(1, groups[0])  # no tokenizer: the graded text, as before
    assert [r["completion"] for r in plain] == ["", ""]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_builtin_template_supports_assistant_only_masking(name):
    from temper.data.chat import IGNORE, tokenize_messages

    tokenizer = build_tokenizer()
    apply_chat_options(None, tokenizer, ChatOptions(chat_template=name))
    turns = [*MESSAGES, {"role": "assistant", "content": "Answer: 46"}]
    ids, labels = tokenize_messages(tokenizer, [*turns, {"role": "user", "content": "And 1+1?"}, turns[1]])
    trained = [i for i, label in zip(ids, labels, strict=True) if label != IGNORE]
    end = turn_end_token(tokenizer)
    # both answers are trained on, each with the template's end of turn when it is a special token here
    assert tokenizer.decode(trained, skip_special_tokens=True).count("Answer: 46") == 2
    assert end == {"chatml": IM_END, "zephyr": ENDOFTEXT}.get(
        name
    )  # llama3's and temper's are not in this vocab
    if end:
        assert trained.count(tokenizer.convert_tokens_to_ids(end)) == 2
