"""web_shop as an environment task: a browser agent on a local shop (WebArena-style, text pages).

    user        buy 3 blue bag                       (the goal, then the home page)
                [1] textbox "search"
                [2] button "go" ...
    assistant   type 1 blue bag
    user        1 found                              (the environment's turns, never trained on)
                [1] link "blue bag 29$"
    assistant   click 1
    user        blue bag 29$ / [1] textbox "qty" 1 / [2] button "add" / [3] link "cart"
    assistant   type 1 3
    user        blue bag x3 87$ / total 87$ / [1] button "pay" / [2] link "home"
    assistant   click 1                              (the order is placed: graded from the server)

Every episode starts its own HTTP server on 127.0.0.1 (server.py) with the site's catalogue and a
fresh state; the outcome is read from the orders the server recorded or the answer (goals.py).
Problems are goals on generated sites, admitted when the expert solves them (pool.py):
- train / test: every template of `templates`, on products whose colour is not an ood colour,
  each split on sites of its own;
- ood: the product templates on products of an `ood_colours` colour (names never in a train
  instruction), plus the `ood_templates` (default none: the tiny model has five).
The admission counts of each split are printed when its pool is built (`admission_counts()`).

Demonstrations (SFT) are the scripted expert's episodes played through the real env, so every
page, signal and outcome is the env's own. `curriculum:` grows the train pool from the goals RL
fails (curriculum.py, WebRL's self-evolving curriculum).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import ClassVar

from temper.envs.command_episodes import PlaysCommands
from temper.envs.curriculum import CurriculumConfig
from temper.envs.web_shop.browser import BrowserUnavailable, find_chromium
from temper.envs.web_shop.curriculum import WebShopCurriculum
from temper.envs.web_shop.env import WebShopEnv
from temper.envs.web_shop.goals import TEMPLATES
from temper.envs.web_shop.pool import Pool, ShopTask, admit, candidates, expert_play
from temper.envs.web_shop.site import CATEGORIES, COLOURS, products
from temper.tasks.base import Problem, check_split, draw

INSTRUCTIONS = (
    "You are shopping on a web site. One action per turn: click ID, type ID TEXT, goto URL, back, "
    "answer TEXT. Placing an order or answering ends the task."
)


@dataclass(frozen=True)
class WebShopConfig:
    templates: tuple[str, ...] = ("buy", "buy_qty", "price", "cheapest", "count")
    """Goal templates of train and test (goals.TEMPLATES)."""
    ood_templates: tuple[str, ...] = ()
    """Templates seen only in ood."""
    ood_colours: tuple[str, ...] = ("gold",)
    """Colours whose products no train or test instruction names; ood names them."""
    train_tasks: int = 160
    test_tasks: int = 40
    ood_tasks: int = 40
    seed: int = 0
    """Seeds the sites and goals (each split its own stream)."""
    n_products: int = 16
    """Products per site (of the 8 colours x 6 categories)."""
    per_page: int = 3
    """Search results per page (the rest behind "next")."""
    max_actions: int = 8
    """Actions per episode; the last one ends it (outcome 0 unless it ordered or answered)."""
    max_chars: int = 160
    """Each page's rendering is cut to this many characters (whole lines, then `[+N more]`)."""
    instructions: bool = False
    """Open the prompt with INSTRUCTIONS (off: the tiny model learns the protocol from demonstrations)."""
    timeout_s: float = 5.0
    """The most one request to the episode's server may take (then an env_error)."""
    backend: str = "text"
    """How pages are loaded: text (urllib and the server's HTML) or chromium (a headless Chromium
    per episode over the DevTools protocol, its DOM parsed; `temper[browser]` and a chromium on
    PATH). Admission always plays the text backend (the same pages, without a browser's start-up)."""
    curriculum: CurriculumConfig | None = None
    """Grow the train pool from the goals RL fails (curriculum.py), e.g. {every: 1,
    variants_per_failure: 2, max_share: 0.5}; None: a fixed pool."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "curriculum", CurriculumConfig.of(self.curriculum))
        for name in ("templates", "ood_templates", "ood_colours"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, valid in (("templates", TEMPLATES), ("ood_templates", TEMPLATES), ("ood_colours", COLOURS)):
            if bad := [v for v in getattr(self, name) if v not in valid]:
                raise ValueError(f"unknown {name} {bad}; valid: {', '.join(valid)}")
        if set(self.templates) & set(self.ood_templates):
            raise ValueError("ood_templates must be unseen: not also in templates")
        if not self.templates or not (self.ood_templates or self.ood_colours):
            raise ValueError("need templates, and at least one ood template or ood colour")
        if len(self.ood_colours) >= len(COLOURS):
            raise ValueError("ood_colours must leave at least one colour for train and test")
        if min(self.train_tasks, self.test_tasks, self.ood_tasks) < 1 or self.max_actions < 2:
            raise ValueError("need at least one task per split and max_actions >= 2")
        if not 1 <= self.n_products <= len(COLOURS) * len(CATEGORIES):
            raise ValueError(
                f"n_products must be in [1, {len(COLOURS) * len(CATEGORIES)}], got {self.n_products}"
            )
        if self.backend not in ("text", "chromium"):
            raise ValueError(f"unknown backend {self.backend!r}; valid: text, chromium")
        if self.backend == "chromium":
            try:
                find_chromium()
            except BrowserUnavailable as e:
                raise ValueError(str(e)) from None
        if self.per_page < 1 or self.max_chars < 40 or self.timeout_s <= 0:
            raise ValueError("need per_page >= 1, max_chars >= 40 and timeout_s > 0")

    def size(self, split: str) -> int:
        return {"train": self.train_tasks, "test": self.test_tasks, "ood": self.ood_tasks}[split]


@functools.cache
def _pools(task: WebShopTask) -> dict[str, Pool]:
    from rich.console import Console

    seen: set[str] = set()
    out = {}
    for split in ("train", "test", "ood"):
        n = task.config.size(split)
        stream = (t for _, t in candidates(task.config, split))
        make_env = functools.partial(task.env_of, backend="text")
        out[split] = admit(stream, n, seen, max_candidates=4 * n + 20, make_env=make_env)
        if len(out[split].tasks) < n:
            raise ValueError(
                f"web_shop: only {len(out[split].tasks)} of {n} {split} tasks admitted {out[split].counts}"
            )
        Console(stderr=True).print(f"[dim]web_shop[/]: {split} admission {out[split].counts}")
    return out


@dataclass(frozen=True)
class WebShopTask(PlaysCommands):
    """Goals on a local shop, reached by clicking and typing through its pages (module docstring)."""

    config: WebShopConfig = field(default_factory=WebShopConfig)
    name: ClassVar[str] = "web_shop"
    config_type: ClassVar[type] = WebShopConfig
    variant_ends: ClassVar[dict[str, tuple[str, ...]]] = {"expert": ("ordered", "right_answer")}
    failure_curriculum: WebShopCurriculum | None = field(default=None, init=False, compare=False, repr=False)
    """The growing train pool under `config.curriculum` (train_rl drives it), else None."""

    def __post_init__(self) -> None:
        if self.config.curriculum is not None:
            object.__setattr__(self, "failure_curriculum", WebShopCurriculum(self, self.config.curriculum))

    @property
    def max_turns(self) -> int:
        return self.config.max_actions

    @property
    def prompt(self) -> str:
        return INSTRUCTIONS if self.config.instructions else ""

    def admitted(self) -> dict[str, Pool]:
        """The admitted pool of each split, train first (the pools do not depend on the curriculum)."""
        from dataclasses import replace

        return _pools(WebShopTask(replace(self.config, curriculum=None)))

    def admission_counts(self) -> dict[str, dict[str, int]]:
        """Per split: candidates admitted and rejected by reason (pool.py)."""
        return {split: a.counts for split, a in self.admitted().items()}

    def problems(self, split: str) -> list[Problem]:
        check_split(split)
        return [
            Problem(self.name, split, f"{split}{i}", t.goal.instruction, t.data())
            for i, t in enumerate(self.admitted()[split].tasks)
        ]

    def problem_key(self, problem: Problem) -> str:
        """The site and the goal (the same instruction on two sites is two tasks): what the
        contamination check matches."""
        return hashlib.sha256(ShopTask.of(problem.data).key.encode()).hexdigest()[:16]

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` goals of `split`: with repeats from train, without from the held-out splits."""
        return draw(self.problems(split), f"web_shop:{split}:{seed}", n, repeat=split == "train")

    def sample_at_step(self, split: str, n: int, seed: int, step: int) -> list[Problem]:
        """`sample`, with the curriculum's variants born before RL step `step` in the train draws."""
        if split == "train" and self.failure_curriculum is not None:
            return self.failure_curriculum.draw(n, seed, step)
        return self.sample(split, n, seed)

    def env_of(self, task: ShopTask, backend: str | None = None) -> WebShopEnv:
        c = self.config
        return WebShopEnv(
            task.goal,
            products(task.site, c.n_products),
            max_actions=c.max_actions,
            per_page=c.per_page,
            max_chars=c.max_chars,
            timeout_s=c.timeout_s,
            preamble=self.prompt,
            backend=backend or c.backend,
        )

    def make_env(self, problem: Problem) -> WebShopEnv:
        return self.env_of(ShopTask.of(problem.data))

    # ---- demonstrations --------------------------------------------------------------------
    def variant(self, problem: Problem) -> str:
        return "expert"

    def commands(self, problem: Problem, variant: str = "expert") -> list[str]:
        """The expert's actions (it reads each page, so they are found by playing it once)."""
        if variant != "expert":
            raise ValueError(f"unknown demonstration variant {variant!r}; valid: expert")
        return expert_play(ShopTask.of(problem.data), self.env_of)[0]

    def corpus_text(self, problem: Problem) -> str:
        return f"{problem.prompt}\n" + "\n".join(self.commands(problem))
