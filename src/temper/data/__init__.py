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
