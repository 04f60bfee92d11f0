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
from sitesupport import PAYLOAD, hostile_checkout, published_checkout, resolver

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
def checkout(tmp_path_factory) -> Path:
    """This checkout with every verified env's wheel published: the page users get, commands and all."""
    return published_checkout(tmp_path_factory.mktemp("published") / "repo")


@pytest.fixture(scope="module")
def repo_site(checkout, tmp_path_factory) -> Path:
    return _site(checkout, tmp_path_factory.mktemp("browser") / "site")


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
    """Select options by their own label (a shown label may carry the "(no fit)" mark)."""
    for name, label in labels.items():
        value = page.get_attribute(f'#sel-{name} option[data-label="{label}"]', "value")
        assert value is not None, f"no option {label!r} in #sel-{name}"
        page.select_option(f"#sel-{name}", value=value)


def _shown(page) -> tuple[int, list[str], list[str]]:
    code = int(page.get_attribute("#fk-result", "data-exit"))
    out = page.text_content("#fk-out") or ""
    err = page.text_content("#fk-err") or ""
    return code, out.splitlines(), err.splitlines()


def _cli(root: Path, *argv: str) -> tuple[int, list[str], list[str]]:
    """`flashkit resolve` as a user runs it: a separate process, its two streams."""
    proc = subprocess.run(
        [sys.executable, "-m", "flashkit.cli.main", "--repo", str(root), "resolve", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    return proc.returncode, proc.stdout.splitlines(), proc.stderr.splitlines()


def _select_names(page) -> list[str]:
    return page.eval_on_selector_all("select[data-fk-select]", "els => els.map(e => e.name)")


def _as_resolve_prints(
    page, site_url: str, root: Path, torch: str, cuda: str, python: str
) -> tuple[int, list[str], list[str]]:
    """Choose torch, CUDA and Python (ABI: either) on the page; what it shows, checked against the CLI's."""
    page.goto(site_url)
    _choose(page, dict(zip(_select_names(page), [torch, f"CUDA {cuda}", python, "either"], strict=True)))
    shown = _shown(page)
    assert shown == _cli(root, "--torch", torch, "--cuda", cuda, "--python", python)
    return shown


def test_a_fitting_choice_shows_what_resolve_prints(watched, site_url, checkout):
    page = watched.page
    code, out, _err = _as_resolve_prints(page, site_url, checkout, "2.11.0", "13.0", "3.12")
    assert code == 0 and out == [
        "pip install --require-hashes -r https://flash.example/requirements/cu130-torch211/py3.12.txt"
    ]
    assert page.is_visible("#fk-out")
    assert page.text_content("#fk-cmd") == "flashkit resolve --torch 2.11.0 --cuda 13.0 --python 3.12"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "selector.png"), full_page=False)
    assert watched.errors == []


def test_a_choice_nothing_fits_says_why(watched, site_url, checkout):
    page = watched.page
    # torch 2.6 was only ever built for CUDA 12.4: CUDA 13.0 fits nothing, and the page says why.
    code, out, err = _as_resolve_prints(page, site_url, checkout, "2.6.0", "13.0", "3.12")
    assert code == 33 and out == [] and err[-2].startswith("flashkit: error: no verified build fits"), err
    assert not page.is_visible("#fk-out")
    assert "33" in (page.text_content("#fk-verdict") or "")


def test_every_choice_in_the_browser_is_resolves(watched, site_url, checkout):
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
    resolve = resolver(checkout)
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


# -- the page as a user needs it: nearest fit, greyed options, copy, the URL, a phone, no JavaScript --------

SEED = {"torch": "2.7.1", "accel": "CUDA 12.6", "python": "3.11", "abi": "either"}  # PyPI's torch 2.7.1


def _choose_named(page, labels: dict[str, str]) -> None:
    _choose(page, {name: labels[name] for name in _select_names(page) if name in labels})


def test_a_choice_nothing_fits_names_the_nearest_fit_first(watched, site_url):
    page = watched.page
    page.goto(site_url)
    _choose_named(page, {"torch": "2.6.0", "accel": "CUDA 13.0", "python": "3.12", "abi": "either"})
    code, _out, err = _shown(page)
    near = (page.text_content("#fk-near-text") or "").splitlines()
    assert code == 33 and near and near[0].startswith("nearest fit: ") and near[0] in err
    # First on the page: the verdict, then the nearest fit; the per-env reasons are folded below.
    order = page.evaluate(
        """() => ["fk-verdict", "fk-near", "fk-why"].map(id => document.getElementById(id).getBoundingClientRect().top)"""
    )
    assert order == sorted(order), order
    assert page.get_attribute("#fk-why", "open") is None and not page.is_visible("#fk-err")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "nearest.png"), full_page=False)
    # "Show that choice" selects what the nearest fit names, and that is a fit.
    page.click("#fk-near-go")
    code, _out, err = _shown(page)
    assert code != 33 and any(line.startswith("fits: ") for line in err)
    assert page.text_content("#fk-cmd") == near[2].removeprefix("  ask: ")
    assert watched.errors == []


