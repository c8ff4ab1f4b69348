"""A page as the agent sees it: the HTML parsed (the standard library's `html.parser`, a real
tokenizing parser: entities, attributes in any order and quoting, unclosed tags) into its
interactive elements, numbered, and its text, rendered compactly:

    3 found
    [1] link "red mug 4$"
    [2] link "next"
    [3] textbox "qty" 1
    [4] button "add"

Interactive elements get ids 1..n in document order: links (`<a href>`), text inputs (labelled by
`aria-label`, else `placeholder`, else `name`; a value shown after the label) and buttons (a
`<button>` or an `<input type=submit>`, labelled by its text or value). Text outside them (headings,
paragraphs, list items; never `<title>`, `<script>`, `<style>`) is one line per block, with no id.
Hidden inputs are kept with their form, never shown. A rendering longer than `max_chars` keeps its
first whole lines and ends with the marker `[+N more]` (N lines left out); the elements left out
keep their ids, so the numbering never depends on the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

BLOCKS = {"p", "h1", "h2", "h3", "li", "div", "td", "th", "tr", "ul", "ol", "br", "form", "table", "body"}
SKIPPED = {"title", "script", "style", "head"}


@dataclass
class Form:
    action: str
    method: str  # "get" or "post"
    hidden: dict[str, str] = field(default_factory=dict)


@dataclass
class Element:
    """One interactive element: kind "link" (href), "textbox" (name, value) or "button" (its
    form's index in `Page.forms`, or None outside a form)."""

    kind: str
    label: str
    href: str = ""
    name: str = ""
    value: str = ""
    form: int | None = None


@dataclass
class Page:
    url: str
    status: int
    lines: list[str | Element]  # the page in document order: text lines and elements
    forms: list[Form]

    @property
    def elements(self) -> list[Element]:
        return [x for x in self.lines if isinstance(x, Element)]

    def element(self, eid: int) -> Element | None:
        """The element with id `eid` (1-based), None when there is none."""
        els = self.elements
        return els[eid - 1] if 1 <= eid <= len(els) else None

    def render(self, max_chars: int = 160) -> str:
        out, n = [], 0
        for x in self.lines:
            if isinstance(x, Element):
                n += 1
                value = f" {x.value}" if x.kind == "textbox" and x.value else ""
                out.append(f'[{n}] {x.kind} "{x.label}"{value}')
            else:
                out.append(x)
        return truncate(out, max_chars)


def truncate(lines: list[str], max_chars: int) -> str:
    """The first whole lines within `max_chars` (marker included), then `[+N more]`."""
    text = "\n".join(lines)
    if len(text) <= max_chars:
        return text
    kept: list[str] = []
    for i, line in enumerate(lines):
        left = len(lines) - i  # lines not yet kept, this one included
        if len("\n".join([*kept, line, f"[+{left - 1} more]"])) > max_chars:
            break
        kept.append(line)
    return "\n".join([*kept, f"[+{len(lines) - len(kept)} more]"])


class _Parser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.lines: list[str | Element] = []
        self.forms: list[Form] = []
        self.form: int | None = None
        self.text: list[str] = []  # the text block being read
        self.inside: Element | None = None  # the link or button whose text is being read
        self.skip = 0

    def flush(self) -> None:
        line = " ".join(" ".join(self.text).split())
        if line:
            self.lines.append(line)
        self.text = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in SKIPPED:
            self.skip += 1
        elif tag in BLOCKS:
            self.flush()
        if tag == "form":
            self.forms.append(Form(a.get("action", ""), a.get("method", "get").lower()))
            self.form = len(self.forms) - 1
        elif tag == "a" and "href" in a:
            self.flush()
            self.inside = Element("link", "", href=a["href"])
        elif tag == "button":
            self.flush()
            self.inside = Element("button", "", form=self.form)
        elif tag == "input":
            self._input(a)

    def _input(self, a: dict[str, str]) -> None:
        kind = a.get("type", "text").lower()
        if kind == "hidden":
            if self.form is not None and a.get("name"):
                self.forms[self.form].hidden[a["name"]] = a.get("value", "")
        elif kind in ("submit", "button"):
            self.flush()
            self.lines.append(Element("button", a.get("value", "submit"), form=self.form))
        elif kind in ("text", "search", "number", "email"):
            self.flush()
            label = a.get("aria-label") or a.get("placeholder") or a.get("name", "")
            self.lines.append(Element("textbox", label, name=a.get("name", ""), value=a.get("value", ""),
                                      form=self.form))  # fmt: skip

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIPPED:
            self.skip = max(0, self.skip - 1)
        elif tag in ("a", "button") and self.inside is not None:
            self.inside.label = " ".join(" ".join(self.text).split())
            self.lines.append(self.inside)
            self.inside, self.text = None, []
        elif tag in BLOCKS:
            self.flush()
        if tag == "form":
            self.form = None

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.text.append(data)


def parse(url: str, status: int, body: str) -> Page:
    """The page at `url` (its HTTP status, its HTML) as elements and text lines."""
    p = _Parser()
    p.feed(body)
    p.close()
    p.flush()
    return Page(url, status, p.lines, p.forms)
