"""The shop as a real local web application: HTML pages over HTTP on 127.0.0.1, one server (and one
state: cart, orders) per episode.

    GET  /                        search form, links to the categories and the cart
    GET  /categories              a link per category the site sells
    GET  /search?q=&c=&max=&sort=price&page=N
                                  products whose name has every word of q (and category c, price
                                  <= max), `per_page` a page, in catalogue order or by price;
                                  links "by price" and "next"; a "max $" filter form on a category
    GET  /p/<id>                  a product: its name and price, a form (qty, "add") posting /cart
    POST /cart      id, qty       adds qty (1..9) of the product, then 303 to /cart
    GET  /cart                    the lines and total; a form ("pay") posting /order
    POST /order                   places the order (the cart's lines), empties the cart, 303 to
                                  /order/<n>; refused (400) when the cart is empty
Anything else is a 404 page; a bad form value a 400 page. Every page is a complete HTML document.

Why the standard library's `ThreadingHTTPServer` and no web framework: the app is a dozen routes
of generated HTML with no templates, sessions or database, every episode starts its own server
(milliseconds, no process), and the framework would be a dependency the repository does not have
(neither flask nor any other is in the environment). Threading, so a request never waits for
another (the server thread accepts, a thread per request answers). The server binds port 0 (the
kernel picks a free one) on 127.0.0.1 only.
"""

from __future__ import annotations

import html
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from temper.envs.web_shop.site import Product, matches

MAX_QTY = 9


@dataclass
class ShopState:
    """What the episode changed on the server: the cart and the orders placed (each its lines,
    product id -> quantity). The grader reads it."""

    products: tuple[Product, ...]
    per_page: int = 3
    cart: dict[int, int] = field(default_factory=dict)
    orders: list[dict[int, int]] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def product(self, pid: int) -> Product | None:
        return next((p for p in self.products if p.id == pid), None)


def _doc(body: str) -> str:
    return f"<!doctype html><html><head><title>shop</title></head><body>{body}</body></html>"


