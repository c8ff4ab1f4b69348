from transformers import AutoTokenizer

from temper.models.tokenizer import SPECIAL_TOKENS


def test_bytes_map_to_their_own_ids(tokenizer):
    assert tokenizer("a1 +")["input_ids"] == [ord("a"), ord("1"), ord(" "), ord("+")]
    assert tokenizer.convert_ids_to_tokens(list(range(256, 263))) == SPECIAL_TOKENS


def test_text_round_trips_including_non_ascii(tokenizer):
    text = "Cards: 8 A 5 Q.\n  naïve → 24 ✓"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_chat_template_renders_turns_and_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2=?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|system|>S<|end|><|user|>2+2=?<|end|><|assistant|>"


def test_generation_markers_agree_with_assistant_tokens(tokenizer):
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ab"}]
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    tokens = tokenizer.convert_ids_to_tokens(out["input_ids"])
    assert [t for t, m in zip(tokens, out["assistant_masks"]) if m] == ["a", "b", "<|end|>"]


def test_save_and_reload_through_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert again.apply_chat_template(messages, tokenize=False) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )
    assert again("x=1")["input_ids"] == tokenizer("x=1")["input_ids"]
    assert (again.pad_token_id, again.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
