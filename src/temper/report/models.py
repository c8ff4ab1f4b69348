"""What the page header says about the models: the recipe's model, and for each saved model the
tokenizer (class, vocabulary, eos and pad tokens), its chat template and the weights' dtype, read
from the saved folders themselves (what a later `from_pretrained` gets, not what the recipe asked
for), and the precision each stage actually ran in (from its summary).

Only local folders are read (`local_files_only`): the report never reaches the network, so a hub
model the recipe names is shown by name.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import yaml

from temper.report.common import Stage, esc, html_table, read_json

# templates recognized by a marker they contain: a name says more than a hash
_STYLES = (
    ("<|im_start|>", "ChatML"),
    ("<|start_header_id|>", "Llama 3"),
    ("[INST]", "Llama 2 / Mistral"),
    ("<start_of_turn>", "Gemma"),
)


def recipe_model(run_dir: Path) -> tuple[str, str | None]:
    """The recipe's `model:` block in words (preset and seed, or path) and its path if it has one;
    ("", None) without a readable recipe."""
    try:
        model = (yaml.safe_load((run_dir / "recipe.yaml").read_text()) or {}).get("model")
    except (OSError, yaml.YAMLError, AttributeError):
        return "", None
    if not isinstance(model, dict):
        return "", None
    if model.get("preset"):
        return f"preset {model['preset']} (seed {model.get('seed', 0)}), trained from scratch", None
    rest = ", ".join(f"{k}: {v}" for k, v in model.items() if k != "path")
    return f"{model.get('path')}" + (f" ({rest})" if rest else ""), str(model.get("path"))


def template_name(template: Any) -> str:
    """A chat template in one line: its style where recognized, a hash to tell two apart, its size."""
    if not template:
        return "none"
    if isinstance(template, dict):  # several named templates
        return "; ".join(f"{k}: {template_name(v)}" for k, v in template.items())
    from temper.models.tokenizer import CHAT_TEMPLATE, CHAT_TEMPLATE_V1

    style = "temper built-in" if template == CHAT_TEMPLATE else None
    # the template says what it can render, not what the run used (the header's Tools line says that):
    # v1 writes no tool schemas or tool_calls, and a run's inline tools (calculator) need neither
    style = style or ("temper built-in v1, no tool-call syntax" if template == CHAT_TEMPLATE_V1 else None)
    style = style or next((name for marker, name in _STYLES if marker in template), "custom")
    digest = hashlib.sha256(template.encode()).hexdigest()[:10]
    n = len(template.splitlines())
    return f"{style} (sha256 {digest}, {n} line{'s' * (n != 1)})"


def _parameters(folder: Path) -> int | None:
    """Parameter count from the safetensors headers (8-byte length, then JSON): no weights loaded."""
    total, found = 0, False
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                found = True
                count = 1
                for d in t["shape"]:
                    count *= d
                total += count
    return total if found else None


def model_info(folder: Path) -> dict[str, Any]:
    """What a saved model folder holds, for the header; {"error": ...} when it cannot be read."""
    from transformers import AutoTokenizer  # imported here: slow, and only needed with a model

    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        config = read_json(folder / "config.json") or {}
        adapter = read_json(folder / "adapter_config.json")
        params = _parameters(folder)
    except Exception as e:  # noqa: BLE001  # any unreadable folder: a note in the header, never no report
        return {"error": f"{type(e).__name__}: {e}"}
    if adapter:  # a PEFT adapter folder: its weights are the adapter's, over a base named in it
        config = {
            "model_type": f"{adapter.get('peft_type', 'PEFT')} adapter on {adapter.get('base_model_name_or_path')}"
        }
    return {
        "tokenizer": type(tok).__name__,
        "vocab": len(tok),
        "eos": tok.eos_token,
        "pad": tok.pad_token,
        "template": tok.chat_template,
        "model": config.get("model_type", "?"),
        "dtype": config.get("dtype") or config.get("torch_dtype"),
        "parameters": params,
    }


def precision(stage: Stage) -> str:
    """The precision a stage ran in, as its summary recorded it: dtype, and how `auto` chose it."""
    summary = read_json(stage.folder / f"{stage.kind}.json") or {}
    found = summary.get("precision") if isinstance(summary, dict) else None
    if not isinstance(found, dict) or not found:
        return "–"

    def one(p: dict[str, Any]) -> str:
        how = f" ({p['requested']}: {p.get('reason')})" if p.get("requested") == "auto" else ""
        return f"{p.get('dtype', '?')}{how}"

    if "dtype" in found:
        return one(found)
    return ", ".join(f"{mode} {one(p)}" for mode, p in found.items() if isinstance(p, dict))


def models_table(run_dir: Path, stages: list[Stage]) -> str:
    """The recipe's model, then a row per saved model folder (the recipe's own model when it is a
    local folder, then each model stage's output); each distinct chat template in full, collapsed."""
    said, path = recipe_model(run_dir)
    folders: list[tuple[str, Path]] = []

    def saved(folder: Path) -> bool:
        return any((folder / name).exists() for name in ("config.json", "adapter_config.json"))

    if path and saved(Path(path).expanduser()):
        folders.append((path, Path(path).expanduser()))
    folders += [(s.folder.name, s.folder / "model") for s in stages if saved(s.folder / "model")]
    rows, flagged, templates = [], set(), {}
    for name, folder in folders:
        info = model_info(folder)
        if "error" in info:
            flagged.add(len(rows))
            rows.append([name, f"unreadable: {info['error']}", "", "", "", "", "", ""])
            continue
        params = f"{info['parameters']:,}" if info["parameters"] else "?"
        rows.append(
            [
                name,
                f"{info['model']}, {params} parameters, {info['dtype'] or '?'}",
                info["tokenizer"],
                f"{info['vocab']:,}",
                str(info["eos"]),
                str(info["pad"]),
                template_name(info["template"]),
            ]
        )
        if isinstance(info["template"], str):
            templates.setdefault(info["template"], []).append(name)
    head = (
        "<p>"
        + (f"Model: <b>{esc(said)}</b>" if said else "Model: no recipe.yaml in this run folder")
        + "</p>"
    )
    table = html_table(
        rows, ["model", "weights", "tokenizer", "vocab", "eos", "pad", "chat template"], flagged
    )
    full = "".join(
        f"<details><summary>chat template of {esc(', '.join(names))}</summary><pre>{esc(t)}</pre></details>"
        for t, names in templates.items()
    )
    return head + table + full
