"""The toy shop world of the `multi_tool` task: items with a price in their home currency, and
exchange rates reached through opaque rate ids. Pure standard library, so the local tools and the
MCP server that serves them (`temper.envs.mcp_servers.shop`) are the same functions and start fast.

    price("kadu")             -> "7 usd"         the item's price in its home currency
    rate("usd", "eur")        -> "r417"          the id of the usd->eur rate (the factor stays hidden)
    convert(7, "r417")        -> 21              amount x the rate's factor (needs price and rate first)
    quote("kadu", "eur")      -> 21              the same in one call, at a much higher cost

Everything is a pure function of `seed` (the world), so a server started with `--seed N` answers
exactly as the local tools of `ShopWorld(N)`. Item names are made-up syllable pairs: the policy has
to copy them from the prompt into its calls, and the ood split asks about items it never saw.
Factors are whole numbers so every answer is an integer; the world is a toy, not an economy
(usd->eur and eur->usd are drawn independently).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

CURRENCIES = ("usd", "eur", "gbp", "yen")
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


@dataclass(frozen=True)
class Item:
    name: str
    currency: str
    price: int


@functools.cache
def world(seed: int = 0, n_items: int = 64) -> ShopWorld:
    """The world of `seed` (cached: every env and the server share one)."""
    return ShopWorld(seed, n_items)


class ShopWorld:
    """`n_items` items (the first ones are the train/test items, the task takes the rest as ood),
    a price of 2..9 in a home currency each, and a factor of 2..9 with a distinct id `rNNN` for each
    ordered pair of currencies."""

    def __init__(self, seed: int = 0, n_items: int = 64):
        rng = random.Random(f"shop:{seed}")
        names: list[str] = []
        while len(names) < n_items:
            name = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(2))
            if name not in names:
                names.append(name)
        self.items = {n: Item(n, rng.choice(CURRENCIES), rng.randint(2, 9)) for n in names}
        pairs = [(a, b) for a in CURRENCIES for b in CURRENCIES if a != b]
        ids = rng.sample(range(100, 1000), len(pairs))
        self.factors = {(a, b): rng.randint(2, 9) for a, b in pairs}
        self.rate_ids = {pair: f"r{i}" for pair, i in zip(pairs, ids, strict=True)}
        self.pairs = {v: k for k, v in self.rate_ids.items()}

    def answer(self, item: str, currency: str) -> int:
        """The price of `item` in `currency` (what every correct chain of calls arrives at)."""
        it = self.items[item]
        return it.price if it.currency == currency else it.price * self.factors[(it.currency, currency)]

    # The tools. Their docstrings and type hints are their schemas (`temper.tools.calls`); their
    # exceptions are the model's mistakes, shown to it as error observations.

    def price(self, item: str) -> str:
        """The price of an item in its home currency, e.g. "7 usd".

        Args:
            item: the item's name
        """
        if item not in self.items:
            raise ValueError(f"no item named {item!r}")
        it = self.items[item]
        return f"{it.price} {it.currency}"

    def rate(self, src: str, dst: str) -> str:
        """The id of the exchange rate from one currency to another (pass it to convert).

        Args:
            src: the currency to convert from (usd, eur, gbp or yen)
            dst: the currency to convert to (usd, eur, gbp or yen)
        """
        for c in (src, dst):
            if c not in CURRENCIES:
                raise ValueError(f"no currency {c!r}; the currencies are {', '.join(CURRENCIES)}")
        if src == dst:
            raise ValueError(f"{src} to {dst} needs no rate")
        return self.rate_ids[(src, dst)]

    def convert(self, amount: int, rate_id: str) -> int:
        """An amount converted at a rate (the id that rate returned).

        Args:
            amount: the amount in the rate's source currency
            rate_id: the rate's id
        """
        if rate_id not in self.pairs:
            raise ValueError(f"no rate with id {rate_id!r}")
        return amount * self.factors[self.pairs[rate_id]]

    def quote(self, item: str, currency: str) -> int:
        """The price of an item in any currency, in one call.

        Args:
            item: the item's name
            currency: the currency of the price (usd, eur, gbp or yen)
        """
        if currency not in CURRENCIES:
            raise ValueError(f"no currency {currency!r}; the currencies are {', '.join(CURRENCIES)}")
        self.price(item)  # the same error for an unknown item
        return self.answer(item, currency)

    def tools(self) -> list:
        return [self.price, self.rate, self.convert, self.quote]
