"""A real headless browser as the web env's backend: Chromium driven over its DevTools protocol
(CDP), one browser per episode. `backend: chromium` in the task's options; the default backend
(`text`) fetches pages with urllib and is what the tests and recipes use.

    browser = ChromiumBrowser()            # starts `chromium --headless` on a free port
    status, html, url = browser.get("http://127.0.0.1:8123/search?q=mug")
    status, html, url = browser.post("http://127.0.0.1:8123/cart", {"id": "3", "qty": "1"})
    browser.close()

Each page is loaded by the browser itself (it follows the shop's 303 redirects, runs any script)
and what the env parses is the browser's DOM (`document.documentElement.outerHTML`) after the
load event, so the agent sees the page a browser built, not the bytes the server sent. A form is
submitted the way a browser submits one: a form element with the fields, `submit()`ed in the
page. The status is the main document's HTTP status (CDP's `Network.responseReceived`).

Why by hand over `websockets` and not Playwright or Selenium: neither is installed here (Playwright
1.65 is on the index, but its pinned browser builds are downloaded at install time, and it would
be a second driver process per episode), while the protocol calls an env needs are five
(Target.createTarget / attachToTarget, Page.navigate, Runtime.evaluate, the load event) and
`websockets` (already installed, `temper[browser]`) speaks the transport. The browser runs with
`--no-sandbox` only because the env's own user is root in containers; it only ever loads the
episode's own server on 127.0.0.1 (the env refuses every other URL before it reaches here).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

EXECUTABLES = ("chromium", "chromium-browser", "google-chrome")


class BrowserUnavailable(RuntimeError):
    """No Chromium on PATH, or no `websockets` to talk to it."""


def find_chromium() -> str:
    for name in EXECUTABLES:
        if path := shutil.which(name):
            return path
    raise BrowserUnavailable(
        f"web_shop backend chromium: none of {', '.join(EXECUTABLES)} is on PATH (apt-get install chromium)"
    )


class ChromiumBrowser:
    """One headless Chromium and one page in it (module docstring); `close` is idempotent."""

    def __init__(self, timeout_s: float = 10.0, executable: str | None = None):
        try:
            from websockets.sync.client import connect
        except ImportError:
            raise BrowserUnavailable(
                "web_shop backend chromium needs websockets (pip install 'temper[browser]')"
            ) from None
        self.timeout_s = timeout_s
        self.profile = Path(tempfile.mkdtemp(prefix="temper-chromium-"))
        command = [executable or find_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                   "--no-first-run", "--disable-extensions", "--remote-debugging-port=0",
                   f"--user-data-dir={self.profile}", "about:blank"]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ws = None
        try:
            port_file = self.profile / "DevToolsActivePort"
            deadline = time.monotonic() + timeout_s
            while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise BrowserUnavailable(f"chromium did not start within {timeout_s}s")
                time.sleep(0.05)
            port, path = port_file.read_text().splitlines()[:2]
            self.ws = connect(
                f"ws://127.0.0.1:{port}{path}", max_size=2**24, open_timeout=timeout_s
            ).__enter__()
            self._id, self.events = 0, []
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})[
                "sessionId"
            ]
            self._call("Page.enable", session=True)
            self._call("Network.enable", session=True)
        except BaseException:
            self.close()
            raise

    # ---- the protocol ----------------------------------------------------------------------
    def _call(
        self, method: str, params: dict[str, Any] | None = None, session: bool = False
    ) -> dict[str, Any]:
        """Send one command and return its result; events read meanwhile are kept in `events`."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = self._receive()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"chromium {method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def _receive(self) -> dict[str, Any]:
        try:
            return json.loads(self.ws.recv(timeout=self.timeout_s))
        except TimeoutError:
            raise TimeoutError(f"chromium did not answer within {self.timeout_s}s") from None

    def _load(self, start) -> tuple[int, str, str]:
        """Run `start()` (a navigation or a form submit) and wait for the page's load event: the
        main document's status, the DOM as HTML, the page's URL."""
        self.events.clear()
        start()
        deadline = time.monotonic() + self.timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium: the page did not load within {self.timeout_s}s")
            self.events.append(self._receive())
        documents = [
            e["params"]["response"]["status"]
            for e in self.events
            if e.get("method") == "Network.responseReceived" and e["params"].get("type") == "Document"
        ]
        page = self._call("Runtime.evaluate", {"expression": "[location.href, document.documentElement.outerHTML]",
                                               "returnByValue": True}, session=True)["result"]["value"]  # fmt: skip
        return (documents[-1] if documents else 200), page[1], page[0]

    # ---- what the env asks -----------------------------------------------------------------
    def get(self, url: str) -> tuple[int, str, str]:
        return self._load(lambda: self._call("Page.navigate", {"url": url}, session=True))

    def post(self, url: str, fields: dict[str, str]) -> tuple[int, str, str]:
        script = (
            "(() => { const f = document.createElement('form'); f.method = 'post'; "
            f"f.action = {json.dumps(url)}; "
            f"for (const [k, v] of Object.entries({json.dumps(fields)})) {{ "
            "const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; "
            "f.appendChild(i); } document.body.appendChild(f); f.submit(); })()"
        )
        return self._load(lambda: self._call("Runtime.evaluate", {"expression": script}, session=True))

    def close(self) -> None:
        if self.ws is not None:
            try:
                self._call("Browser.close")
            except Exception:  # noqa: BLE001 - already gone; the process is killed below
                pass
            self.ws.__exit__(None, None, None)  # entered in __init__: websockets wants a context
            self.ws = None
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)
