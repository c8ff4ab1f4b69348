"""Write the parquet files `recipes/sft_from_parquet.yaml` trains on: chat rows in TRL's
conversational format ({"messages": [...]}), made from the arithmetic task's demonstrations
(train split for train.parquet, test split for eval.parquet), as a user's own data set would be.

    python examples/sft_parquet/make_data.py   # rewrites train.parquet and eval.parquet beside it

The rows do not depend on anything but the seed, so rerunning gives the same files.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from temper.catalog import make_task

HERE = Path(__file__).resolve().parent
TASK = {"max_digits": 2, "ood_digits": 3}  # as the recipe's `tasks: arithmetic`
SIZES = {"train": ("train.parquet", 4000), "test": ("eval.parquet", 64)}


def rows(split: str, n: int, seed: int = 0) -> list[dict]:
    task = make_task("arithmetic", **TASK)
    return [
        {"messages": p.messages() + [{"role": "assistant", "content": task.demonstration(p)}]}
        for p in task.sample(split, n, seed)
    ]


def main() -> None:
    for split, (name, n) in SIZES.items():
        table = pa.Table.from_pylist(rows(split, n))
        pq.write_table(table, HERE / name, compression="zstd")
        print(f"{HERE / name}: {table.num_rows} rows, {(HERE / name).stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
