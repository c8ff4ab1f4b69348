"""One browser episode on the shop: the agent writes one action per turn, the env carries it out
with real HTTP requests to the episode's own server (server.py) and answers with the page
rendered as text (page.py).

    click ID        a link: GET its href; a button: submit its form with the values typed so far
    type ID TEXT    fill the textbox ID with TEXT and submit its form (WebArena's default: type,
                    then Enter)
    goto URL        GET a path of the shop ("/cart", or http://127.0.0.1:<its port>/...); any other
                    URL is refused, not fetched (signal `offsite`)
    back            the previous page (pages reached by GET, a form's redirect included)
    answer TEXT     end the episode with TEXT as the answer

Only the first non-empty line of a turn is read. A malformed action, an id with no element, a
`type` into something that is not a textbox or a `click` on one is an observation ("unknown
action", "no element 7", ...) counted as `invalid`, never an exception. The episode ends when an
order is placed (the shop's checkout is final), at `answer`, or at the `max_actions`-th action
(outcome 0, reason no_end). The outcome is read from the SERVER's state (goals.grade): the orders
placed, not the pages the agent saw. A server that does not answer within `timeout_s` is an
infrastructure error (one line), which the agent loop records as env_error.

Backends: `text` (the default) requests each page with urllib and parses the server's HTML;
`chromium` has a real headless browser (browser.py, one per episode) load each page and submit
each form, and parses the browser's DOM. The pages, ids and actions are the same.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from temper.envs.base import StepResult
from temper.envs.web_shop.browser import ChromiumBrowser
from temper.envs.web_shop.goals import Goal, grade
from temper.envs.web_shop.page import Element, Page, parse
from temper.envs.web_shop.server import ShopServer, ShopState
from temper.envs.web_shop.site import Product

_CLICK = re.compile(r"^click (\d+)$")
_TYPE = re.compile(r"^type (\d+) (.+)$")
_GOTO = re.compile(r"^goto (\S+)$")
_ANSWER = re.compile(r"^answer (.+)$")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by the env (a form's 303 becomes a GET the history records)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class WebShopEnv:
    """One episode (module docstring): its server starts at `reset`, stops at `close`."""

    stop: Sequence[str] = ()

    def __init__(
        self,
        goal: Goal,
        products: tuple[Product, ...],
        *,
        max_actions: int = 8,
        per_page: int = 3,
        max_chars: int = 160,
        timeout_s: float = 5.0,
        preamble: str = "",
        backend: str = "text",
    ):
        self.goal, self.products = goal, products
        self.max_actions, self.per_page, self.max_chars, self.timeout_s = (
            max_actions,
            per_page,
            max_chars,
            timeout_s,
        )
        self.preamble, self.backend = preamble, backend
        self.server: ShopServer | None = None
        self.browser: ChromiumBrowser | None = None
        # no proxies (a proxy variable must never route 127.0.0.1 elsewhere), no automatic redirects
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)

    # ---- lifecycle -------------------------------------------------------------------------
    def reset(self) -> list[dict[str, Any]]:
        self.close()
        self.state = ShopState(self.products, per_page=self.per_page)
        self.server = ShopServer(self.state)
        if self.backend == "chromium":
            self.browser = ChromiumBrowser(self.timeout_s)
        self.actions = self.invalid = self.offsite = 0
        self.history: list[str] = []
        self.values: dict[int, str] = {}  # element id -> text typed into it on this page
        self.page = self._load("GET", "/")
        opening = f"{self.preamble}\n" if self.preamble else ""
        return [{"role": "user", "content": f"{opening}{self.goal.instruction}\n{self.render()}"}]

    def close(self) -> None:
        if self.browser is not None:
            self.browser.close()
            self.browser = None
        if self.server is not None:
            self.server.close()
            self.server = None

    def render(self) -> str:
        return self.page.render(self.max_chars)

    # ---- HTTP ------------------------------------------------------------------------------
    def _fetch(self, method: str, path: str, data: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(status, body, location) of one request to the episode's server; errors are pages."""
        url = urljoin(self.server.base + "/", path)
        body = urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(url, data=body, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as r:
                return r.status, r.read().decode(errors="replace"), ""
        except urllib.error.HTTPError as e:  # 3xx (not followed here) and 4xx pages
            with e:
                return e.code, e.read().decode(errors="replace"), e.headers.get("Location", "")
        except (TimeoutError, urllib.error.URLError, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            raise RuntimeError(
                f"web_shop server {self.server.base} did not answer {method} {path} within {self.timeout_s}s: {reason}"
            ) from None

    def _load(self, method: str, path: str, data: dict[str, str] | None = None, record: bool = True) -> Page:
        if self.browser is not None:
            return self._browse(method, path, data, record)
        status, body, location = self._fetch(method, path, data)
        if status in (301, 302, 303, 307) and location:
            method, path, data = "GET", location, None
            status, body, _ = self._fetch(method, path)
        self.values = {}
        if record and method == "GET":
            self.history.append(path)
        return parse(path, status, body)

    def _browse(self, method: str, path: str, data: dict[str, str] | None, record: bool) -> Page:
        """`_load` through the browser: it follows the redirect itself; the page's URL is recorded."""
        url = urljoin(self.server.base + "/", path)
        try:
            status, body, final = (
                self.browser.post(url, data or {}) if method == "POST" else self.browser.get(url)
            )
        except (TimeoutError, RuntimeError) as e:
            raise RuntimeError(f"web_shop browser on {self.server.base}, {method} {path}: {e}") from None
        parts = urlsplit(final)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.values = {}
        if record:
            self.history.append(path)
        return parse(path, status, body)

    # ---- actions ---------------------------------------------------------------------------
    def step(self, action: str) -> StepResult:
        self.actions += 1
        line = next((ln.strip() for ln in action.splitlines() if ln.strip()), "")
        signals: dict[str, Any] = {"invalid": 0, "offsite": 0}
        if m := _ANSWER.match(line):
            return self._end(signals, answer=m.group(1).strip())
        observation = self._act(line, signals)
        self.invalid += signals["invalid"]
        self.offsite += signals["offsite"]
        if self.state.orders or self.actions >= self.max_actions:
            return self._end(signals, answer=None)
        return StepResult(messages=[{"role": "user", "content": observation}], signals=signals)

    def _act(self, line: str, signals: dict[str, Any]) -> str:
        if line == "back":
            if len(self.history) < 2:
                return "no page to go back to"
            self.history.pop()
            self.page = self._load("GET", self.history[-1], record=False)
            return self.render()
        if m := _GOTO.match(line):
            path = self._own_path(m.group(1))
            if path is None:
                signals["offsite"] = 1
                return "refused: not this shop"
            self.page = self._load("GET", path)
            return self.render()
        m = _CLICK.match(line) or _TYPE.match(line)
        if m is None:
            signals["invalid"] = 1
            return "unknown action"
        eid = int(m.group(1))
        el = self.page.element(eid)
        if el is None:
            signals["invalid"] = 1
            return f"no element {eid}"
        if m.re is _TYPE:
            if el.kind != "textbox":
                signals["invalid"] = 1
                return f"{eid} is not a textbox"
            self.values[eid] = m.group(2).strip()
            return self._submit(el)
        if el.kind == "link":
            self.page = self._load("GET", urljoin(self.page.url, el.href))
            return self.render()
        if el.kind == "button":
            return self._submit(el)
        signals["invalid"] = 1
        return f"{eid} is a textbox: type into it"

    def _submit(self, el: Element) -> str:
        """Submit `el`'s form: its hidden fields and its textboxes (typed values, else their own)."""
        if el.form is None:
            return "ok"
        form = self.page.forms[el.form]
        fields = dict(form.hidden)
        for i, x in enumerate(self.page.elements, 1):
            if x.kind == "textbox" and x.form == el.form and x.name:
                fields[x.name] = self.values.get(i, x.value)
        target = urljoin(self.page.url, form.action or self.page.url)
        if form.method == "post":
            self.page = self._load("POST", target, fields)
        else:
            self.page = self._load("GET", f"{urlsplit(target).path}?{urlencode(fields)}")
        return self.render()

    def _own_path(self, url: str) -> str | None:
        """The shop path `url` names (a path, or an absolute URL of this server); None otherwise."""
        if url.startswith("/") and not url.startswith("//"):
            return url
        parts = urlsplit(url)
        own = parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost")
        if not own or parts.port != self.server.port:
            return None
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    # ---- the end ---------------------------------------------------------------------------
    def _end(self, signals: dict[str, Any], answer: str | None) -> StepResult:
        with self.state.lock:
            orders = [dict(o) for o in self.state.orders]
        score = grade(self.goal, orders, answer, self.invalid)
        score.details.update(actions=self.actions, invalid=self.invalid, offsite=self.offsite)
        self.close()
        return StepResult(done=True, signals=signals, score=score)
