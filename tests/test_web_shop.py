"""web_shop (issue 31 items 4-5): the page rendering through a real HTML parser, the shop served over
HTTP per episode, the browser actions, grading from the server's state, admission of the goals per
split, and the WebRL-style curriculum (variants of failures through the gate, a bounded share of
the draws, a resumed RL run drawing what the uninterrupted one drew)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import replace

import pytest

from fakes import Script  # tests/ is on the path (pytest rootdir mode)
from temper.catalog import make_task
from temper.envs.curriculum import CurriculumConfig
from temper.envs.web_shop.curriculum import variant
from temper.envs.web_shop.goals import Goal, grade, make_goal
from temper.envs.web_shop.page import parse, truncate
from temper.envs.web_shop.pool import ShopTask
from temper.envs.web_shop.server import ShopServer, ShopState
from temper.envs.web_shop.site import Product, products
from temper.models import build_preset
from temper.train.rl import RLConfig, train_rl

SHOP = (
    Product(1, "red mug", "mug", "red", 4),
    Product(2, "blue mug", "mug", "blue", 9),
    Product(3, "green mug", "mug", "green", 2),
    Product(4, "red hat", "hat", "red", 30),
    Product(5, "gold mug", "mug", "gold", 7),
)
CURRICULUM = {"every": 1, "variants_per_failure": 2, "max_share": 0.5}


def small(**kw):
    return make_task("web_shop", **({"train_tasks": 6, "test_tasks": 3, "ood_tasks": 3} | kw))


def env_for(goal: Goal, **kw):
    from temper.envs.web_shop.env import WebShopEnv

    return WebShopEnv(goal, SHOP, **kw)


def play(env, actions):
    env.reset()
    results = [env.step(a) for a in actions]
    return results


# ---- the page -------------------------------------------------------------------------------
def test_a_page_is_parsed_into_numbered_elements_and_text():
    body = (
        "<html><head><title>t</title><script>var x = '<a href=/no>no</a>';</script></head><body>"
        "<h1>Caf&eacute; &amp; tea</h1><p>two<br>lines"  # an unclosed <p>, entities
        "<a class=x href='/p/1'>red <b>mug</b></a>"  # single quotes, attribute order, nested tags
        "<form action='/cart' method=POST><input type=hidden name=id value=1>"
        "<input name=qty value=1 aria-label=qty><input placeholder='e-mail' name=m type=email>"
        "<button>add</button></form><input type=submit value=go></body></html>"
    )
    page = parse("/x", 200, body)
    assert page.render(500) == "\n".join([
        "Café & tea", "two", "lines",
        '[1] link "red mug"',
        '[2] textbox "qty" 1', '[3] textbox "e-mail"', '[4] button "add"', '[5] button "go"',
    ])  # fmt: skip
    assert page.forms[0].method == "post" and page.forms[0].hidden == {"id": "1"}
    assert page.element(4).form == 0 and page.element(5).form is None and page.element(6) is None
    assert page.element(1).href == "/p/1" and page.element(0) is None


def test_truncation_keeps_whole_lines_and_says_how_many_are_left_out():
    lines = [f"line {i}" for i in range(10)]
    cut = truncate(lines, 30)
    assert cut == "line 0\nline 1\nline 2\n[+7 more]" and len(cut) <= 30
    assert truncate(lines[:2], 30) == "line 0\nline 1"
    page = parse("/", 200, "".join(f"<a href='/{i}'>item {i}</a>" for i in range(9)))
    short = page.render(40)
    assert short.startswith('[1] link "item 0"') and short.endswith("more]")
    assert page.element(9).href == "/8"  # ids never depend on the budget


# ---- the server -----------------------------------------------------------------------------
def get(server, path, data=None):
    req = urllib.request.Request(server.base + path, data=data)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_shop_serves_search_pages_a_cart_and_orders_on_its_own_state():
    a, b = ShopState(SHOP, per_page=2), ShopState(SHOP)
    sa, sb = ShopServer(a), ShopServer(b)
    try:
        assert sa.base.startswith("http://127.0.0.1:") and sa.port != sb.port
        status, body = get(sa, "/search?c=mug&sort=price")
        page = parse("/search", status, body)
        assert page.render(500).splitlines()[:3] == [
            "4 found",
            '[1] link "green mug 2$"',
            '[2] link "red mug 4$"',
        ]
        assert page.element(3).label == "next" and "page=2" in page.element(3).href
        _, body2 = get(sa, "/search?c=mug&sort=price&page=2")
        assert "gold mug 7$" in body2 and "blue mug 9$" in body2 and "next" not in body2
        assert "1 found" in get(sa, "/search?q=RED+hat")[1] and "0 found" in get(sa, "/search?q=red+lamp")[1]
        assert "1 found" in get(sa, "/search?c=mug&max=3")[1]
        assert get(sa, "/search?max=cheap")[0] == 400 and get(sa, "/p/99")[0] == 404
        assert get(sa, "/order", b"")[0] == 400  # an empty cart cannot be paid
        assert get(sa, "/cart", b"id=2&qty=12")[0] == 400 and a.cart == {}
        status, body = get(sa, "/cart", b"id=2&qty=3")  # 303 -> the cart page
        assert status == 200 and "blue mug x3 27$" in body and a.cart == {2: 3}
        status, body = get(sa, "/order", b"")
        assert "order 1 placed" in body and a.orders == [{2: 3}] and a.cart == {}
        assert b.orders == [] and b.cart == {}  # another episode's server: its own state
    finally:
        sa.close()
        sb.close()
    sa.close()  # idempotent
    with pytest.raises(urllib.error.URLError):
        get(sa, "/")


# ---- the actions and the grade --------------------------------------------------------------
def test_the_expert_path_orders_through_real_requests_and_is_graded_from_the_server():
    goal = make_goal("buy_qty", SHOP, "blue mug", qty=3)
    env = env_for(goal)
    first = env.reset()[0]["content"]
    assert first.startswith('buy 3 blue mug\n[1] textbox "search"')
    r = env.step("type 1 blue mug")
    assert r.messages[0]["content"] == '1 found\n[1] link "blue mug 9$"'
    assert env.step("click 1").messages[0]["content"].splitlines()[1] == '[1] textbox "qty" 1'
    assert "blue mug x3 27$" in env.step("type 1 3").messages[0]["content"]
    end = env.step("click 1")
    assert end.done and end.score.correct and end.score.details["reason"] == "ordered"
    assert env.server is None and env.state.orders == [{2: 3}]  # closed at the end


def test_actions_that_are_malformed_offsite_or_wrong_are_observations_never_errors():
    goal = make_goal("price", SHOP, "red hat")
    env = env_for(goal, max_actions=8)
    env.reset()
    port = env.server.port
    obs = [env.step(a) for a in ("jump 1", "click 9", "click 1", "type 3 x", "goto http://example.com/",
                                 f"goto http://127.0.0.1:{port + 1}/", "back")]  # fmt: skip
    text = [o.messages[0]["content"] for o in obs]
    assert text[:4] == [
        "unknown action",
        "no element 9",
        "1 is a textbox: type into it",
        "3 is not a textbox",
    ]
    assert text[4] == text[5] == "refused: not this shop"
    assert text[6] == "no page to go back to"
    assert [o.signals["invalid"] for o in obs] == [1, 1, 1, 1, 0, 0, 0]
    assert [o.signals["offsite"] for o in obs] == [0, 0, 0, 0, 1, 1, 0]
    last = env.step("answer 30$")  # the eighth action; answered: graded, but not parsed (4 invalid)
    assert last.done and last.score.correct and not last.score.parsed
    assert last.score.details["offsite"] == 2 and last.score.details["invalid"] == 4


def test_goto_back_and_the_action_limit():
    env = env_for(make_goal("buy", SHOP, "red mug"), max_actions=3)
    env.reset()
    assert (
        env.step(f"goto http://127.0.0.1:{env.server.port}/cart")
        .messages[0]["content"]
        .startswith("cart empty")
    )
    assert env.step("back").messages[0]["content"].startswith('[1] textbox "search"')
    end = env.step("goto /categories")
    assert end.done and end.score.reward == 0 and end.score.details["reason"] == "no_end"


@pytest.mark.parametrize(
    ("goal", "orders", "answer", "reason", "correct"),
    [
        (Goal("buy_qty", "buy 3 red mug", "red mug", ((1, 3),), qty=3), [{1: 3}], None, "ordered", True),
        (Goal("buy_qty", "buy 3 red mug", "red mug", ((1, 3),), qty=3), [{1: 2}], None, "wrong_order", False),
        (Goal("buy", "buy red mug", "red mug", ((1, 1),)), [{1: 1, 2: 1}], None, "wrong_order", False),
        (Goal("buy", "buy red mug", "red mug", ((1, 1),)), [{1: 1}, {1: 1}], None, "wrong_order", False),
        (Goal("buy", "buy red mug", "red mug", ((1, 1),)), [], "4", "answered", False),
        (Goal("price", "price of red mug?", "red mug", answer="4"), [], " $4 ", "right_answer", True),
        (Goal("price", "price of red mug?", "red mug", answer="4"), [], "40", "wrong_answer", False),
        (Goal("count", "how many mugs?", "mug", answer="4"), [{1: 1}], "4", "ordered_instead", False),
        (Goal("count", "how many mugs?", "mug", answer="4"), [], None, "no_end", False),
    ],
)
def test_the_grade_reads_the_orders_and_the_answer(goal, orders, answer, reason, correct):
    score = grade(goal, orders, answer, invalid=0)
    assert score.details["reason"] == reason and score.correct is correct and score.reward == float(correct)


def test_goals_are_posed_only_where_the_site_can_answer_them():
    assert make_goal("cheapest", SHOP, "mug").order == ((3, 1),)
    assert make_goal("cheapest", SHOP, "hat") is None  # one hat: no "cheapest of 2+"
    tie = (*SHOP, Product(6, "pink mug", "mug", "pink", 2))
    assert make_goal("cheapest", tie, "mug") is None  # no unique minimum
    assert make_goal("count", SHOP, "mug").answer == "4" and make_goal("count", SHOP, "lamp") is None
    assert make_goal("buy", SHOP, "pink sock") is None


# ---- the task -------------------------------------------------------------------------------
def test_splits_are_disjoint_sites_and_ood_names_only_unseen_colours():
    task = make_task("web_shop", train_tasks=40, test_tasks=10, ood_tasks=10)
    by = {s: [ShopTask.of(p.data) for p in task.problems(s)] for s in ("train", "test", "ood")}
    sites = {s: {t.site for t in ts} for s, ts in by.items()}
    assert not (sites["train"] & sites["test"]) and not (sites["train"] & sites["ood"])
    named = {s: {t.goal.subject.split()[0] for t in ts if " " in t.goal.subject} for s, ts in by.items()}
    assert "gold" not in named["train"] | named["test"] and named["ood"] == {"gold"}
    assert set(Counter(t.goal.template for t in by["train"])) == {
        "buy",
        "buy_qty",
        "price",
        "cheapest",
        "count",
    }
    keys = [task.problem_key(p) for s in by for p in task.problems(s)]
    assert len(set(keys)) == len(keys)
    counts = task.admission_counts()
    assert counts["train"]["admitted"] == 40 and counts["train"]["expert_failed"] == 0
    assert task.problems("train")[0].prompt == by["train"][0].goal.instruction


def test_every_demonstration_is_the_experts_real_episode():
    task = small()
    for p in task.problems("train") + task.problems("ood"):
        messages = task.demonstration_messages(p)
        assert messages[0]["content"].startswith(p.prompt + "\n[1] textbox")
        assert [m["role"] for m in messages[1:]] == ["assistant", "user"] * (len(messages) // 2 - 1) + [
            "assistant"
        ]
        assert task.score(p, task.demonstration(p)).correct
    p = task.problems("test")[0]
    assert not task.score(p, "click 3\nback").correct
    env = make_task("web_shop", train_tasks=2, test_tasks=1, ood_tasks=1, instructions=True).make_env(p)
    try:
        assert env.reset()[0]["content"].startswith("You are shopping")
    finally:
        env.close()


def test_an_expert_that_fails_is_rejected_by_the_gate(monkeypatch):
    import temper.envs.web_shop.pool as pool

    monkeypatch.setattr(pool, "expert_action", lambda goal, page: "answer nothing")
    out = pool.admit((t for _, t in pool.candidates(small().config, "train")), 3, set(), 10, small().env_of)
    assert out.tasks == [] and out.counts["expert_failed"] == 10 - out.counts["unposable"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"templates": ["buy", "sell"]}, "unknown templates ['sell']"),
        ({"ood_templates": ["buy"]}, "ood_templates must be unseen"),
        ({"ood_colours": ["teal"]}, "unknown ood_colours ['teal']"),
        ({"ood_colours": []}, "at least one ood template or ood colour"),
        ({"max_actions": 1}, "max_actions >= 2"),
        ({"n_products": 100}, "n_products must be in [1, 48]"),
        ({"curriculum": {"every": 1, "often": 2}}, "unknown curriculum options ['often']"),
    ],
)
def test_bad_options_name_the_option(options, message):
    with pytest.raises(ValueError) as e:
        make_task("web_shop", **options)
    assert message in str(e.value)


# ---- the curriculum -------------------------------------------------------------------------
def test_a_variant_keeps_the_site_and_template_and_asks_for_something_near():
    site = "0:train:5"
    catalogue = products(site)
    parent = next(
        ShopTask(site, g)
        for p in catalogue
        if p.colour != "gold" and (g := make_goal("buy_qty", catalogue, p.name, qty=2)) is not None
    )
    v = variant(parent, "k:0", 16, ("gold",))
    old = next(p for p in catalogue if p.name == parent.goal.subject)
    new = next(p for p in catalogue if p.name == v.goal.subject)
    assert v.site == site and v.goal.template == "buy_qty" and new.name != old.name
    assert (
        new.colour != "gold"
        and (new.colour == old.colour or new.category == old.category)
        or not any(
            p.name != old.name and (p.colour == old.colour or p.category == old.category) for p in catalogue
        )
    )
    assert variant(parent, "k:0", 16, ("gold",)) == v  # seeded
    count = ShopTask(site, make_goal("count", catalogue, catalogue[0].category))
    assert variant(count, "k:1", 16, ("gold",)).goal.subject != count.goal.subject


def test_the_pool_grows_from_failures_through_the_gate_within_a_bounded_share(monkeypatch):
    task = small(curriculum=CURRICULUM)
    c = task.failure_curriculum
    c.resume("/nonexistent", 0, main=False)
    ids = [p.id for p in c.originals()]
    known = ShopTask.of(task.problems("test")[0].data)
    real = type(c).make_variant

    def planted(self, parent, key):
        return known if key.endswith(":0") else real(self, parent, key)  # a test task: a duplicate

    monkeypatch.setattr(type(c), "make_variant", planted)
    row = c.after_step(1, [(ids[0], True), (ids[1], False)])
    assert row["curriculum/rejected/duplicate"] == 1 and row["curriculum/admitted"] == 1
    [born] = c.generated()
    assert born.id == "gen1_0" and born.data["parent"] == ids[0] and born.split == "train"
    assert ShopTask.of(born.data).site == ShopTask.of(c.originals()[0].data).site
    assert c.draw(20, 3, 0) == task.sample("train", 20, 3)  # nothing born before step 1
    share = sum(p.id.startswith("gen") for p in c.draw(400, 3, 1)) / 400
    assert 0.08 < share <= 1 / 7 + 0.05  # min(max_share, 1 generated / 7 in the pool)
    fixed = small(curriculum=CURRICULUM | {"weighting": "fixed"}).failure_curriculum
    fixed.born = c.born
    share = sum(p.id.startswith("gen") for p in fixed.draw(400, 3, 1)) / 400
    assert 0.43 < share < 0.57  # max_share of the draws, whatever the pool's size
    assert task.problems("train") == small().problems("train")  # the splits never change


def test_an_rl_run_grows_the_curriculum_and_a_resumed_run_draws_the_same(tokenizer, tmp_path):
    """A scripted policy that answers at once fails every goal: the pool grows every step."""
    answer = Script(tokenizer, lambda text, j: "answer 0")
    config = RLConfig(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=8, max_turns=8,
                      save_every=2, lr=1e-3, seed=0, progress=False, log_rollouts=100)  # fmt: skip

    def run(out, **kw):
        model = build_preset("nano", tokenizer, seed=1)
        return train_rl(model, tokenizer, [small(curriculum=CURRICULUM)], config, out, sampler=answer, **kw)

    full = run(tmp_path / "a")
    sizes = [r["curriculum/pool_size"] for r in full.history]
    assert sizes == sorted(sizes) and sizes[-1] > 6

    class Stop(Exception):
        pass

    def crash(step, row):
        if step == 3:
            raise Stop

    with pytest.raises(Stop):
        run(tmp_path / "b", callbacks=[crash])
    run(tmp_path / "b")

    def drawn(out):
        rows = [json.loads(ln) for ln in (out / "rollouts.jsonl").read_text().splitlines()]
        return [[r["problem"] for r in rows if r["step"] == s] for s in (1, 2, 3, 4)]

    a = drawn(tmp_path / "a")
    assert drawn(tmp_path / "b") == a and any(i.startswith("gen") for s in a[2:] for i in s)
    log = "curriculum_web_shop.jsonl"
    assert (tmp_path / "b" / log).read_text() == (tmp_path / "a" / log).read_text()


def test_the_curriculum_config_is_shared_with_code_repair():
    assert small(curriculum=CURRICULUM).config.curriculum == CurriculumConfig(**CURRICULUM)
    assert replace(small().config, curriculum=None).curriculum is None


# ---- the chromium backend -------------------------------------------------------------------
def _chromium_or_skip():
    from temper.envs.web_shop.browser import BrowserUnavailable, find_chromium

    pytest.importorskip("websockets")
    try:
        find_chromium()
    except BrowserUnavailable:
        pytest.skip("no chromium on PATH")


def test_a_real_browser_shows_the_same_pages_and_reaches_the_same_outcome():
    """The expert's episode through headless Chromium (its DOM after each load, its own form
    submissions and redirects) is the text backend's, page for page."""
    _chromium_or_skip()
    text, browser = small(), small(backend="chromium")
    for p in [text.problems("train")[i] for i in (0, 1, 3)] + text.problems("ood")[:1]:
        actions = text.commands(p)
        a_messages, a_results = text.play(p, actions)
        b_messages, b_results = browser.play(p, actions)
        assert b_messages == a_messages and b_results[-1].score == a_results[-1].score
        assert b_results[-1].score.correct
    env = browser.make_env(text.problems("test")[0])
    env.reset()
    try:
        process, profile = env.browser.process, env.browser.profile
        assert env.step("goto /p/999").messages[0]["content"].startswith("404 no such product")
        assert env.step("back").messages[0]["content"].startswith('[1] textbox "search"')
    finally:
        env.close()
    assert process.poll() is not None and not profile.exists()  # the browser is gone with the episode


def test_the_chromium_backend_is_refused_in_one_line_without_a_browser(monkeypatch):
    import temper.envs.web_shop.browser as browser

    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="none of chromium, chromium-browser, google-chrome is on PATH"):
        make_task("web_shop", backend="chromium")
    with pytest.raises(ValueError, match="unknown backend 'firefox'"):
        make_task("web_shop", backend="firefox")
