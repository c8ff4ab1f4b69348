"""Load and save causal LMs through the transformers Auto classes.

A local directory and a hub id go through the same `from_pretrained` call; the built-in
presets are created with `temper pretrain` (or `build_preset`) and saved like any model. A local
PEFT adapter folder (`lora.save: adapter`) loads as its base with the adapter merged in, so
every stage accepts one as its model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from temper import distributed
from temper.atomic import atomic_dir
from temper.models.chat import sync_eos

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ADAPTER_CONFIG = "adapter_config.json"  # what PEFT's save_pretrained writes beside the adapter weights
# in an adapter folder trained on another adapter: the merged model it was trained on, its base
STACKED_BASE = "base"


class ModelNotFoundError(RuntimeError):
    """A model id is neither a local directory nor reachable on the hub."""


def default_device() -> torch.device:
    """This process's device: its own GPU under a multi-GPU launch (cuda:LOCAL_RANK), else cpu."""
    return distributed.state().device


def default_dtype(device: torch.device, saved: torch.dtype | None = None) -> torch.dtype:
    """fp32 on CPU (bf16 matmul on CPUs without native bf16 is ~100x slower), bf16 on CUDA; a
    model `saved` in float64 stays float64 on either: it was saved so for exact arithmetic (the
    pinned recipes, the exactness tests), which a downcast would silently undo."""
    import torch

    if saved == torch.float64:
        return saved
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def saved_dtype(name: str | os.PathLike) -> torch.dtype | None:
    """The dtype a local model folder's config.json records its weights in (`dtype`, or
    transformers 4's `torch_dtype`), or None (a hub id, or no dtype recorded)."""
    import torch

    try:
        config = json.loads((Path(name).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = (config.get("dtype") or config.get("torch_dtype")) if isinstance(config, dict) else None
    found = getattr(torch, text, None) if isinstance(text, str) else None
    return found if isinstance(found, torch.dtype) else None


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
    from safetensors import safe_open

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


def check_local_model(name: str, weights: bool = False, tokenizer: bool = False) -> None:
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
    from transformers import AutoTokenizer

    check_local_model(str(name), tokenizer=True)
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


def is_adapter_dir(name: str | os.PathLike) -> bool:
    """A local folder holding a PEFT adapter (adapter_config.json) rather than a whole model."""
    folder = Path(name).expanduser()
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def adapter_base(folder: str | os.PathLike) -> str:
    """The model an adapter folder was trained on: its `base_model_name_or_path`, a relative path
    taken relative to the adapter folder first (a run folder that was moved with its base inside:
    a folder of the same name under the working directory must not win), then as written, else
    as a hub id."""
    folder = Path(folder).expanduser()
    try:
        base = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelNotFoundError(
            f"{folder / ADAPTER_CONFIG} names no base_model_name_or_path ({err})"
        ) from None
    if not base:
        raise ModelNotFoundError(f"{folder / ADAPTER_CONFIG} names no base_model_name_or_path")
    path = Path(base).expanduser()
    inside = (folder / STACKED_BASE,) if path.name == STACKED_BASE else ()  # moved with its folder
    for candidate in (folder / path, path, *inside):  # folder / an absolute path is that path
        if candidate.is_dir():
            return str(candidate.resolve())
    if looks_like_path(base):
        raise ModelNotFoundError(
            f"the adapter in {str(folder)!r} was trained on {base!r}, which does not exist (base_model_name_or_path "
            f"in {ADAPTER_CONFIG}); put the base model there or edit that field"
        )
    return base  # a hub id


def load_model(
    name: str | os.PathLike,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> PreTrainedModel:
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    if is_adapter_dir(name):
        return _load_adapter(Path(name).expanduser(), device, dtype)
    check_local_model(str(name), weights=True)
    try:
        dtype = dtype or default_dtype(device, saved_dtype(name))
        model = AutoModelForCausalLM.from_pretrained(_absolute(name), dtype=dtype)
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


def _absolute(name: str | os.PathLike) -> str:
    """A local folder as an absolute path (what `name_or_path`, and so an adapter's recorded base,
    becomes), a hub id as it is."""
    folder = Path(name).expanduser()
    return str(folder.resolve()) if folder.is_dir() else str(name)


def _load_adapter(folder: Path, device: torch.device, dtype: torch.dtype | None) -> PreTrainedModel:
    """The adapter's base (itself possibly an adapter folder) with the adapter merged in. Its
    `name_or_path` is the adapter folder, so an adapter trained on it knows its base is an adapter
    (PEFT records `model.name_or_path`, `temper.models.lora.save_adapter` reads it)."""
    from peft import PeftModel
    from safetensors import SafetensorError
    from transformers import GenerationConfig

    _check_files(folder, weights=False)
    base = load_model(adapter_base(folder), device, dtype)
    try:
        model = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    except (OSError, ValueError, SafetensorError) as err:
        raise _not_found(str(folder), err) from err
    if (folder / "generation_config.json").is_file():  # the eos ids this stage saved (sync_eos)
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    model.config._name_or_path = model.name_or_path = str(folder.resolve())
    return model.requires_grad_(True)  # PEFT loads an adapter frozen; a loaded model trains like any other


def save_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    stacked_base: Callable[[], PreTrainedModel] | None = None,
) -> Path:
    """Write model + tokenizer with `save_pretrained`, atomically: readers never see half a model.
    The model's generation config stops at the tokenizer's eos too (`sync_eos`), so a plain
    `generate` on the folder stops where temper's sampler does. A PEFT model writes its adapter
    (adapter_config.json, adapter_model.safetensors) and the generation config beside it, and the
    model `stacked_base` builds (on the main process only), if given, in `<out>/base`, within the
    same atomic write.

    Under a multi-process launch only the main process writes; the others wait for it."""
    state = distributed.state()
    generating = getattr(model, "get_base_model", lambda: model)()
    sync_eos(generating, tokenizer)
    if state.is_main_process:
        with atomic_dir(out_dir) as tmp:
            # a stacked base is the model under the adapter, so its vocabulary is the adapter's;
            # PEFT would otherwise look for the base's config at a path not there until the
            # rename, then on the hub
            model.save_pretrained(tmp, **({"save_embedding_layers": False} if stacked_base else {}))
            tokenizer.save_pretrained(tmp)
            if generating is not model and generating.generation_config is not None:
                generating.generation_config.save_pretrained(tmp)
            if stacked_base is not None:
                base = stacked_base()
                sync_eos(base, tokenizer)
                base.save_pretrained(tmp / STACKED_BASE)
                tokenizer.save_pretrained(tmp / STACKED_BASE)
    state.wait_for_everyone()
    return Path(out_dir)
