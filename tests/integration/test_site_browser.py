"""The install page in a real browser: headless Chromium (Debian's package) driven by Playwright for Python.

What the byte-level tests in tests/test_site.py cannot show: the script picks the stored answer for what a
user selects, with the mouse or the keyboard; a badge leads to its fact; nothing is fetched from outside
the site's folder and nothing logs an error; a phone's width does not scroll sideways; and markup in the
ledger stays text once the script has run. Screenshots for the README land in .work/site-shots/.

Skipped, saying why, where Chromium or Playwright is missing; FLASHKIT_REQUIRE_BROWSER (set by .ci/run,
which installs both) turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import itertools
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from kitsupport import REPO
from sitesupport import PAYLOAD, hostile_checkout, resolver

from flashkit.site import render

pytestmark = pytest.mark.browser
SHOTS = REPO / ".work" / "site-shots"


def _unavailable(why: str) -> None:
    if os.environ.get("FLASHKIT_REQUIRE_BROWSER"):
        pytest.fail(f"{why} (FLASHKIT_REQUIRE_BROWSER is set: .ci/run installs it)", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        _unavailable("no `chromium` on PATH: `apt-get install chromium` (Debian's package)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright for Python is not installed: `pip install playwright`")
    # Playwright's own browser download is not used (it cannot run on this host): Debian's Chromium is.
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


@contextlib.contextmanager
def _served(folder: Path):
    """The folder over HTTP on 127.0.0.1, as GitHub Pages serves it: a base URL, nothing else reachable."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test reports what matters
        pass


def _site(root: Path, out: Path) -> Path:
    render.write_site(out, render.pages(root))
    return out


@pytest.fixture(scope="module")
def repo_site(tmp_path_factory) -> Path:
    return _site(REPO, tmp_path_factory.mktemp("browser") / "site")


@pytest.fixture(scope="module")
def site_url(repo_site):
    with _served(repo_site) as url:
        yield url


class Watched:
    """A page with every console error, uncaught exception and request it makes recorded."""

    def __init__(self, browser, **context) -> None:
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def watched(browser):
    w = Watched(browser)
    yield w
    w.close()


def _choose(page, labels: dict[str, str]) -> None:
    for name, label in labels.items():
        page.select_option(f"#sel-{name}", label=label)


def _shown(page) -> tuple[int, list[str], list[str]]:
    code = int(page.get_attribute("#fk-result", "data-exit"))
    out = page.text_content("#fk-out") or ""
    err = page.text_content("#fk-err") or ""
    return code, out.splitlines(), err.splitlines()


def _cli(*argv: str) -> tuple[int, list[str], list[str]]:
    """`flashkit resolve` as a user runs it: a separate process, its two streams."""
    proc = subprocess.run(
        [sys.executable, "-m", "flashkit.cli.main", "--repo", str(REPO), "resolve", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    return proc.returncode, proc.stdout.splitlines(), proc.stderr.splitlines()


def _select_names(page) -> list[str]:
    return page.eval_on_selector_all("select[data-fk-select]", "els => els.map(e => e.name)")


def _as_resolve_prints(page, site_url: str, torch: str, cuda: str, python: str) -> tuple[int, list[str], list[str]]:
    """Choose torch, CUDA and Python (ABI: either) on the page; what it shows, checked against the CLI's."""
    page.goto(site_url)
    _choose(page, dict(zip(_select_names(page), [torch, f"CUDA {cuda}", python, "either"], strict=True)))
    shown = _shown(page)
    assert shown == _cli("--torch", torch, "--cuda", cuda, "--python", python)
    return shown


def test_a_fitting_choice_shows_what_resolve_prints(watched, site_url):
    page = watched.page
    code, out, _err = _as_resolve_prints(page, site_url, "2.12.0", "13.0", "3.12")
    assert code == 0 and any(line.startswith("pip install") or "uv pip" in line for line in out), out
    assert page.is_visible("#fk-out")
    assert page.text_content("#fk-cmd") == "flashkit resolve --torch 2.12.0 --cuda 13.0 --python 3.12"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "selector.png"), full_page=False)
    assert watched.errors == []


def test_a_choice_nothing_fits_says_why(watched, site_url):
    page = watched.page
    # torch 2.6 was only ever built for CUDA 12.4: CUDA 13.0 fits nothing, and the page says why.
    code, out, err = _as_resolve_prints(page, site_url, "2.6.0", "13.0", "3.12")
    assert code == 33 and out == [] and err[-2].startswith("flashkit: error: no verified build fits"), err
    assert not page.is_visible("#fk-out")
    assert "33" in (page.text_content("#fk-verdict") or "")


