"""Load and save causal LMs through the transformers Auto classes.

A local directory and a hub id go through the same `from_pretrained` call; the built-in
presets are created with `temper pretrain` (or `build_preset`) and saved like any model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from temper import distributed
from temper.atomic import atomic_dir


class ModelNotFoundError(RuntimeError):
    """A model id is neither a local directory nor reachable on the hub."""


def default_device() -> torch.device:
    """This process's device: its own GPU under a multi-GPU launch (cuda:LOCAL_RANK), else cpu."""
    return distributed.state().device


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on CPU (bf16 matmul on CPUs without native bf16 is ~100x slower), bf16 on CUDA."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _whole_sentences(text: str, limit: int = 400) -> str:
    """`text` on one line, cut (if too long) after its last full sentence that fits: transformers'
    messages run over many lines (one lists every model type it knows)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    end = text.rfind(". ", 0, limit)
    return text[: end + 1] if end > 0 else text[:limit] + " ..."


def _not_found(name: str, err: Exception) -> ModelNotFoundError:
    if Path(name).expanduser().is_dir():
        why = _whole_sentences(str(err)) or type(err).__name__
        return ModelNotFoundError(f"directory {name!r} holds no loadable model or tokenizer: {why}")
    return ModelNotFoundError(
        f"cannot load model {name!r}: it is not a local directory and the hub could not provide it "
        f"({type(err).__name__}). Pass a local path (e.g. the output of `temper pretrain`) "
        f"or make the hub reachable."
    )


def _check_files(folder: Path, weights: bool) -> None:
    """Refuse a model directory whose files cannot be read, naming the file: every JSON file must
    parse, and (for a model) each safetensors file must have a whole header and the data it
    declares. Only headers are read (safetensors maps the file), so this costs milliseconds."""
    for path in sorted(folder.glob("*.json")):
        try:
            parsed = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ModelNotFoundError(
                f"{path} is not a text file (config and tokenizer files are JSON)"
            ) from None
        except json.JSONDecodeError as err:
            raise ModelNotFoundError(
                f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
            ) from None
        if path.name.endswith("config.json") and not isinstance(parsed, dict):
            raise ModelNotFoundError(f"{path} must hold a JSON object, not a {type(parsed).__name__}")
    if not weights:
        return
    if not (folder / "config.json").exists():
        raise ModelNotFoundError(f"model directory {str(folder)!r} has no config.json" + _inside(folder))
    for path in sorted(folder.glob("*.safetensors")):
        if path.is_dir():
            raise ModelNotFoundError(f"{path} is a folder, not a weights file")
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as err:  # SafetensorError: header too small/large, incomplete metadata
            size = path.stat().st_size
            state = "empty" if size == 0 else f"truncated or not safetensors ({size} bytes)"
            why = str(err).removeprefix("Error while deserializing header: ")
            raise ModelNotFoundError(f"{path} is unreadable: {state}; {why}") from None


# The files a tokenizer is built from: a fast tokenizer's tokenizer.json, or a slow tokenizer's
# vocabulary (sentencepiece, BPE vocab + merges, WordPiece, tiktoken). Without any of them
# transformers falls back to converting a slow tokenizer and says sentencepiece is not installed.
_TOKENIZER_FILES = ("tokenizer.json", "*.model", "vocab.*", "*.tiktoken")


def _check_tokenizer_files(folder: Path) -> None:
    if not any(p.is_file() for pattern in _TOKENIZER_FILES for p in folder.glob(pattern)):
        raise ModelNotFoundError(
            f"model directory {str(folder)!r} has no tokenizer.json (nor another tokenizer file: "
            f"{', '.join(_TOKENIZER_FILES[1:])})" + _inside(folder)
        )


def _inside(folder: Path) -> str:
    """A hint when `folder` is a run (or stage) folder rather than the model inside it."""
    found = sorted(p.parent for p in [*folder.glob("model/config.json"), *folder.glob("*/model/config.json")])
    return f"; did you mean {str(found[-1])!r}?" if found else ""


def looks_like_path(name: str) -> bool:
    """A name a hub id cannot be (`org/name` has one slash, no leading dot, slash or tilde)."""
    return name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1)


def _check_local(name: str, weights: bool = False, tokenizer: bool = False) -> None:
    """A name that is clearly a path must exist: do not send it to the hub (and wait on retries);
    a local directory must hold readable files."""
    folder = Path(name).expanduser()
    if looks_like_path(name) and not folder.is_dir():
        what = (
            "is a file, not a directory"
            if folder.exists()
            else "is a broken symbolic link (or a loop of links)"
            if folder.is_symlink()
            else "does not exist"
        )
        raise ModelNotFoundError(f"model directory {name!r} {what}")
    if folder.is_dir():
        _check_files(folder, weights)
        if tokenizer:
            _check_tokenizer_files(folder)


def load_tokenizer(name: str | os.PathLike) -> PreTrainedTokenizerBase:
    _check_local(str(name), tokenizer=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(name))
    except Exception as err:  # any failure to read a local folder is the folder's (see load_model)
        if not isinstance(err, OSError | ValueError) and not Path(name).expanduser().is_dir():
            raise
        raise _not_found(str(name), err) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.pad_token is None:  # batches could not be padded, nor generation stopped
        raise ModelNotFoundError(
            f"the tokenizer in {str(name)!r} names neither a pad nor an eos token: "
            "set eos_token in its tokenizer_config.json"
        )
    return tokenizer


def load_model(
    name: str | os.PathLike,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    device = device or default_device()
    _check_local(str(name), weights=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(name), dtype=dtype or default_dtype(device))
    except Exception as err:
        # A local folder that fails to load is a bad model folder whatever transformers raises
        # (a config.json missing a size: a validation error; weights of other shapes: a
        # RuntimeError; a garbage pytorch_model.bin: an UnpicklingError), so it is named rather
        # than shown as a traceback; for a hub id only the errors of fetching are.
        if (
            not isinstance(err, OSError | ValueError | SafetensorError)
            and not Path(name).expanduser().is_dir()
        ):
            raise
        raise _not_found(str(name), err) from err
    return model.to(device)


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Write model + tokenizer with `save_pretrained`, atomically: readers never see half a model.

    Under a multi-process launch only the main process writes; the others wait for it."""
    state = distributed.state()
    if state.is_main_process:
        with atomic_dir(out_dir) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    state.wait_for_everyone()
    return Path(out_dir)
