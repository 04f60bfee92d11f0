"""`flashkit publish-wheels`: the gate, the static index served over HTTP, pip on a fresh venv, the ledger
facts, and what resolve and doctor then say.

The wheels are small real wheels written here (a stand-in torch, one dependency of it, a test-only package
and flash_kernels); the index is served by a real HTTP server on loopback and installed from by the real pip
of a fresh venv, isolated from this host's pip configuration. So the test checks what a user's one command
does: hashes enforced, the kernel wheel from the publication's index, exactly the production set.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest
from indexsupport import DEVPI_PASSWORD, DEVPI_USER, free_port, have_devpi, start_devpi
from kitsupport import artifact, cached_build, fresh_venv, input_hash, make_wheel, pip, verdict

from flashkit.ledger import store
from flashkit.publish import attest

ENV = "cu130-torch211"
IMAGE = "sha256:" + "3" * 64


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(folder: Path, port: int):
    """A real HTTP server on loopback over ``folder`` (as a user's web server serves a publication)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def setup(kit_repo, cli, tmp_path, monkeypatch):
    """kit_repo whose env's Python 3.11 set locks a stand-in torch, its dependency and a test-only package,
    with a cached build, a ledger, and a signing key."""
    deps = tmp_path / "deps"
    torch = make_wheel(deps, "torch", "2.11.0", "torch")
    dep = make_wheel(deps, "toydep", "1.0", "toydep")
    tool = make_wheel(deps, "toytest", "1.0", "toytest")
    for p in [kit_repo / "lockfiles" / f"{ENV}.txt", *(kit_repo / "lockfiles" / ENV).glob("py*.txt")]:
        p.unlink()
    (kit_repo / "lockfiles" / ENV / "py3.11.txt").write_text(
        f"# flashkit lock {ENV} (test)\n"
        f"toydep==1.0 \\\n    --hash=sha256:{sha(dep)}\n    # via torch\n"
        f"toytest==1.0 \\\n    --hash=sha256:{sha(tool)}\n    # via -r requirements.in\n"
        f"torch==2.11.0 \\\n    --hash=sha256:{sha(torch)}\n    # via -r requirements.in\n"
    )
    wheel = make_wheel(tmp_path / "exported", "flash_kernels", "0.1.0", "flash_kernels")
    h = input_hash(kit_repo, ENV)
    cached_build(kit_repo, ENV, h, wheel, IMAGE)
    art = artifact(ENV, h, image=IMAGE, wheel=sha(wheel))
    store.append(kit_repo, ENV, [art])
    priv, pub = attest.generate_keys(tmp_path / "keys", repo_root=None)
    monkeypatch.setenv(attest.SIGNING_KEY_ENV, str(priv))

    def verdicts(**v: str) -> None:
        store.append(kit_repo, ENV, [verdict(art, t.replace("_", "-"), x) for t, x in v.items()])

    return {"repo": kit_repo, "cli": cli, "deps": deps, "wheel": wheel, "hash": h, "verdicts": verdicts, "pub": pub}


def publish(s, out: Path, url: str, *more: str):
    return s["cli"]("--repo", str(s["repo"]), "publish-wheels", ENV, "--url", url, "--out", str(out), "--no-kit", *more)


def install(py: Path, url: str, deps: Path, *more: str):
    """The page's command, with torch and its dependencies taken from ``deps`` instead of PyPI."""
    return pip(py, "install", "--require-hashes", "--index-url", f"file://{deps}/none/", "--find-links", str(deps),
               "-r", url, *more)  # fmt: skip


def test_the_published_command_installs_torch_and_the_verified_wheel_by_hash(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out, port = tmp_path / "pub", free_port()
    url = f"http://127.0.0.1:{port}/"
    r = publish(s, out, url)
    assert r.code == 0, r.err
    assert r.out.strip() == f"{ENV} Python 3.11: pip install --require-hashes -r {url}requirements/{ENV}/py3.11.txt"
    prod = (out / "requirements" / ENV / "py3.11.txt").read_text()
    assert f"--extra-index-url {url}simple/\n" in prod
    assert f"flash-kernels==0.1.0 \\\n    --hash=sha256:{sha(s['wheel'])}\n" in prod
    assert "toytest" not in prod and "toytest==1.0" in (out / "requirements" / ENV / "py3.11-test.txt").read_text()
    page = (out / "simple" / "flash-kernels" / "index.html").read_text()
    assert f"../../files/{s['wheel'].name}#sha256={sha(s['wheel'])}" in page

    # The ledger says what was published, and resolve now answers with the URL.
    pubs = store.load(s["repo"], ENV).wheel_publications(s["hash"])
    assert len(pubs) == 1 and pubs[0].wheel_sha256 == sha(s["wheel"])
    assert pubs[0].publication == sha(out / "index.json")
    res = s["cli"]("--repo", str(s["repo"]), "resolve", "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.11")
    assert res.code == 0, res.err
    assert res.out.splitlines()[0] == f"pip install --require-hashes -r {url}requirements/{ENV}/py3.11.txt"

    with serve(out, port):
        py = fresh_venv(tmp_path / "venv")
        done = install(py, f"{url}requirements/{ENV}/py3.11.txt", s["deps"])
        assert done.returncode == 0, done.stdout + done.stderr
        assert sorted(pip(py, "freeze").stdout.split()) == ["flash_kernels==0.1.0", "torch==2.11.0", "toydep==1.0"]
        done = install(py, f"{url}requirements/{ENV}/py3.11-test.txt", s["deps"])
        assert done.returncode == 0, done.stdout + done.stderr
        assert "toytest==1.0" in pip(py, "freeze").stdout.split()

        # Bytes that are not the verified wheel's are refused by pip, whatever the index says.
        served = out / "files" / s["wheel"].name
        served.write_bytes(served.read_bytes() + b"\0")
        py2 = fresh_venv(tmp_path / "venv2")
        done = install(py2, f"{url}requirements/{ENV}/py3.11.txt", s["deps"])
        assert done.returncode != 0
        assert "DO NOT MATCH THE HASHES" in done.stdout + done.stderr


def test_the_attestation_names_the_wheel_and_every_verdict(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out = tmp_path / "pub"
    assert publish(s, out, "https://example.org/flash").code == 0
    manifest = json.loads((out / "index.json").read_text())
    entry = manifest["files"][s["wheel"].name]
    assert entry["sha256"] == sha(s["wheel"])
    carried = entry["envs"][ENV]
    assert carried["input_hash"] == s["hash"]
    assert sorted(v["tier"] for v in carried["verdicts"]) == ["abi", "build", "cpu", "gpu"]
    envelope = (out / carried["attestation"]["path"]).read_bytes()
    assert hashlib.sha256(envelope).hexdigest() == carried["attestation"]["sha256"]
    checked = attest.open_envelope(envelope, attest.load_public_key(s["pub"]), "sha256:" + sha(s["wheel"]))
    assert checked.statement["subject"][0]["name"] == s["wheel"].name
    assert checked.statement["predicate"]["input_hash"] == s["hash"]
    # The base URL ends in one '/', and the matrix doctor reads names the published files.
    assert manifest["base_url"] == "https://example.org/flash/"
    row = manifest["matrix"]["envs"][ENV]
    assert row["published"]["3.11"]["requirements"] == f"https://example.org/flash/requirements/{ENV}/py3.11.txt"
    # The matrix names where the wheel is published.
    listed = s["cli"]("--repo", str(s["repo"]), "matrix", "--json")
    (mine,) = [e for e in json.loads(listed.out) if e["env"] == ENV]
    assert "wheel:https://example.org/flash/" in mine["published"]


def test_an_unverified_wheel_reaches_no_index_and_nothing_is_written(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="failed")
    out = tmp_path / "pub"
    r = publish(s, out, "https://example.org/")
    assert r.code == 17, r.err
    assert "cpu" in r.err and not out.exists()
    assert store.load(s["repo"], ENV).wheel_publications() == []
    # --all lists it as skipped, and with nothing verified there is nothing to publish.
    r = s["cli"]("--repo", str(s["repo"]), "publish-wheels", "--all", "--url", "https://example.org/",
                 "--out", str(out), "--no-kit")  # fmt: skip
    assert r.code == 17 and "nothing to publish" in r.err and f"skipped {ENV}" in r.err
    assert not out.exists()


@pytest.mark.parametrize(
    "url",
    ["https://user:secret@example.org/", "ftp://example.org/", "https://example.org/?x=1", "example.org", "http:// x/"],
)
def test_urls_that_cannot_be_published_are_refused(setup, tmp_path, url):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    r = publish(s, tmp_path / "pub", url)
    assert r.code == 2, r.err
    assert "secret" not in r.out + r.err
    assert not (tmp_path / "pub").exists()


def test_a_folder_it_did_not_write_is_not_replaced(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out = tmp_path / "pub"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    r = publish(s, out, "https://example.org/")
    assert r.code == 2 and (out / "mine.txt").read_text() == "keep"


def test_the_latest_publication_is_the_answer_and_none_means_exit_35(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out = tmp_path / "pub"
    assert publish(s, out, "https://a.example/").code == 0
    assert publish(s, tmp_path / "pub2", "https://b.example/").code == 0
    res = s["cli"]("--repo", str(s["repo"]), "resolve", "--torch", "2.11.0", "--python", "3.11", "--cuda", "13.0")
    assert res.out.startswith("pip install --require-hashes -r https://b.example/")
    # With nothing published the answer says so: exit 35, no command on stdout.
    (s["repo"] / "verified" / f"{ENV}.jsonl").write_text(
        "".join(ln + "\n" for ln in (s["repo"] / "verified" / f"{ENV}.jsonl").read_text().splitlines()
                if '"wheel-publication"' not in ln)
    )  # fmt: skip
    res = s["cli"]("--repo", str(s["repo"]), "resolve", "--torch", "2.11.0", "--python", "3.11", "--cuda", "13.0")
    assert res.code == 35 and res.out == ""
    assert "nothing of it is published yet" in res.err and f"nox -s test-{ENV}" in res.err


def test_the_site_serves_the_publication_only_when_it_is_the_one_the_ledger_records(setup, tmp_path):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out = tmp_path / "pub"
    assert publish(s, out, "https://example.org/").code == 0
    site = tmp_path / "site"
    r = s["cli"]("--repo", str(s["repo"]), "site", "--out", str(site), "--with-publication", str(out))
    assert r.code in (0, 3), r.err
    assert (site / "requirements" / ENV / "py3.11.txt").read_bytes() == (
        out / "requirements" / ENV / "py3.11.txt"
    ).read_bytes()
    assert (site / "files" / s["wheel"].name).is_file() and (site / "index.html").is_file()
    # The page's answer for this env is the publication's one command.
    from sitesupport import page_data

    from flashkit.site import selector

    data = page_data((site / "index.html").read_text())
    labels = [[o["label"] for o in opts] for opts in data["selects"]]
    idx = [labels[0].index("2.11.0"), labels[1].index("CUDA 13.0"), labels[2].index("3.11"), 0]
    shown = selector.shown(data, idx)
    assert shown.code == 0 and shown.out == (
        f"pip install --require-hashes -r https://example.org/requirements/{ENV}/py3.11.txt",
    )
    # An edited requirement file is not the publication the ledger recorded: refused, nothing written.
    (out / "requirements" / ENV / "py3.11.txt").write_text("torch\n")
    r = s["cli"]("--repo", str(s["repo"]), "site", "--out", str(tmp_path / "site2"), "--with-publication", str(out))
    assert r.code == 2 and "not the file the ledger recorded" in r.err
    assert not (tmp_path / "site2").exists()


# -- an index server with a login: devpi, uploaded to with twine ---------------------------------------------
@pytest.fixture(scope="module")
def devpi(tmp_path_factory):
    """A real devpi-server on loopback (tests/indexsupport.py); skips where devpi is not installed (the test
    extra installs it)."""
    if not have_devpi():
        pytest.skip("devpi-server and devpi-client are not installed (pip install -e '.[test]')")
    server = start_devpi(tmp_path_factory.mktemp("devpi"))
    yield {"upload": server.upload, "index": server.index}
    server.stop()


def _server_publish(s, out: Path, url: str, devpi: dict):
    return s["cli"]("--repo", str(s["repo"]), "publish-wheels", ENV, "--url", url, "--out", str(out), "--no-kit",
                    "--index-server", devpi["upload"], "--index-url", devpi["index"])  # fmt: skip


def test_the_index_server_form_uploads_with_the_login_and_installs_from_the_server(setup, devpi, tmp_path, monkeypatch):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out, port = tmp_path / "pub", free_port()
    url = f"http://127.0.0.1:{port}/"

    monkeypatch.setenv("TWINE_USERNAME", DEVPI_USER)
    monkeypatch.setenv("TWINE_PASSWORD", "not-the-password")
    r = _server_publish(s, out, url, devpi)
    assert r.code == 32, r.err
    assert not out.exists() and store.load(s["repo"], ENV).wheel_publications() == []

    monkeypatch.setenv("TWINE_PASSWORD", DEVPI_PASSWORD)
    r = _server_publish(s, out, url, devpi)
    assert r.code == 0, r.err
    prod = (out / "requirements" / ENV / "py3.11.txt").read_text()
    assert f"--extra-index-url {devpi['index']}\n" in prod
    assert not (out / "simple").exists() and not (out / "files").exists()  # the server serves the wheel
    # The login is in no published file and in nothing the command printed.
    assert DEVPI_PASSWORD not in r.out + r.err
    for f in out.rglob("*"):
        assert not f.is_file() or DEVPI_PASSWORD.encode() not in f.read_bytes(), f
    assert DEVPI_PASSWORD not in (s["repo"] / "verified" / f"{ENV}.jsonl").read_text()
    # Publishing again finds the very file on the index and keeps it.
    r = _server_publish(s, tmp_path / "pub2", url, devpi)
    assert r.code == 0 and "already on the index" in r.err

    with serve(out, port):
        py = fresh_venv(tmp_path / "venv")
        done = install(py, f"{url}requirements/{ENV}/py3.11.txt", s["deps"])
        assert done.returncode == 0, done.stdout + done.stderr
        assert "flash_kernels==0.1.0" in pip(py, "freeze").stdout.split()


def test_the_index_server_never_gets_a_second_file_of_one_name(setup, devpi, tmp_path, monkeypatch):
    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    monkeypatch.setenv("TWINE_USERNAME", DEVPI_USER)
    monkeypatch.setenv("TWINE_PASSWORD", DEVPI_PASSWORD)
    # The module's server already holds flash_kernels-0.1.0-py3-none-any.whl from the test above, or gets it here.
    assert _server_publish(s, tmp_path / "pub", "https://example.org/", devpi).code == 0
    # Another build's bytes under the same name: refused before anything is written or recorded.
    other = make_wheel(tmp_path / "other", "flash_kernels", "0.1.0", "flash_kernels_other")
    h = s["hash"]
    cached_build(s["repo"], ENV, h, other, IMAGE)
    art = artifact(ENV, h, image=IMAGE, wheel=sha(other), date="2026-12-01T10:00:00+00:00")
    store.append(s["repo"], ENV, [art, *(verdict(art, t) for t in ("build", "abi", "cpu", "gpu"))])
    before = (s["repo"] / "verified" / f"{ENV}.jsonl").read_text()
    r = _server_publish(s, tmp_path / "pub3", "https://example.org/", devpi)
    assert r.code == 18, r.err
    assert "already holds" in r.err and not (tmp_path / "pub3").exists()
    assert (s["repo"] / "verified" / f"{ENV}.jsonl").read_text() == before


def test_doctor_and_resolve_read_the_publication_as_they_read_the_checkout(setup, tmp_path, monkeypatch):
    """``--site``: the matrix in index.json gives the same facts as the checkout it was made from, plus the
    published URLs; resolve answers from it in a folder with no clone."""
    from flashkit.doctor import published, repo

    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    out = tmp_path / "pub"
    assert publish(s, out, "https://flash.example/").code == 0
    here = repo.load(s["repo"])
    there = published.fetch(str(out))
    assert there.problem is None and there.broken == here.broken
    assert [str(x.id) for x in there.specs] == [str(x.id) for x in here.specs]
    assert there.verification == here.verification and there.lock_cuda == here.lock_cuda
    for env, cov in here.requirements.items():
        assert there.requirements[env].covered == cov.covered
        assert there.requirements[env].published == cov.published, env
    assert there.requirements[ENV].published["3.11"][0] == f"https://flash.example/requirements/{ENV}/py3.11.txt"

    monkeypatch.chdir(tmp_path)  # no checkout here
    r = s["cli"]("resolve", "--site", str(out), "--torch", "2.11.0", "--cuda", "13.0", "--python", "3.11")
    assert r.code == 0, r.err
    assert r.out == f"pip install --require-hashes -r https://flash.example/requirements/{ENV}/py3.11.txt\n"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "index.json").write_text('{"schema_version": 1, "matrix": ' + "[" * 5000 + "]" * 5000 + "}")
    r = s["cli"]("resolve", "--site", str(bad), "--torch", "2.11.0", "--python", "3.11")
    assert r.code == 3 and "index.json" in r.err and "Traceback" not in r.err


def test_a_wheel_handed_over_without_its_build_result_is_found_where_builds_export(setup, tmp_path):
    """CI's pages job gets each build job's .work/wheels/<env>/<input hash>/ and no build result: the wheel is
    taken from there, and the gate judges its bytes as ever."""
    import shutil

    from flashkit.images.build import result_path

    s = setup
    s["verdicts"](build="passed", abi="passed", cpu="passed", gpu="passed")
    result_path(s["repo"], ENV, s["hash"]).unlink()
    assert publish(s, tmp_path / "pub", "https://example.org/").code == 17  # no wheel anywhere: refused
    exported = s["repo"] / ".work" / "wheels" / ENV / s["hash"]
    exported.mkdir(parents=True)
    shutil.copy2(s["wheel"], exported / s["wheel"].name)
    r = publish(s, tmp_path / "pub", "https://example.org/")
    assert r.code == 0, r.err
    (exported / s["wheel"].name).write_bytes(b"not the verified wheel")
    r = publish(s, tmp_path / "pub2", "https://example.org/")
    assert r.code == 17 and "produced a wheel with sha256" in r.err


def test_a_verified_file_that_is_not_a_wheel_is_refused_by_name(kit_repo, cli, tmp_path, monkeypatch):
    """The gate judged these bytes, but they are no wheel: refused (17) naming the file, nothing written."""
    bogus = tmp_path / "exported" / "flash_kernels-0.1.0-py3-none-any.whl"
    bogus.parent.mkdir()
    bogus.write_bytes(b"PK\x03\x04 not really a zip")
    h = input_hash(kit_repo, ENV)
    cached_build(kit_repo, ENV, h, bogus, IMAGE)
    art = artifact(ENV, h, image=IMAGE, wheel=sha(bogus))
    store.append(kit_repo, ENV, [art, *(verdict(art, t) for t in ("build", "abi", "cpu", "gpu"))])
    priv, _pub = attest.generate_keys(tmp_path / "keys", repo_root=None)
    monkeypatch.setenv(attest.SIGNING_KEY_ENV, str(priv))
    r = cli("--repo", str(kit_repo), "publish-wheels", ENV, "--url", "https://example.org/", "--out",
            str(tmp_path / "pub"), "--no-kit")  # fmt: skip
    assert r.code == 17 and "not a readable wheel" in r.err and "Traceback" not in r.err
    assert not (tmp_path / "pub").exists()