def _a(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _label(p: Product) -> str:
    return f"{p.name} {p.price}$"


class Pages:
    """The HTML of each route over one state (module docstring); (status, html or redirect)."""

    def __init__(self, state: ShopState):
        self.s = state

    def home(self) -> str:
        return _doc(
            '<form action="/search" method="get"><input type="text" name="q" aria-label="search">'
            "<button>go</button></form>" + _a("/categories", "categories") + _a("/cart", "cart")
        )

    def categories(self) -> str:
        seen = list(dict.fromkeys(p.category for p in self.s.products))
        return _doc(
            "<ul>" + "".join(f"<li>{_a('/search?' + urlencode({'c': c}), c)}</li>" for c in seen) + "</ul>"
        )

    def search(self, q: str, c: str, max_price: int | None, sort: str, page: int) -> str:
        found = [p for p in self.s.products if matches(p, q) and (not c or p.category == c)]
        found = [p for p in found if max_price is None or p.price <= max_price]
        if sort == "price":
            found.sort(key=lambda p: (p.price, p.id))
        params = {k: v for k, v in (("q", q), ("c", c)) if v}
        if max_price is not None:
            params["max"] = str(max_price)
        shown = found[(page - 1) * self.s.per_page : page * self.s.per_page]
        body = f"<p>{len(found)} found</p><ul>"
        body += "".join(f"<li>{_a(f'/p/{p.id}', _label(p))}</li>" for p in shown) + "</ul>"
        if page * self.s.per_page < len(found):
            body += _a(
                "/search?" + urlencode(params | ({"sort": sort} if sort else {}) | {"page": page + 1}), "next"
            )
        if sort != "price" and len(found) > 1:
            body += _a("/search?" + urlencode(params | {"sort": "price"}), "by price")
        if c:
            hidden = "".join(
                f'<input type="hidden" name="{k}" value="{html.escape(v)}">'
                for k, v in params.items()
                if k != "max"
            )
            body += (
                f'<form action="/search" method="get">{hidden}'
                '<input type="text" name="max" aria-label="max $"></form>'
            )
        return _doc(body)

    def product(self, p: Product) -> str:
        return _doc(
            f"<h1>{html.escape(_label(p))}</h1>"
            f'<form action="/cart" method="post"><input type="hidden" name="id" value="{p.id}">'
            '<input type="text" name="qty" value="1" aria-label="qty"><button>add</button></form>'
            + _a("/cart", "cart")
        )

    def cart(self) -> str:
        if not self.s.cart:
            return _doc("<p>cart empty</p>" + _a("/", "home"))
        lines = [(self.s.product(pid), n) for pid, n in self.s.cart.items()]
        body = "".join(f"<p>{html.escape(p.name)} x{n} {p.price * n}$</p>" for p, n in lines)
        body += f"<p>total {sum(p.price * n for p, n in lines)}$</p>"
        return _doc(
            body + '<form action="/order" method="post"><button>pay</button></form>' + _a("/", "home")
        )

    def order(self, n: int) -> str:
        return _doc(f"<h1>order {n} placed</h1>" + _a("/", "home"))

    @staticmethod
    def error(status: int, why: str) -> str:
        return _doc(f"<h1>{status} {html.escape(why)}</h1>" + _a("/", "home"))


class _Handler(BaseHTTPRequestHandler):
    server: _ShopServer

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name; silence
        pass

    def do_GET(self) -> None:
        self._answer(*self.server.route("GET", self.path, {}))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode(errors="replace")).items()}
        self._answer(*self.server.route("POST", self.path, form))

    def _answer(self, status: int, body: str) -> None:
        if status == 303:
            self.send_response(303)
            self.send_header("Location", body)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _ShopServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: ShopState):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state, self.pages = state, Pages(state)

    def route(self, method: str, path: str, form: dict[str, str]) -> tuple[int, str]:
        """(status, HTML) or (303, location) for one request."""
        with self.state.lock:
            self.state.requests += 1
            return self._route(method, path, form)

    def _route(self, method: str, path: str, form: dict[str, str]) -> tuple[int, str]:
        url = urlsplit(path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        s, pages = self.state, self.pages
        if method == "GET" and url.path == "/":
            return 200, pages.home()
        if method == "GET" and url.path == "/categories":
            return 200, pages.categories()
        if method == "GET" and url.path == "/search":
            max_price, page = _int(query.get("max")), _int(query.get("page", "1"))
            if (query.get("max") and max_price is None) or page is None or page < 1:
                return 400, pages.error(400, "bad filter")
            return 200, pages.search(
                query.get("q", ""), query.get("c", ""), max_price, query.get("sort", ""), page
            )
        if method == "GET" and url.path.startswith("/p/"):
            p = s.product(_int(url.path[3:]) or 0)
            return (200, pages.product(p)) if p else (404, pages.error(404, "no such product"))
        if url.path == "/cart":
            if method == "GET":
                return 200, pages.cart()
            p, qty = s.product(_int(form.get("id")) or 0), _int(form.get("qty"))
            if p is None or qty is None or not 1 <= qty <= MAX_QTY:
                return 400, pages.error(400, f"qty must be 1-{MAX_QTY}")
            s.cart[p.id] = min(MAX_QTY, s.cart.get(p.id, 0) + qty)
            return 303, "/cart"
        if method == "POST" and url.path == "/order":
            if not s.cart:
                return 400, pages.error(400, "cart empty")
            s.orders.append(dict(s.cart))
            s.cart.clear()
            return 303, f"/order/{len(s.orders)}"
        if method == "GET" and url.path.startswith("/order/"):
            n = _int(url.path[7:])
            return (
                (200, pages.order(n))
                if n and 1 <= n <= len(s.orders)
                else (404, pages.error(404, "no such order"))
            )
        return 404, pages.error(404, "not found")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


class ShopServer:
    """One episode's server: started on an ephemeral port of 127.0.0.1, serving from a daemon
    thread until `close` (idempotent)."""

    def __init__(self, state: ShopState):
        self.state = state
        self._server: _ShopServer | None = _ShopServer(state)
        self.port = self._server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        # a short poll interval: close() waits for the serving loop to see the shutdown flag
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True, name="web_shop"
        )
        self._thread.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
