"""The shop's data: a seeded catalogue of products, each a (colour, category) pair with a price.

    products(seed) -> (Product(id=1, name="red mug", category="mug", colour="red", price=4), ...)

A site holds `n_products` of the COLOURS x CATEGORIES pairs (a seeded sample, so which products a
site has differs from site to site), each with a seeded price in [min_price, max_price] dollars.
A product's name is "<colour> <category>", unique within a site, so "buy the red mug" names one
product wherever it is sold. Ids are 1..n in catalogue order (what product URLs carry).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

COLOURS = ("red", "blue", "green", "black", "white", "pink", "grey", "gold")
CATEGORIES = ("mug", "lamp", "sock", "hat", "pen", "bag")


@dataclass(frozen=True)
class Product:
    id: int
    name: str
    category: str
    colour: str
    price: int
    """Whole dollars."""


def products(seed: int, n_products: int = 16, min_price: int = 2, max_price: int = 60) -> tuple[Product, ...]:
    """The catalogue of the site seeded by `seed` (module docstring)."""
    pairs = [(c, k) for k in CATEGORIES for c in COLOURS]
    if not 1 <= n_products <= len(pairs):
        raise ValueError(f"n_products must be in [1, {len(pairs)}], got {n_products}")
    rng = random.Random(f"web_shop:site:{seed}")
    chosen = rng.sample(pairs, n_products)
    prices = [rng.randint(min_price, max_price) for _ in chosen]
    return tuple(
        Product(i, f"{colour} {category}", category, colour, price)
        for i, ((colour, category), price) in enumerate(zip(chosen, prices, strict=True), 1)
    )


def matches(product: Product, query: str) -> bool:
    """The shop's search: every word of the query is a word of the name (case-insensitive)."""
    words = set(product.name.split())
    return all(w in words for w in query.lower().split())
