from temper.data.chat import IGNORE, tokenize_example, tokenize_messages
from temper.data.dataset import DatasetStats, Sequence, build_sequences, collate
from temper.data.formats import DataError, Example, LoadReport, load_hf_dataset, load_jsonl, parse_row

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
    "parse_row",
    "tokenize_example",
    "tokenize_messages",
]
