"""gc's plan: what it keeps for this checkout and what it removes."""

from __future__ import annotations

import os
from pathlib import Path

from flashkit.images import gc
from flashkit.images.build import image_ref
from flashkit.plan.plan import plan_of
from flashkit.plan.specfile import load_all

REPO = Path(__file__).resolve().parents[1]


PLANS = [plan_of(REPO, s) for s in load_all(REPO)]


def test_keeps_current_input_hash_and_latest_of_every_env():
    keep = gc.keep_tags(PLANS)
    for plan in PLANS:
        short, env = plan.tag, plan.env_id
        assert {image_ref(env, short), image_ref(env, f"{short}-builder"), image_ref(env, "latest-local")} <= keep


def test_plan_removes_old_hashes_and_check_rebuilds_only_under_the_prefix():
    current = next(p.tag for p in PLANS if p.env_id == "cu130-torch211")
    tags = [
        f"flashkit/cu130-torch211:{current}",
        f"flashkit/cu130-torch211:{current}-builder",
        f"flashkit/cu130-torch211:{current}-check",
        "flashkit/cu130-torch211:fk1-0123456789abcdef",
        "flashkit/cu124-torch27:latest-local-builder",
        "flashkit/debian:bookworm-0123456789ab",
        "127.0.0.1:5000/org/flash:torch2.11-cu13.0-py3.11",
        "debian:bookworm",
    ]
    p = gc.choose(tags, gc.keep_tags(PLANS))
    assert set(p.keep) == {tags[0], tags[1], tags[4]}
    assert set(p.remove) == {tags[2], tags[3], tags[5]}  # bases live in buildah's storage, not the engine's
    assert gc.choose(tags, set(), prefix="flashkit-gc-test/") == gc.Collection(keep=(), remove=())


def _row(name: str, image: str = "", cid: str = "c" * 64) -> dict:
    return {"id": cid, "containername": name, "imagename": image, "builder": True}


def test_stale_containers_are_the_ones_no_running_process_can_own():
    """A killed run's working container pins its image's layers (gigabytes) until removed: gc chooses
    flashkit's own whose pid is gone, and buildah build's leftovers only while no buildah runs."""
    rows = [
        _row("flashkit-wc-4242-0a1b2c3d", "localhost/flashkit/cu130-torch211:fk2-x-builder"),  # pid gone
        _row("flashkit-wc-17-0a1b2c3d", "localhost/flashkit/cu130-torch211:fk2-x-builder"),  # pid alive
        _row("1edc3218eccc-working-container-3"),  # an interrupted build's stage
        _row("cu130-torch211-working-container-8", "localhost/flashkit/cu130-torch211:fk2-x-builder"),
        _row("myapp-working-container", "localhost/someone/myapp:1"),  # not flashkit's image
        _row("dev-box", "localhost/flashkit/debian:trixie"),  # named by someone: never
    ]
    alive = {17}.__contains__
    idle = gc.stale_containers(rows, prefix="flashkit/", alive=alive, building=False)
    assert [n for _, n, _ in idle] == [
        "flashkit-wc-4242-0a1b2c3d",
        "1edc3218eccc-working-container-3",
        "cu130-torch211-working-container-8",
    ]
    assert "4242" in idle[0][2]
    # While a buildah process runs, only the pid-named containers can be judged.
    busy = gc.stale_containers(rows, prefix="flashkit/", alive=alive, building=True)
    assert [n for _, n, _ in busy] == ["flashkit-wc-4242-0a1b2c3d"]


def test_a_live_pid_is_alive_and_a_reaped_one_is_not():
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert gc.pid_alive(os.getpid())
    assert not gc.pid_alive(int(child.stdout))


def test_buildah_running_reads_proc(tmp_path):
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "comm").write_text("python3\n")
    assert not gc.buildah_running(tmp_path)
    (tmp_path / "34").mkdir()
    (tmp_path / "34" / "comm").write_text("buildah\n")
    assert gc.buildah_running(tmp_path)


def test_env_builds_remove_their_stage_containers_even_when_they_fail():
    """buildah keeps a failed build's stage containers unless told otherwise (a full disk left three, each
    pinning its layers); every env build asks for their removal, with and without the layer cache."""
    from flashkit.images import build

    plan = next(p for p in PLANS if p.env_id == "cu130-torch211")
    for opts in (build.BuildOptions(), build.BuildOptions(no_cache=True, check=True)):
        args = build._build_args(plan, {}, opts)
        assert "--force-rm" in args and "--layers" in args
