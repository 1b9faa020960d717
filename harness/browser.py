"""Headless Chromium driven over its DevTools pipe, for tests and benches of the status page.

`--remote-debugging-pipe` speaks the Chrome DevTools Protocol as NUL-terminated JSON on file
descriptors 3 (commands in) and 4 (replies and events out): no websocket client, no driver
download, nothing beyond Debian's `chromium` package (`make chromium`). `--dump-dom` cannot be
used on a page that holds an EventSource open: its load never settles.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

from ftsup.harness import orphan_guard
from ftsup.harness.cluster import wait_until


class BrowserError(RuntimeError):
    """Chromium is missing, died, or answered a command with an error; the text says which."""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page; a context manager that always ends the process."""

    def __init__(self, width: int = 1400, height: int = 1600, binary: str | None = None) -> None:
        found = binary or find_chromium()
        if found is None:
            raise BrowserError("chromium is not installed: `make chromium` (apt-get install -y chromium)")
        self.binary: str = found
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="ftsup-chromium-")
        self._ids = 0
        self._buffer = b""
        self.session = ""
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Browser:
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()

        def wire_fds() -> None:  # in the child, before exec: fds 3 and 4 are the pipe's ends
            os.dup2(commands_r, 3)
            os.dup2(replies_w, 4)

        self.process = subprocess.Popen(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
             f"--user-data-dir={self._profile}", f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=wire_fds, pass_fds=(3, 4),
            start_new_session=True)
        orphan_guard.watch(self.process)
        os.close(commands_r)
        os.close(replies_w)
        try:
            targets = self.call("Target.getTargets")["targetInfos"]
            page = next(t for t in targets if t["type"] == "page")
            self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:  # an error or a stop signal: `with` calls __exit__ only after __enter__ returns
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
        for fd in (self._commands, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    # -- the protocol ---------------------------------------------------------------------------
    def call(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict[str, Any]:
        """Sends one command (to the attached page once there is one) and returns its result."""
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._ids:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return dict(reply.get("result", {}))

    def _read(self, deadline: float, method: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"chromium did not answer {method} in time")
            ready, _, _ = select.select([self._replies], [], [], left)
            if ready:
                chunk = os.read(self._replies, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium exited (code {self.process and self.process.poll()}) during {method}")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return dict(json.loads(message))

    # -- what tests use -------------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def data(self) -> dict[str, str]:
        """The page's <body data-*> attributes: what it shows, for assertions."""
        return dict(self.evaluate("Object.assign({}, document.body ? document.body.dataset : {})") or {})

    def wait_for_data(self, check: Any, timeout_s: float, what: str) -> dict[str, str]:
        def ready() -> dict[str, str] | None:
            data = self.data()
            return data if check(data) else None

        return wait_until(ready, timeout_s, what, poll_s=0.2)

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def screenshot(self, path: pathlib.Path) -> pathlib.Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def heap_bytes(self) -> int:
        """The page's JavaScript heap in use, after a collection (so growth means retained memory)."""
        self.call("HeapProfiler.collectGarbage")
        return int(self.call("Runtime.getHeapUsage")["usedSize"])
