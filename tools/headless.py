"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
NUL-terminated JSON on file descriptors 3 and 4), with the standard library only: no WebDriver,
no websocket client. The precision map's browser test and bench/html_map.py use it.

    with Browser() as b:                       # raises BrowserMissing when no chromium is installed
        page = b.open("file:///tmp/map.html")  # waits for the load event
        page.evaluate("document.title")
        page.screenshot("map.png")
        page.errors                             # console errors and uncaught exceptions seen so far

Debian: `apt-get install chromium chromium-driver` (.ci/run installs them).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class BrowserMissing(RuntimeError):
    pass


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    env = os.environ.get("PCC_CHROMIUM")
    if env:
        return env if shutil.which(env) or os.path.isfile(env) else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class Browser:
    def __init__(self, binary: str | None = None, width: int = 1600, height: int = 1000, timeout: float = 60):
        self.binary = binary or find_chromium()
        if not self.binary:
            raise BrowserMissing("no chromium on PATH (Debian: apt-get install -y chromium chromium-driver)")
        self.width, self.height, self.timeout = width, height, timeout
        self._id = 0
        self._buf = b""
        self._events: list[dict] = []

    # -- process
    def __enter__(self) -> "Browser":
        self._profile = tempfile.mkdtemp(prefix="pcc-chromium-")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        args = [self.binary, "--headless", "--remote-debugging-pipe", f"--user-data-dir={self._profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--mute-audio", "--hide-scrollbars", "--disable-dev-shm-usage",
                f"--window-size={self.width},{self.height}", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # chromium refuses root without it
        self.proc = subprocess.Popen(args, pass_fds=(3, 4), preexec_fn=fds, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- protocol
    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise BrowserError("chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float | None = None) -> dict:
        self._id += 1
        mine = self._id
        msg = {"id": mine, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            m = self._read(deadline)
            if m.get("id") == mine:
                if "error" in m:
                    raise BrowserError(f"{method}: {m['error'].get('message')}")
                return m.get("result", {})
            if "method" in m:
                self._events.append(m)

    def wait_event(self, method: str, session: str | None = None, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for k, m in enumerate(self._events):
                if m["method"] == method and (session is None or m.get("sessionId") == session):
                    return self._events.pop(k)
            m = self._read(deadline)
            if "method" in m:
                self._events.append(m)

    def open(self, url: str) -> "Page":
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.target = target
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=session)
        self.call("Page.setLifecycleEventsEnabled", {"enabled": True}, session)
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session)
        page.navigate(url)
        return page


class Page:
    def __init__(self, browser: Browser, session: str):
        self.b, self.session = browser, session
        self.target: str | None = None

    def close(self) -> None:
        self.b.call("Target.closeTarget", {"targetId": self.target})
        self.b._events = [m for m in self.b._events if m.get("sessionId") != self.session]

    def call(self, method: str, params: dict | None = None) -> dict:
        return self.b.call(method, params, self.session)

    def navigate(self, url: str) -> float:
        """Load `url` and wait for its load event; the seconds it took."""
        t = time.perf_counter()
        loader = self.call("Page.navigate", {"url": url}).get("loaderId")
        while True:
            m = self.b.wait_event("Page.lifecycleEvent", self.session)
            if m["params"]["name"] == "load" and m["params"].get("loaderId") == loader:
                return time.perf_counter() - t

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression[:80]}: {r['exceptionDetails'].get('text')}: "
                               f"{r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.evaluate(expression):
                return time.monotonic()
            time.sleep(0.02)
        raise BrowserError(f"timed out waiting for {expression}")

    def mouse_move(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, path: str, full_page: bool = False) -> bytes:
        params: dict = {"format": "png"}
        if full_page:
            w, h = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.call("Page.captureScreenshot", params)["data"])
        with open(path, "wb") as fh:
            fh.write(data)
        return data

    @property
    def events(self) -> list[dict]:
        mine = [m for m in self.b._events if m.get("sessionId") == self.session]
        return mine

    @property
    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and log entries of level error seen so far."""
        self.evaluate("0")  # drain what has arrived
        out = []
        for m in self.events:
            p = m.get("params", {})
            if m["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif m["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif m["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    @property
    def requests(self) -> list[str]:
        """Every URL the page requested (the page itself included)."""
        self.evaluate("0")
        return [m["params"]["request"]["url"] for m in self.events if m["method"] == "Network.requestWillBeSent"]
