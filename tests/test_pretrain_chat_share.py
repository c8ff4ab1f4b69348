"""corpus.chat_share: a base that sees the answer format now and then (for RL straight from it)."""

from pathlib import Path

from temper.data.dataset import build_sequences
from temper.models import build_tokenizer
from temper.recipe import ModelSpec
from temper.stages.context import StageContext
from temper.stages.pretrain import PretrainStage, corpus_examples, pretrain_hash
from temper.tasks import Arithmetic


def _stage(**corpus) -> PretrainStage:
    return PretrainStage(kind="pretrain", corpus={"tasks": ["arithmetic"], "problems_per_task": 8, **corpus})


def test_the_share_of_problems_is_written_as_whole_chats_spread_evenly():
    tokenizer = build_tokenizer()
    ctx = StageContext(
        run_dir=Path("."), base_dir=Path("."), tasks={"arithmetic": Arithmetic()}, task_options={}
    )
    plain = corpus_examples(_stage(), ctx, tokenizer)
    mixed = corpus_examples(_stage(chat_share=0.25), ctx, tokenizer)
    assert not any("<|user|>" in e.text for e in plain)
    chats = [e for e in mixed if e.text.startswith("<|user|>")]
    assert sorted(e.line for e in chats) == [4, 8]  # problems 3 and 7 (0-based) of 8
    task = Arithmetic()
    problem = task.sample("train", 8, 0)[3]
    assert chats[0].text == tokenizer.apply_chat_template(
        [*problem.messages(), {"role": "assistant", "content": task.demonstration(problem)}], tokenize=False
    )
    assert "\nAnswer: " in chats[0].text
    assert {e.text for e in mixed} - {e.text for e in chats} <= {e.text for e in plain}
    sequences, _ = build_sequences(tokenizer, mixed, 512, pack=True)
    ids = [i for s in sequences for i in s.input_ids]
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids  # read as the special token, not bytes


def test_the_share_enters_the_base_hash_only_when_set():
    ctx = StageContext(run_dir=Path("."), base_dir=Path("."), tasks={}, task_options={})
    spec = ModelSpec(preset="tiny")
    assert pretrain_hash(_stage(), spec, ctx) != pretrain_hash(_stage(chat_share=0.05), spec, ctx)
