"""The problems of web_shop: one goal on one site, generated per split and admitted only when the
scripted expert solves it through the real env (a goal no one can reach measures nothing).

    ShopTask(site="0:train:17", goal=Goal("buy_qty", "buy 3 red mug", "red mug", ((5, 3),), qty=3))

Each candidate is a new site (its catalogue seeded by `site`, a key of the split's own stream, so
train, test and ood never share a site) and a template from the split's templates, posed on a
seeded subject the site sells:
- train / test: `templates` over the products whose colour is not an ood colour (the ood
  colours' products are on the shelves, but never named by an instruction) and the categories;
- ood: the product templates on products of an `ood_colours` colour (names no train instruction
  ever used), and every `ood_templates` template on any subject.
Rejections, counted by reason (REASONS): `unposable` (a cheapest with no unique minimum, a
category the site does not sell, no product of an ood colour), `duplicate` (the same site and
instruction as an earlier task of any split or an earlier curriculum variant), `expert_failed`
(the scripted expert did not succeed through the env: a bug of the site or the script, never
expected).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from temper.envs.web_shop.env import WebShopEnv
from temper.envs.web_shop.goals import TEMPLATES, Goal, expert_action, make_goal
from temper.envs.web_shop.site import COLOURS, Product, products
from temper.tasks.base import Score

REASONS = ("unposable", "duplicate", "expert_failed")
MAX_BUY_QTY = 5


@dataclass(frozen=True)
class ShopTask:
    site: str
    """The catalogue's seed key (site.products)."""
    goal: Goal

    @property
    def key(self) -> str:
        return f"{self.site}|{self.goal.instruction}"

    def data(self) -> dict[str, Any]:
        return {"site": self.site, "goal": self.goal.data()}

    @staticmethod
    def of(data: dict[str, Any]) -> ShopTask:
        return ShopTask(data["site"], Goal.of(data["goal"]))


@dataclass
class Pool:
    tasks: list[ShopTask] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def subjects(template: str, catalogue: tuple[Product, ...], colours: Iterable[str] | None) -> list[str]:
    """What `template` can be posed on at a site: its products' names (of `colours` only, when
    given) or its categories."""
    if TEMPLATES[template][0] == "category":
        return list(dict.fromkeys(p.category for p in catalogue))
    return [p.name for p in catalogue if colours is None or p.colour in colours]


def pose(template: str, site: str, rng: random.Random, n_products: int, colours: Iterable[str] | None,
         exclude: Iterable[str] = ()) -> ShopTask | None:  # fmt: skip
    """A seeded goal of `template` at `site` (None: nothing to pose it on)."""
    catalogue = products(site, n_products)
    options = [s for s in subjects(template, catalogue, colours) if s not in set(exclude)]
    if not options:
        return None
    qty = rng.randint(2, MAX_BUY_QTY)
    goal = make_goal(template, catalogue, rng.choice(options), qty=qty)
    return None if goal is None else ShopTask(site, goal)


def candidates(config: Any, split: str) -> Iterator[tuple[str, ShopTask | None]]:
    """The split's endless seeded stream of (template, candidate or None) (module docstring)."""
    ood_colours = set(config.ood_colours)
    seen_colours = [c for c in COLOURS if c not in ood_colours]
    if split == "ood":
        arms = [
            (t, sorted(ood_colours)) for t in config.templates if TEMPLATES[t][0] == "product" and ood_colours
        ]
        arms += [(t, None) for t in config.ood_templates]
    else:
        arms = [(t, seen_colours) for t in config.templates]
    if not arms:
        raise ValueError(f"web_shop: no template can pose an {split} task")
    i = 0
    while True:
        template, colours = arms[i % len(arms)]
        site = f"{config.seed}:{split}:{i}"
        yield (
            template,
            pose(template, site, random.Random(f"web_shop:pose:{site}"), config.n_products, colours),
        )
        i += 1


MakeEnv = Callable[[ShopTask], WebShopEnv]


def expert_play(task: ShopTask, make_env: MakeEnv) -> tuple[list[str], Score]:
    """The expert's actions on `task` through a real env (its own server) and the episode's score."""
    env = make_env(task)
    actions: list[str] = []
    try:
        env.reset()
        while True:
            actions.append(expert_action(task.goal, env.page))
            result = env.step(actions[-1])
            if result.done:
                return actions, result.score
    finally:
        env.close()


def admit(stream: Iterable[ShopTask | None], n: int, seen: set[str], max_candidates: int,
          make_env: MakeEnv) -> Pool:  # fmt: skip
    """The first `n` candidates of `stream` that pass (module docstring), at most `max_candidates`
    drawn; `seen` (the keys of earlier pools) is updated in place."""
    counts: Counter = Counter({r: 0 for r in REASONS})
    out = Pool()
    for k, task in enumerate(stream):
        if len(out.tasks) >= n or k >= max_candidates:
            break
        if task is None:
            counts["unposable"] += 1
        elif task.key in seen:
            counts["duplicate"] += 1
        elif not expert_play(task, make_env)[1].correct:
            counts["expert_failed"] += 1
        else:
            seen.add(task.key)
            out.tasks.append(task)
    out.counts = dict(counts) | {"admitted": len(out.tasks)}
    return out