def test_options_that_fit_nothing_are_greyed_and_still_selectable(watched, site_url, checkout):
    page = watched.page
    page.goto(site_url)
    _choose_named(page, {"torch": "2.6.0", "accel": "CUDA 12.4", "python": "3.12", "abi": "either"})
    options = page.eval_on_selector_all(
        "#sel-accel option", "els => els.map(o => [o.dataset.label, o.className, o.textContent, o.disabled])"
    )
    resolve = resolver(checkout)
    for label, cls, text, disabled in options:
        kind, version = label.split()
        chosen = label == "CUDA 12.4"
        fits_nothing = (
            not chosen and resolve(["--torch", "2.6.0", f"--{kind.lower()}", version, "--python", "3.12"])[0] == 33
        )
        assert (cls == "nofit") == fits_nothing and text.endswith("(no fit)") == fits_nothing, label
        assert not disabled
    assert {cls for _l, cls, _t, _d in options} == {"", "nofit"}
    _choose(page, {"accel": "CUDA 13.0"})  # a greyed option: chosen, it says why, and is no longer marked
    assert _shown(page)[0] == 33 and page.is_visible("#fk-near")
    assert page.eval_on_selector("#sel-accel", "s => s.selectedOptions[0].textContent") == "CUDA 13.0"
    assert watched.errors == []


def test_the_choice_is_kept_in_the_url(watched, site_url):
    page = watched.page
    page.goto(site_url)
    assert page.evaluate("location.search") == ""  # written on a change, not on opening the page
    _choose_named(page, {**SEED, "abi": "cxx11"})
    assert page.evaluate("location.search") == "?torch=2.7.1&cuda=12.6&python=3.11&abi=cxx11"
    before = _shown(page)
    page.reload()
    assert _shown(page) == before
    assert page.evaluate("location.search") == "?torch=2.7.1&cuda=12.6&python=3.11&abi=cxx11"
    # A value that is not an option is ignored: that select keeps the page's default.
    page.goto(site_url)
    default_torch = page.eval_on_selector("#sel-torch", "s => s.value")
    page.goto(site_url + "?torch=9.9.9&cuda=12.6&python=3.11&abi=%3Cscript%3E")
    assert page.eval_on_selector("#sel-torch", "s => s.value") == default_torch
    assert page.eval_on_selector("#sel-accel", "s => s.selectedOptions[0].dataset.label") == "CUDA 12.6"
    assert page.eval_on_selector("#sel-abi", "s => s.value") == "0"
    assert watched.errors == []


@pytest.mark.parametrize("how", ["http", "file"])
def test_the_url_round_trips_over_file_and_http(browser, repo_site, site_url, how):
    base = site_url if how == "http" else repo_site.as_uri() + "/index.html"
    w = Watched(browser)
    try:
        w.page.goto(base + "?torch=2.7.1&cuda=12.6&python=3.11")
        code, out, _err = _shown(w.page)
        assert code == 0 and out == [
            "pip install --require-hashes -r https://flash.example/requirements/cu124-torch27/py3.11.txt"
        ]
        assert w.page.text_content("#fk-cmd") == "flashkit resolve --torch 2.7.1 --cuda 12.6 --python 3.11"
        assert w.errors == []
    finally:
        w.close()


def test_copy_puts_the_install_lines_on_the_clipboard(browser, site_url):
    w = Watched(browser, permissions=["clipboard-read", "clipboard-write"])
    try:
        page = w.page
        page.goto(site_url)
        _choose_named(page, SEED)
        page.click("button.copy[data-copy='fk-out']")
        page.wait_for_selector("button.copy[data-copy='fk-out'][data-copied]")
        assert page.text_content("button.copy[data-copy='fk-out']") == "Copied"
        assert page.evaluate("navigator.clipboard.readText()") == page.text_content("#fk-out")
        page.click("button.copy[data-copy='fk-cmd']")
        page.wait_for_function("navigator.clipboard.readText().then(t => t.startsWith('flashkit resolve'))")
        assert page.evaluate("navigator.clipboard.readText()") == page.text_content("#fk-cmd")
        assert w.errors == []
    finally:
        w.close()


def test_a_phone_wraps_the_command_and_stacks_the_matrix(browser, site_url):
    w = Watched(browser, viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    try:
        page = w.page
        page.goto(site_url)
        _choose_named(page, SEED)
        wide = page.evaluate(
            """() => ["fk-out", "fk-cmd", "fk-err"].concat(Array.from(document.querySelectorAll("table.matrix, table.matrix tbody tr")).map((e, i) => (e.id = e.id || "m" + i)))
                 .map(id => { const e = document.getElementById(id); return [id, e.scrollWidth, e.clientWidth, e.getBoundingClientRect().right]; })"""
        )
        for name, scroll, client, right in wide:
            assert scroll <= client + 1 and right <= 390, (name, scroll, client, right)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        # Stacked: each env is a card whose cells sit one under another, each named by its column.
        cells = page.eval_on_selector_all(
            "table.matrix tbody tr:first-child td",
            "els => els.map(e => [e.dataset.label, e.getBoundingClientRect().left])",
        )
        assert [label for label, _ in cells][:2] == ["verified", "build"]
        assert len({round(left) for _label, left in cells}) == 1, cells
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("document.getElementById('fk-fields').scrollIntoView()")
        page.screenshot(path=str(SHOTS / "phone-answer.png"), full_page=False)
        page.locator("#matrix").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "phone-matrix.png"), full_page=False)
        assert w.errors == []
    finally:
        w.close()


def test_without_javascript_the_default_answer_is_there(browser, site_url, checkout):
    w = Watched(browser, java_script_enabled=False)
    try:
        page = w.page
        page.goto(site_url)
        argv = page.eval_on_selector("#fk-cmd", "e => e.textContent").split()[2:]
        code, out, err = resolver(checkout)(argv)
        assert code != 33 and any(line.startswith("fits: ") for line in err)
        assert page.is_visible("#fk-out") == bool(out)
        assert page.text_content("#fk-out").splitlines() == out
        assert page.text_content("#fk-err").splitlines() == err
        assert page.text_content("#fk-verdict") == render.EXITS[code]
        assert page.is_disabled("#sel-torch") and page.is_visible("noscript p") is not None
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "no-javascript.png"), full_page=False)
        assert w.errors == []
    finally:
        w.close()
