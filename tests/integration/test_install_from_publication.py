"""From a verified build to a working install in one command, as a new user gets it: the two envs this run
built are published (`flashkit publish-wheels`), the install page is made with the publication beside it
(`flashkit site --with-publication`) and served by nginx; the same again with the wheels uploaded to devpi,
an index server with a login. Then, for each env, in a Debian base image of a Python other than the image's
(a fresh machine: no clone, no torch), the command the page shows in Chromium is run exactly as shown, in a
fresh venv: torch and the verified kernel wheel install by hash, `import flash_kernels` works, the kernel
suite's CPU tier passes (with the test set the page names), and `flashkit doctor`, installed from the
publication's kit, names that env.

Needs what `.ci/run` makes and installs: both envs built (FLASHKIT_REQUIRE_BUILT), docker, nginx, devpi,
Chromium with Playwright, and PyPI (torch and its CUDA libraries are downloaded: pip's and uv's caches are
shared by the containers of one run).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from indexsupport import DEVPI_PASSWORD, DEVPI_USER, free_port, have_devpi, nginx, start_devpi, start_nginx
from kitsupport import REPO, not_built

from flashkit.images.build import result_path
from flashkit.publish import attest

pytestmark = [pytest.mark.docker, pytest.mark.browser]

# env -> (torch, torch's own CUDA, the page's Python, the env whose runtime base (Debian) runs that Python)
USERS = {
    "cu124-torch27": ("2.7.1", "12.6", "3.11", "cu130-torch211"),  # PyPI's torch 2.7.1 on bookworm's Python
    "cu130-torch211": ("2.11.0", "13.0", "3.13", "cu124-torch27"),  # PyPI's torch 2.11.0 on trixie's Python
}
COPY = ("envs", "lockfiles", "templates", "flash_kernels", "verified", "flashkit", "pyproject.toml", "README.md")


def _need(ok: bool, why: str) -> None:
    if not ok:
        not_built(why)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, built_env):
    """A copy of this checkout with both envs' build results: what is published here is recorded in the copy's
    ledgers, never in the repository's."""
    root = tmp_path_factory.mktemp("checkout")
    for name in COPY:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            shutil.copy2(src, root / name)
    for env in USERS:
        res = built_env(env)
        dest = result_path(root, env, res.input_hash)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(result_path(REPO, env, res.input_hash), dest)
    return root


