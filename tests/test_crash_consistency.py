"""Crash consistency: a process killed with SIGKILL at seeded random points while it appends to a
ledger, merges 1,000 lines into one, writes a set of lockfiles, the install page or a wheelhouse. After every
kill the ledger reads whole (every line checked), no fact that was there before is lost, every file is a
whole version, a folder output is the old one or the new one (never a mix, and the site never missing), and
a rerun completes. The site test kills at every line of the folder swap first: it fails against a swap in two
renames.

The writer runs in a forked child (no interpreter start per kill point), so a few hundred kill points take
seconds. Fixed seed: the same points on every run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
from kitsupport import H1, artifact, digest, verdict

from flashkit.core.atomic import write_texts_atomic
from flashkit.ledger import merge, store

ENV = "cu130-torch211"
SEED = 20261204
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def batch(i: int) -> list:
    """Build ``i`` and its build verdict: two facts, distinct for each ``i``."""
    art = artifact(ENV, H1, image=digest(f"image {i}"), wheel=f"{i:064x}")
    return [art, verdict(art, "build")]


def killed_while(work, delay_s: float, *, wait: bool = False) -> int:
    """Run ``work()`` in a child and SIGKILL it after ``delay_s`` (or let it finish first; with ``wait``, it
    ends on its own: it kills itself); its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            work()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    if not wait:
        time.sleep(delay_s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


REPO = str(Path(__file__).resolve().parents[1])


def _ours(frame) -> bool:
    """Lines of the kit (or of a test's stand-in), not of its libraries: kill points land on our own steps."""
    name = frame.f_code.co_filename
    return "site-packages" not in name and not name.startswith("<")


def traced(work, on_line, function: str | None = None) -> None:
    """Run ``work()`` with ``on_line(n)`` called at the n-th line it executes of the kit's own code, or with
    ``function``, of that function only (so that what earlier kills left, which adds lines elsewhere, does
    not move the point)."""
    count = [0]

    def tracer(frame, event, _arg):
        if not _ours(frame):
            return None
        if event == "line" and function in (None, frame.f_code.co_name):
            count[0] += 1
            on_line(count[0])
        return tracer

    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(None)


def killed_at_line(work, k: int, function: str | None = None) -> int:
    """Run ``work()`` in a child that SIGKILLs itself at the ``k``-th line it executes of the kit's own code
    (between any two of its steps: after a write, before a rename, ...), or of ``function``; its exit status."""

    def kill_at_k(n: int) -> None:
        if n >= k:
            os.kill(os.getpid(), signal.SIGKILL)

    return killed_while(lambda: traced(work, kill_at_k, function), 0.0, wait=True)


def lines_of(work, function: str | None = None) -> int:
    """How many lines of the kit's own code (or of ``function``) one run of ``work()`` executes."""
    seen = [0]
    traced(work, lambda n: seen.__setitem__(0, n), function)
    return seen[0]


def ids(root: Path) -> set[str]:
    return {f.id for f in store.load(root, ENV).facts}  # raises on any bad line


def test_appends_killed_at_200_points_lose_nothing(tmp_path):
    rng = random.Random(SEED)
    seen: set[str] = set()
    cursor = [0]

    def append_many():
        for i in range(cursor[0], cursor[0] + 40):
            store.append(tmp_path, ENV, batch(i))

    one = lambda: store.append(tmp_path, ENV, batch(10_000 + cursor[0]))  # noqa: E731
    span = lines_of(one)
    for point in range(200):
        if point % 2:
            killed_while(append_many, rng.uniform(0, 0.03))
        else:  # at a line of one append's own code: between its read, its write and its rename
            killed_at_line(one, rng.randint(1, span))
        now = ids(tmp_path)
        assert seen <= now, f"kill point {point}: {len(seen - now)} facts lost"
        seen = now
        cursor[0] += 7  # the next writer overlaps what this one may have written: deduplicated by id
    append_many()  # the rerun completes, and leaves the ledger whole
    final = ids(tmp_path)
    assert seen <= final and len(final) >= 2 * (cursor[0] + 40 - 7 * 200)


def test_a_merge_of_1000_lines_killed_at_100_points_then_rerun(tmp_path):
    rng = random.Random(SEED + 1)
    upload = tmp_path / "upload"
    upload.mkdir()
    lines = [f.line() for i in range(500) for f in batch(i)]
    (upload / f"{ENV}.jsonl").write_text("".join(line + "\n" for line in lines))
    root = tmp_path / "repo"
    (root / "envs").mkdir(parents=True)
    (root / "envs" / f"{ENV}.yaml").write_text((Path(__file__).parents[1] / "envs" / f"{ENV}.yaml").read_text())
    seen: set[str] = set()
    for point in range(100):
        killed_while(lambda: merge.merge(root, [upload]), rng.uniform(0, 0.2))
        now = ids(root)
        assert seen <= now, f"kill point {point}: facts lost"
        seen = now
    merge.merge(root, [upload])
    assert len(ids(root)) == 1000


def test_lockfile_sets_killed_at_200_points_are_whole_versions(tmp_path):
    rng = random.Random(SEED + 2)
    files = [tmp_path / f"py3.{n}.txt" for n in (11, 12, 13)]

    def text(version: int, name: str) -> str:
        return "".join(f"pkg{k}=={version} --hash=sha256:{k:064x}\n" for k in range(400)) + f"# end {name}\n"

    write_texts_atomic({p: text(0, p.name) for p in files})
    span = lines_of(lambda: write_texts_atomic({p: text(0, p.name) for p in files}))
    for point in range(200):
        version = point + 1
        write = lambda v=version: write_texts_atomic({p: text(v, p.name) for p in files})  # noqa: E731
        killed_at_line(write, rng.randint(1, span)) if point % 2 else killed_while(write, rng.uniform(0, 0.01))
        for p in files:
            body = p.read_text()
            first = int(body.split("==", 1)[1].split(" ", 1)[0])
            assert body == text(first, p.name), f"kill point {point}: {p.name} is not a whole version"
    write_texts_atomic({p: text(999, p.name) for p in files})
    assert all(p.read_text() == text(999, p.name) for p in files)


def _version_of(folder: Path) -> int | None:
    """The one version every file of ``folder`` holds, or None when the files disagree (a mix)."""
    versions = {int(p.read_text().split(" ", 1)[0]) for p in folder.rglob("*") if p.is_file() and p.suffix != ""}
    return versions.pop() if len(versions) == 1 else None


def test_a_site_killed_at_100_points_is_the_old_or_the_new_never_missing(tmp_path):
    from flashkit.site import render

    rng = random.Random(SEED + 3)
    out = tmp_path / "site"

    def files(v: int) -> dict[str, bytes]:
        pages = {f"page{k}.html": f"{v} page {k}\n".encode() for k in range(30)}
        return {**pages, "assets/site.css": f"{v} css\n".encode(), render.MARKER: b"written by flashkit site\n"}

    render.write_site(out, files(0))
    span = lines_of(lambda: render.write_site(out, files(0)))
    # First every line of the swap itself (where a two-step replace leaves no site), then seeded points.
    swap = lines_of(lambda: render.write_site(out, files(0)), "replace_folder")
    last = 0
    for point in range(100):
        write = lambda v=point + 1: render.write_site(out, files(v))  # noqa: E731
        if point < swap:
            killed_at_line(write, point + 1, "replace_folder")
        elif point % 2:
            killed_at_line(write, rng.randint(1, span))
        else:
            killed_while(write, rng.uniform(0, 0.01))
        assert out.is_dir(), f"kill point {point}: the site is missing"  # swapped in one step, never removed
        now = _version_of(out)
        assert now is not None and now in (last, point + 1), f"kill point {point}: a mix of versions"
        assert len(list(out.rglob("*.html"))) == 30
        last = now
    render.write_site(out, files(999))  # the rerun completes over what the kills left
    assert _version_of(out) == 999


def test_a_wheelhouse_killed_at_100_points_is_the_old_or_the_new(tmp_path):
    from flashkit.ledger.gate import parse_policy
    from flashkit.publish import wheel_index
    from flashkit.publish.wheelhouse import VerifiedWheel

    rng = random.Random(SEED + 4)
    wheel = tmp_path / "flash_kernels-0.1.0+cu130stable2.10-cp39-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"0 wheel\n")
    out = tmp_path / "wheelhouse"

    def write(v: int) -> None:
        import hashlib

        vw = VerifiedWheel(ENV, H1, wheel, hashlib.sha256(wheel.read_bytes()).hexdigest(), parse_policy(None), ())
        wheel_index.write_all(out, [(vw, {"py3.12.txt": f"{v} requirements\n"})], {})

    write(0)
    span = lines_of(lambda: write(0))
    for point in range(100):
        work = lambda v=point + 1: write(v)  # noqa: E731
        killed_at_line(work, rng.randint(1, span)) if point % 2 else killed_while(work, rng.uniform(0, 0.01))
        assert out.is_dir(), f"kill point {point}: the wheelhouse is missing"
        body = (out / ENV / "py3.12.txt").read_text()
        assert int(body.split(" ", 1)[0]) in range(point + 2), body
        assert (out / wheel_index.MANIFEST).is_file()
    write(999)
    assert (out / ENV / "py3.12.txt").read_text() == "999 requirements\n"
