"""The committed book as a reader's browser shows it: every page of the built HTML opened in headless Chromium.

Asserts that no page requests anything off the machine, that no raw TeX is left in the rendered text, that every
figure loads, and that the MI explorer's widgets are there and switch the view when driven. Skipped, with the
reason, where Chromium is missing (Debian: ``apt-get install -y chromium``; `.ci/run` installs it). A screenshot of
each page is kept under the build folder (not committed).
"""
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from mimdm.app.book import CHAPTERS, build_html, copy_book_sources

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (apt-get install -y chromium)")]

#: URL schemes that stay on the machine.
LOCAL = ("file:", "data:", "blob:", "about:")


class Browser:
    """A headless Chromium driven over the DevTools protocol (one page; events collected as they arrive)."""

    def __init__(self):
        import websocket

        self.profile = tempfile.mkdtemp(prefix="mimdm-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--allow-file-access-from-files",
             "--window-size=1280,2000", "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.is_file() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
        url = next(p for p in pages if p["type"] == "page")["webSocketDebuggerUrl"]
        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True)
        self.n, self.events = 0, []
        self.call("Network.enable")
        self.call("Page.enable")

    def call(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def eval(self, expression: str, await_promise: bool = False):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=await_promise)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:60]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, url: str) -> None:
        """Navigate, wait for the load and for MathJax to finish typesetting."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        for _ in range(600):
            if self.eval("document.readyState") == "complete":
                break
            time.sleep(0.05)
        self.eval("window.MathJax && MathJax.startup && MathJax.startup.promise ? "
                  "MathJax.startup.promise.then(() => true) : true", await_promise=True)

    def requests(self) -> list[str]:
        self.call("Runtime.evaluate", expression="1")  # drain the events that arrived meanwhile
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = copy_book_sources(tmp_path_factory.mktemp("browser") / "book")
    return build_html(root).parent


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


#: Raw TeX a reader would see if MathJax did not run: \( or \[ delimiters, $$, or $ around TeX-like text.
RAW_TEX = re.compile(r"\\\(|\\\[|\$\$|\$[^$\s][^$\n]{0,80}[\\^_{}][^$\n]{0,80}\$")


def test_every_page_renders_offline_with_maths_and_figures(built, browser):
    pages = sorted((built / "book").glob("*.html"))
    assert len(pages) == len(CHAPTERS) + 1  # the intro and every notebook of _toc.yml
    shots = built / "screenshots"
    shots.mkdir(exist_ok=True)
    for page in pages:
        browser.open(page.as_uri())
        off = [u for u in browser.requests() if not u.startswith(LOCAL)]
        assert not off, (page.name, off[:5])
        text = browser.eval("document.body.innerText")
        raw = RAW_TEX.findall(text)
        assert not raw, (page.name, raw[:3])
        n_img, n_ok = browser.eval("[document.images.length, Array.from(document.images)"
                                   ".filter(i => i.complete && i.naturalWidth > 0).length]")
        assert n_img == n_ok, (page.name, n_img, n_ok)
        if page.stem != "intro":
            assert n_img >= 1 or page.stem == "mi_explorer", page.name
        browser.screenshot(shots / f"{page.stem}.png")
    browser.open((built / "book" / "intro.html").as_uri())
    assert browser.eval("document.querySelectorAll('mjx-container').length") > 0  # maths typeset by MathJax
    assert "Findings at a glance" in browser.eval("document.body.innerText")


def test_explorer_widgets_switch_the_view_in_the_browser(built, browser):
    browser.open((built / "book" / "mi_explorer.html").as_uri())
    visible = ("Array.from(document.querySelectorAll('.widget-html')).filter(e => e.offsetParent !== null)"
               ".map(e => e.innerText).join('|')")
    for _ in range(200):  # the widget manager renders after the load
        if browser.eval("document.querySelectorAll('.jupyter-widgets select').length"):
            break
        time.sleep(0.05)
    assert browser.eval("document.querySelectorAll('.jupyter-widgets select').length") >= 1
    before = browser.eval(visible)
    assert before
    browser.eval("(() => { const s = document.querySelector('.jupyter-widgets select');"
                 " s.selectedIndex = (s.selectedIndex + 1) % s.options.length;"
                 " s.dispatchEvent(new Event('change', {bubbles: true})); })()")
    for _ in range(100):
        if browser.eval(visible) != before:
            break
        time.sleep(0.05)
    assert browser.eval(visible) != before  # another puzzle's view is shown
    assert not [u for u in browser.requests() if not u.startswith(LOCAL)]