def test_every_choice_in_the_browser_is_resolves(watched, site_url):
    """Every combination the selects can form, set in the page and read back, against resolve's text (the
    CLI's own, its facts read once; tests/test_site.py checks that text against the CLI itself)."""
    page = watched.page
    page.goto(site_url)
    sizes = page.eval_on_selector_all("select[data-fk-select]", "els => els.map(e => e.options.length)")
    shown = page.evaluate(
        """(sizes) => {
          const sel = Array.from(document.querySelectorAll("select[data-fk-select]"));
          const all = [];
          const idx = sizes.map(() => 0);
          for (;;) {
            sel.forEach((s, k) => { s.value = String(idx[k]); });
            sel[0].dispatchEvent(new Event("change"));
            all.push([Number(document.getElementById("fk-result").dataset.exit),
                      document.getElementById("fk-cmd").textContent,
                      document.getElementById("fk-out").textContent,
                      document.getElementById("fk-err").textContent]);
            let k = sizes.length - 1;
            while (k >= 0 && ++idx[k] === sizes[k]) { idx[k] = 0; k--; }
            if (k < 0) return all;
          }
        }""",
        sizes,
    )
    assert len(shown) == len(list(itertools.product(*(range(n) for n in sizes))))
    resolve = resolver(REPO)
    for code, cmd, out, err in shown:
        argv = cmd.split()[2:]
        assert (code, out.splitlines(), err.splitlines()) == resolve(argv), cmd
    assert {s[0] for s in shown} >= {0, 33}
    assert watched.errors == []


def test_the_keyboard_reaches_and_changes_the_choice(watched, site_url):
    page = watched.page
    page.goto(site_url)
    first = _select_names(page)[0]
    for _ in range(10):  # the skip link, then the first select
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.name") == first:
            break
    assert page.evaluate("document.activeElement.name") == first, "Tab never reached the torch select"
    before = page.text_content("#fk-cmd")
    page.keyboard.press("ArrowUp" if page.evaluate("document.activeElement.selectedIndex") else "ArrowDown")
    page.wait_for_function("before => document.getElementById('fk-cmd').textContent !== before", arg=before)
    assert page.text_content("#fk-cmd") != before
    assert watched.errors == []


def test_a_badge_leads_to_its_evidence(watched, site_url):
    page = watched.page
    page.goto(site_url)
    badge = page.locator("a.badge.passed").first
    anchor = badge.get_attribute("href").split("#", 1)[1]
    badge.click()
    page.wait_for_url(f"**/evidence.html#{anchor}")
    entry = page.locator(f"[id='{anchor}']")
    assert entry.is_visible()
    text = entry.text_content() or ""
    assert "sha256:" in text and "fact" in text, text
    entry.scroll_into_view_if_needed()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "evidence.png"), full_page=False)
    assert watched.errors == []


@pytest.mark.parametrize("how", ["http", "file"])
def test_nothing_is_fetched_from_outside_the_folder(watched, repo_site, site_url, how):
    base = site_url if how == "http" else repo_site.as_uri() + "/"
    page = watched.page
    for name in ("index.html", "evidence.html"):
        page.goto(base + name)
        page.wait_for_load_state("networkidle")
    outside = [u for u in watched.requests if not u.startswith(base)]
    assert outside == [] and watched.requests, watched.requests
    assert watched.errors == []


def test_a_phone_does_not_scroll_sideways(browser, site_url):
    w = Watched(browser, viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    try:
        for name in ("index.html", "evidence.html"):
            w.page.goto(site_url + name)
            wide = w.page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, f"{name} is {wide}px wide on a 390px screen"
        w.page.goto(site_url)
        SHOTS.mkdir(parents=True, exist_ok=True)
        w.page.screenshot(path=str(SHOTS / "phone.png"), full_page=False)
        assert w.errors == []
    finally:
        w.close()


def test_markup_in_the_ledger_never_runs(browser, kit_repo, tmp_path):
    hostile_checkout(kit_repo)
    site = _site(kit_repo, tmp_path / "site")
    w = Watched(browser)
    try:
        with _served(site) as url:
            w.page.goto(url)
            # A choice whose answer carries the hostile verdict's reasons (the env the payload went into).
            for code in range(len(w.page.query_selector_all("#sel-torch option"))):
                w.page.select_option("#sel-torch", index=code)
                if PAYLOAD in (w.page.text_content("#fk-err") or ""):
                    break
            assert PAYLOAD in (w.page.text_content("#fk-err") or ""), "no choice showed the hostile lines"
            w.page.goto(url + "evidence.html")
            assert PAYLOAD in (w.page.text_content("main") or "")
            assert w.page.evaluate("typeof window.__fk_pwned") == "undefined"
            assert w.page.locator("img[src=x]").count() == 0
        assert w.errors == []
    finally:
        w.close()
