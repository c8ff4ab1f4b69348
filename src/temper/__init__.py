"""temper: post-training language models into agents.

`temper.sft`, `temper.grpo`, `temper.eval`, `temper.run` and `temper.Result` are the Python API
(`temper.api`), imported on first use: `import temper` itself stays cheap (no torch)."""

__version__ = "0.1.0"

API = ("Result", "eval", "grpo", "run", "sft")
"""The names `temper.api` lends this package (the one import of the top layer from the package:
tests/test_layers.py allows it, lazily, and only these)."""


def __getattr__(name: str):
    if name in API:
        from temper import api

        return getattr(api, name)
    raise AttributeError(f"module 'temper' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
