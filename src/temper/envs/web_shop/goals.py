"""What an episode asks for: tasks made from TEMPLATES over a site's data, how the outcome is
graded from the server's state, and the scripted expert that solves them.

    template   instruction                 success (read from the server / the answer)
    buy        buy red mug                 one order, exactly {red mug: 1}
    buy_qty    buy 3 red mug               one order, exactly {red mug: 3}
    price      price of red mug?           answer == its price ("4" or "4$")
    cheapest   buy cheapest mug            one order, exactly {the cheapest mug: 1} (a unique minimum)
    count      how many mugs?              answer == the number of mugs the site sells

`product` templates name a product (a colour and a category), `category` ones a category. The
expert (`expert_action`) reads the page it is on and picks by label, never by a fixed id:
search for the product (or category) -> [cheapest: sort "by price"] -> the product's link ->
"add" (or type the quantity, which submits) -> "pay"; price and count answer from the
results page. 4-5 actions for an order, 2 for an answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temper.envs.web_shop.page import Page
from temper.envs.web_shop.site import Product
from temper.tasks.base import Score

TEMPLATES: dict[str, tuple[str, str]] = {
    # name -> (subject kind, instruction format)
    "buy": ("product", "buy {name}"),
    "buy_qty": ("product", "buy {qty} {name}"),
    "price": ("product", "price of {name}?"),
    "cheapest": ("category", "buy cheapest {category}"),
    "count": ("category", "how many {category}s?"),
}
ORDERS = ("buy", "buy_qty", "cheapest")


@dataclass(frozen=True)
class Goal:
    """One task on one site: `order` is the exact order wanted ((product id, qty) pairs) for an
    order template, `answer` the answer wanted for a question."""

    template: str
    instruction: str
    subject: str  # the product's name, or the category
    order: tuple[tuple[int, int], ...] = ()
    answer: str = ""
    qty: int = 1

    def data(self) -> dict[str, Any]:
        return {"template": self.template, "instruction": self.instruction, "subject": self.subject,
                "order": [list(x) for x in self.order], "answer": self.answer, "qty": self.qty}  # fmt: skip

    @staticmethod
    def of(data: dict[str, Any]) -> Goal:
        return Goal(data["template"], data["instruction"], data["subject"],
                    tuple((int(a), int(b)) for a, b in data["order"]), data["answer"], int(data["qty"]))  # fmt: skip


def make_goal(template: str, products: tuple[Product, ...], subject: str, qty: int = 1) -> Goal | None:
    """The goal of `template` on `subject` at a site selling `products`; None when the site
    cannot pose it (the product is not sold; for cheapest, no unique cheapest of 2+)."""
    kind, fmt = TEMPLATES[template]
    if kind == "product":
        p = next((p for p in products if p.name == subject), None)
        if p is None:
            return None
        text = fmt.format(name=subject, qty=qty)
        if template == "price":
            return Goal(template, text, subject, answer=str(p.price))
        return Goal(template, text, subject, order=((p.id, qty if template == "buy_qty" else 1),),
                    qty=qty if template == "buy_qty" else 1)  # fmt: skip
    sold = sorted((p for p in products if p.category == subject), key=lambda p: (p.price, p.id))
    text = fmt.format(category=subject)
    if template == "count":
        return Goal(template, text, subject, answer=str(len(sold))) if sold else None
    if len(sold) < 2 or sold[0].price == sold[1].price:
        return None
    return Goal(template, text, subject, order=((sold[0].id, 1),))


def normalise(answer: str) -> str:
    return answer.strip().lower().removesuffix("$").removeprefix("$").strip()


def grade(goal: Goal, orders: list[dict[int, int]], answer: str | None, invalid: int) -> Score:
    """The outcome from the server's orders and the answer (module docstring): an order template
    wants exactly one order of exactly `goal.order`; a question wants the answer and no order."""
    parsed = invalid == 0
    wanted = dict(goal.order)
    if goal.order:
        if not orders:
            reason = "answered" if answer is not None else "no_end"
            return Score(0.0, False, parsed, {"reason": reason})
        ok = len(orders) == 1 and orders[0] == wanted
        return Score(
            float(ok), ok, parsed, {"reason": "ordered" if ok else "wrong_order", "orders": len(orders)}
        )
    if orders:
        return Score(0.0, False, parsed, {"reason": "ordered_instead", "orders": len(orders)})
    if answer is None:
        return Score(0.0, False, parsed, {"reason": "no_end"})
    ok = normalise(answer) == normalise(goal.answer)
    return Score(
        float(ok), ok, parsed, {"reason": "right_answer" if ok else "wrong_answer", "answer": answer}
    )


def expert_action(goal: Goal, page: Page) -> str:
    """The expert's next action on `page` (module docstring)."""
    els = page.elements
    ids = {(x.kind, x.label): i for i, x in enumerate(els, 1)}
    path = page.url.split("?")[0]
    if ("textbox", "search") in ids:
        query = goal.subject if TEMPLATES[goal.template][0] == "product" else goal.subject
        return f"type {ids[('textbox', 'search')]} {query}"
    if path == "/search":
        if goal.template in ("price", "count"):
            return f"answer {goal.answer}"
        if goal.template == "cheapest":
            if "sort=price" not in page.url:
                return f"click {ids[('link', 'by price')]}"
            return f"click {next(i for i, x in enumerate(els, 1) if x.href.startswith('/p/'))}"
        return f"click {next(i for i, x in enumerate(els, 1) if x.label.startswith(goal.subject + ' '))}"
    if ("button", "add") in ids:
        if goal.qty > 1:
            return f"type {ids[('textbox', 'qty')]} {goal.qty}"
        return f"click {ids[('button', 'add')]}"
    if ("button", "pay") in ids:
        return f"click {ids[('button', 'pay')]}"
    raise AssertionError(f"the expert has no move on {page.url}")  # a bug of the script
