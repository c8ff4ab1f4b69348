"""A corpus mixed from named sources at stated token shares (continued pre-training with a data
mix against forgetting: e.g. 80% new language + 20% old, the seed's 7-5).

Source s gets `share_s * tokens` tokens: its examples in a seeded order, taken whole until its
target is reached (the last one may overshoot by less than one example), from the start again
when a source is shorter than its target (`passes` counts how many times it was read through).
The streams are interleaved evenly: an example sits at the point of its own stream it ends,
`(tokens of its source before it + its tokens) / target`, so every stretch of the corpus holds
the sources at about their shares, not one source after another. A source at share 0 adds
nothing. What each source was asked for and what it gave is returned beside the examples (the
pretrain stage writes it into pretrain.json).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from temper.data.formats import Example


def mix_examples(
    sources: dict[str, list[Example]],
    shares: dict[str, float],
    tokens: int,
    count: Callable[[Example], int],
    seed: int,
) -> tuple[list[Example], dict[str, dict[str, float | int]]]:
    """The interleaved examples and, per source, its share, target, tokens taken, realised share,
    examples and passes; `count` is an example's token count (as the packer will see it)."""
    if not math.isclose(sum(shares.values()), 1.0, abs_tol=1e-6):
        raise ValueError(f"mix shares must sum to 1, got {sum(shares.values()):g}")
    keyed: list[tuple[float, int, Example]] = []
    stats: dict[str, dict[str, float | int]] = {}
    for order, (name, share) in enumerate(shares.items()):
        target = round(share * tokens)
        rows = list(sources[name])
        if target and not rows:
            raise ValueError(f"mix source {name!r} has no text to give its share {share:g}")
        random.Random(f"mix:{seed}:{name}").shuffle(rows)
        taken = n = 0
        while taken < target:
            ex = rows[n % len(rows)]
            taken += count(ex)
            n += 1
            keyed.append((taken / target, order, ex))
        stats[name] = {
            "share": share,
            "target_tokens": target,
            "tokens": taken,
            "examples": n,
            "passes": math.ceil(n / len(rows)) if rows else 0,
        }
    total = sum(s["tokens"] for s in stats.values()) or 1
    for s in stats.values():
        s["realised_share"] = s["tokens"] / total
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [ex for _, _, ex in keyed], stats
