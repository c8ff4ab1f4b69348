"""web_shop's self-evolving curriculum (WebRL, Qi et al. 2024, §3.2; the growth, the bounded-share
draw and the log are `temper.envs.curriculum`'s).

    web_shop: {curriculum: {every: 1, variants_per_failure: 2, max_share: 0.5}}

WebRL rewrites an instruction the agent failed into nearby new ones on the same website. Here a
variant of a failed task keeps its site and its template and changes what it is about: another
subject the site sells that the split may name (for a product template a product sharing the
failed one's category or colour when the site has one, else any allowed product; for a category
template another category), and a new seeded quantity for buy_qty. So the policy meets the skill
it lacks (this kind of request on this shop) again in another surface form. Variants pass the
same gate as every task (pool.py: posable, not a duplicate of any split or earlier variant,
solved by the expert).
"""

from __future__ import annotations

import functools
import random
from typing import Any

from temper.envs.curriculum import Curriculum
from temper.envs.web_shop.goals import TEMPLATES, make_goal
from temper.envs.web_shop.pool import MAX_BUY_QTY, REASONS, ShopTask, admit
from temper.envs.web_shop.site import products
from temper.tasks.base import Problem


def variant(parent: ShopTask, key: str, n_products: int, ood_colours: tuple[str, ...]) -> ShopTask | None:
    """A seeded variant of `parent` (module docstring); None when the site has no other subject."""
    rng = random.Random(f"web_shop:variant:{key}")
    catalogue = products(parent.site, n_products)
    goal = parent.goal
    if TEMPLATES[goal.template][0] == "category":
        options = [c for c in dict.fromkeys(p.category for p in catalogue) if c != goal.subject]
    else:
        allowed = [p for p in catalogue if p.colour not in ood_colours]
        old = next((p for p in catalogue if p.name == goal.subject), None)
        near = [
            p
            for p in allowed
            if old and p.name != old.name and (p.colour == old.colour or p.category == old.category)
        ]
        options = [p.name for p in (near or [p for p in allowed if p.name != goal.subject])]
    if not options:
        return None
    new = make_goal(goal.template, catalogue, rng.choice(options), qty=rng.randint(2, MAX_BUY_QTY))
    return None if new is None else ShopTask(parent.site, new)


class WebShopCurriculum(Curriculum):
    """The growing train pool of one WebShopTask (module docstring)."""

    reasons = REASONS

    def parent(self, problem: Problem) -> ShopTask:
        return ShopTask.of(problem.data)

    def make_variant(self, parent: ShopTask, key: str) -> ShopTask | None:
        c = self.task.config
        return variant(parent, key, c.n_products, c.ood_colours)

    def gate(self, candidates: list[ShopTask], seen: set[str]) -> tuple[list[ShopTask], dict[str, int]]:
        text = functools.partial(self.task.env_of, backend="text")  # the same pages, no browser start-up
        out = admit(iter(candidates), len(candidates), set(seen), len(candidates), text)
        return out.tasks, out.counts

    def candidate_key(self, candidate: ShopTask) -> str:
        return candidate.key

    def candidate_data(self, candidate: ShopTask) -> dict[str, Any]:
        return candidate.data()

    def known_keys(self) -> set[str]:
        return {t.key for pool in self.task.admitted().values() for t in pool.tasks}

    def generated_key(self, problem: Problem) -> str:
        return ShopTask.of(problem.data).key