def _flashkit(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [shutil.which("flashkit") or "flashkit", "--repo", str(root), *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=1800,
    )  # fmt: skip
    return done


@pytest.fixture(scope="module")
def sites(checkout, tmp_path_factory):
    """Both forms, each a site served by nginx: the static index beside the page, and the page beside
    requirement files that name devpi (the wheels uploaded there with twine and the login)."""
    _need(nginx() is not None, "nginx is not installed (apt-get install nginx-light)")
    _need(have_devpi(), "devpi-server/devpi-client are not installed (the test extra)")
    work = tmp_path_factory.mktemp("publish")
    key, pub_key = attest.generate_keys(work / "keys", repo_root=None)
    signing = {attest.SIGNING_KEY_ENV: str(key)}
    served, stops = {}, []
    devpi = start_devpi(work / "devpi")
    stops.append(devpi.stop)
    try:
        for form in ("static", "server"):
            port = free_port()
            url = f"http://127.0.0.1:{port}/"
            extra, env = [], dict(signing)
            if form == "server":
                extra = ["--index-server", devpi.upload, "--index-url", devpi.index]
                env |= {"TWINE_USERNAME": DEVPI_USER, "TWINE_PASSWORD": DEVPI_PASSWORD}
            pub = _flashkit(checkout, "publish-wheels", *USERS, "--url", url, "--out", str(work / f"pub-{form}"),
                            *extra, env=env)  # fmt: skip
            assert pub.returncode == 0, pub.stderr
            assert DEVPI_PASSWORD not in pub.stdout + pub.stderr
            site = _flashkit(checkout, "site", "--out", str(work / f"site-{form}"),
                             "--with-publication", str(work / f"pub-{form}"))  # fmt: skip
            assert site.returncode in (0, 3), site.stderr  # 3: a spec this checkout cannot read is named, not hidden
            server = start_nginx(work / f"nginx-{form}", work / f"site-{form}", port)
            stops.append(server.stop)
            served[form] = (url, work / f"site-{form}")
        yield {"served": served, "work": work, "public_key": pub_key}
    finally:
        for stop in reversed(stops):
            stop()


def test_no_published_file_holds_the_index_login(sites):
    for _url, folder in sites["served"].values():
        for f in folder.rglob("*"):
            assert not f.is_file() or DEVPI_PASSWORD.encode() not in f.read_bytes(), f


def test_every_fit_the_page_shows_names_a_file_the_site_serves(sites):
    """Each published URL on the page is served by nginx with the bytes of the file in the publication."""
    import re
    import urllib.request

    for url, folder in sites["served"].values():
        page = (folder / "index.html").read_text()
        found = set(re.findall(re.escape(url) + r"[A-Za-z0-9_./+-]+\.txt", page))
        assert found, f"no published requirement URL on the page at {url}"
        for link in sorted(found):
            with urllib.request.urlopen(link, timeout=30) as resp:
                assert resp.read() == (folder / link.removeprefix(url)).read_bytes(), link


def _page_lines(browser, url: str, torch: str, cuda: str, python: str) -> tuple[list[str], str]:
    """What the page shows for the choice in its URL: the command (stdout) and the explanation."""
    page = browser.new_page()
    try:
        page.goto(f"{url}index.html?torch={torch}&cuda={cuda}&python={python}")
        page.wait_for_function("document.getElementById('fk-out').textContent.length > 0", timeout=30000)
        out = page.text_content("#fk-out") or ""
        err = page.text_content("#fk-err") or ""
    finally:
        page.close()
    return [ln for ln in out.splitlines() if ln.strip()], err


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        not_built("no `chromium` on PATH: `apt-get install chromium`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


def _in_fresh_machine(image: str, script: str, cache: Path) -> subprocess.CompletedProcess:
    """``script`` (bash) as root in a new container of ``image`` on the host's network (the servers listen on
    loopback), with this host's CA bundle when it has one (a TLS-intercepting proxy), uv, and shared caches."""
    mounts = ["-v", f"{cache}:/cache", "-v", f"{shutil.which('uv')}:/usr/local/bin/uv:ro"]
    env = ["-e", "PIP_CACHE_DIR=/cache/pip", "-e", "UV_CACHE_DIR=/cache/uv", "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1"]
    ca = os.environ.get("SSL_CERT_FILE")
    if ca and Path(ca).is_file():
        mounts += ["-v", f"{ca}:/etc/flashkit-ca.pem:ro"]
        env += ["-e", "PIP_CERT=/etc/flashkit-ca.pem", "-e", "SSL_CERT_FILE=/etc/flashkit-ca.pem"]
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        if os.environ.get(var):
            env += ["-e", f"{var}={os.environ[var]}"]
    env += ["-e", "NO_PROXY=127.0.0.1,localhost", "-e", "no_proxy=127.0.0.1,localhost"]
    argv = [
        "docker",
        "run",
        "--rm",
        "--network",
        "host",
        *mounts,
        *env,
        image,
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=3600)


@pytest.mark.parametrize("env", sorted(USERS))
def test_the_command_the_page_shows_installs_a_working_kernel_on_a_fresh_machine(
    env, sites, browser, runtime_base, tmp_path_factory
):
    torch, cuda, python, base_env = USERS[env]
    image = runtime_base(base_env)
    cache = tmp_path_factory.getbasetemp() / "install-cache"
    cache.mkdir(exist_ok=True)
    steps = []
    for form, (url, _folder) in sites["served"].items():
        out, err = _page_lines(browser, url, torch, cuda, python)
        assert len(out) == 1 and out[0].startswith(f"pip install --require-hashes -r {url}requirements/{env}/"), (
            out,
            err,
        )
        command = out[0]
        # The page offers uv's form too (it removes nothing); the static site is installed with pip, the
        # server's with uv, so each command the page shows runs once.
        uv = next(ln.split("or, with uv: ", 1)[1] for ln in err.splitlines() if "or, with uv: " in ln)
        tests = next(ln.split("CPU tier: ", 1)[1] for ln in err.splitlines() if "CPU tier: " in ln)
        venv = f"/tmp/{form}"
        run = command if form == "static" else f"VIRTUAL_ENV={venv} {uv}"
        steps += [
            f"echo '== {form}: {run}'",
            f"python3 -m venv {venv}",
            f"(export PATH={venv}/bin:$PATH; {run})",
            f"{venv}/bin/python -c 'import flash_kernels, torch; print(\"imported\", flash_kernels.__file__, torch.__version__)'",
        ]
        if form == "static":
            steps += [
                f"(export PATH={venv}/bin:$PATH; {tests})",
                f"{venv}/bin/python -m flash_kernels.selftest --tier cpu -q -x",
                f"python3 -m venv /tmp/kit && /tmp/kit/bin/pip install -q --require-hashes -r {url}kit/requirements.txt",
            ]
        steps.append(
            f"/tmp/kit/bin/flashkit doctor --site {url} --python {venv}/bin/python --json > /cache/doctor-{env}-{form}.json || true"
        )
    script = "python3 --version\n" + "\n".join(steps)
    done = _in_fresh_machine(image, script, cache)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    assert f"Python {python}" in log
    assert "FLASH_KERNELS_SELFTEST tier=cpu" in log and " failed=0" in log, log[-3000:]
    for form in sites["served"]:
        report = json.loads((cache / f"doctor-{env}-{form}.json").read_text())
        rec = report["recommendation"]
        assert rec["env"] == env, (form, rec)
        assert rec["install"] and rec["install"][0].startswith("pip install --require-hashes -r "), rec
        errors = [f for f in report["findings"] if f["severity"] == "error"]
        assert errors == [], errors
    assert shlex.quote(DEVPI_PASSWORD) not in log
