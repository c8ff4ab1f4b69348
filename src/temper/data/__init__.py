from typing import TYPE_CHECKING

from temper.lazy import exports

if TYPE_CHECKING:  # the names, for type checkers; imported on first use (temper.lazy)
    from temper.data.chat import IGNORE, tokenize_example, tokenize_messages
    from temper.data.dataset import DatasetStats, Sequence, build_sequences, collate
    from temper.data.formats import (
        DataError,
        Example,
        LoadReport,
        load_hf_dataset,
        load_jsonl,
        load_rows,
        parse_row,
    )
    from temper.data.sources import read_rows

__getattr__, __dir__ = exports(
    globals(),
    {
        "IGNORE": "chat",
        "tokenize_example": "chat",
        "tokenize_messages": "chat",
        "DatasetStats": "dataset",
        "Sequence": "dataset",
        "build_sequences": "dataset",
        "collate": "dataset",
        "DataError": "formats",
        "Example": "formats",
        "LoadReport": "formats",
        "load_hf_dataset": "formats",
        "load_jsonl": "formats",
        "load_rows": "formats",
        "parse_row": "formats",
        "read_rows": "sources",
    },
)

__all__ = [
    "IGNORE",
    "DataError",
    "DatasetStats",
    "Example",
    "LoadReport",
    "Sequence",
    "build_sequences",
    "collate",
    "load_hf_dataset",
    "load_jsonl",
    "load_rows",
    "parse_row",
    "read_rows",
    "tokenize_example",
    "tokenize_messages",
]
