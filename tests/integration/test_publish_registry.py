"""`flashkit publish` against a real registry (Debian's docker-registry on loopback) and the real engine.

Test images are tiny (one file, imported from a tarball); their verification
records are written with record.py's own functions. Every refusal and every
interrupted push must leave no tag in the registry, asserted through the
registry's HTTP API (/v2/_catalog and /v2/<name>/tags/list).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import docker.errors
import pytest

from flashkit.ledger import publish
from flashkit.ledger import record
from flashkit.ledger.publish import Policy, PublishRefused, PushFailed, RegistryAPI, Target, parse_policy
from flashkit.ledger.record import TierResult
from flashkit.images.local_registry import LocalRegistry

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(shutil.which("docker-registry") is None, reason="apt-get install docker-registry"),
]

H = "fk1-" + "ab" * 32
ALL_PASSED = {"build": "passed", "abi": "passed", "cpu": "passed", "gpu": "passed"}


@pytest.fixture
def registry(tmp_path):
    with LocalRegistry(storage=tmp_path / "registry") as reg:
        yield reg


@pytest.fixture
def make_image(engine):
    """Factory: a real one-layer image with its own content; removed with everything derived from it."""
    sdk = engine.sdk()
    made: list[str] = []

    def make(size: int = 64) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            data = uuid.uuid4().bytes + (os.urandom(size) if size > 64 else b"")
            info = tarfile.TarInfo("payload")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        ref = f"flashkit-publish-test/{uuid.uuid4().hex[:12]}"
        sdk.api.import_image_from_data(buf.getvalue(), repository=ref, tag="t", changes=["LABEL purpose=test"])
        made.append(f"{ref}:t")
        return f"{ref}:t"

    yield make
    for ref in made:
        with contextlib.suppress(docker.errors.ImageNotFound):
            img = sdk.images.get(ref)
            for derived in sdk.images.list(all=True, filters={"label": f"io.flashkit.judged-image={img.id}"}):
                with contextlib.suppress(docker.errors.ImageNotFound):
                    sdk.images.remove(derived.id, force=True)
            sdk.images.remove(img.id, force=True)
    sdk.close()


def image_id(engine, ref: str) -> str:
    sdk = engine.sdk()
    try:
        return sdk.images.get(ref).id
    finally:
        sdk.close()


def write_record(path: Path, input_hash: str, judged_id: str, verdicts: dict[str, str]) -> None:
    tiers = [
        TierResult(
            tier=t,
            verdict=v,
            counts={"passed": 3} if v == "passed" else {"failed": 1},
            reasons=() if v == "passed" else (f"{t} {v} in this test",),
            duration_s=0.1,
            judged={"image_id": judged_id},
        )
        for t, v in verdicts.items()
    ]
    record.upsert_entry(path, input_hash, {"image_id": judged_id, "wheel_sha256": "0" * 64}, tiers)


def catalog(reg: LocalRegistry) -> list[str]:
    with urllib.request.urlopen(f"http://{reg.address}/v2/_catalog") as r:
        return json.loads(r.read())["repositories"] or []


def all_tags(reg: LocalRegistry, target: Target) -> dict[str, list[str]]:
    api = RegistryAPI(target)
    return {repo: api.tags(repo) for repo in (target.repository, target.staging)}


def do_publish(engine, ref, record_file, target, policy: Policy | None = None, input_hash: str = H):
    return publish.publish_image(
        engine,
        env_id="tiny",
        input_hash=input_hash,
        immutable_tag=input_hash[:20],
        image_ref=ref,
        record_file=record_file,
        policy=policy or parse_policy(None),
        target=target,
        tags=["torch2.11-cu13.0-py3.11"],
        say=lambda s: None,
    )


def test_verified_image_is_pushed_and_pulled_back_identical(engine, registry, make_image, tmp_path):
    ref = make_image()
    judged = image_id(engine, ref)
    rec = tmp_path / "verified" / "tiny.json"
    write_record(rec, H, judged, ALL_PASSED)
    target = Target(registry.address, "org/flash")

    pub = do_publish(engine, ref, rec, target)

    assert all_tags(registry, target) == {
        "org/flash": sorted([H[:20], "torch2.11-cu13.0-py3.11"]),
        "org/flash-staging": [],
    }
    api = RegistryAPI(target)
    for tag in pub.tags:
        assert api.manifest("org/flash", tag)[2] == pub.digest
    # The published image is the judged image's layers plus labels, and the pull-back gave that very image.
    sdk = engine.sdk()
    try:
        src = sdk.images.get(judged).attrs
        got = sdk.images.get(f"{target}@{pub.digest}").attrs
    finally:
        sdk.close()
    assert got["Id"] == pub.published_image_id != judged
    assert got["RootFS"]["Layers"] == src["RootFS"]["Layers"]
    labels = got["Config"]["Labels"]
    assert labels["io.flashkit.judged-image"] == judged
    assert labels["io.flashkit.verified-tiers"] == "build,abi,cpu,gpu"
    assert labels["io.flashkit.policy"] == "full:build,abi,cpu,gpu|artifact-gpu"
    entry = record.load(rec)["entries"][H]
    assert entry["artifact"]["image_id"] == judged
    assert entry["artifact"]["published"][str(target)]["digest"] == pub.digest
    assert entry["tiers"]["gpu"]["verdict"] == "passed"  # recording the digest kept the verdicts

    # Publishing again reuses the immutable tag instead of minting a second image for the same inputs.
    again = do_publish(engine, ref, rec, target)
    assert again.reused and again.digest == pub.digest


@pytest.mark.parametrize(
    "case",
    ["unverified", "failed-tier", "tier-not-run", "tier-missing", "record-for-another-image", "weaker-not-asked"],
)
def test_refusals_leave_no_tag(engine, registry, make_image, tmp_path, case):
    ref = make_image()
    judged = image_id(engine, ref)
    rec = tmp_path / "verified" / "tiny.json"
    if case == "failed-tier":
        write_record(rec, H, judged, ALL_PASSED | {"cpu": "failed"})
    elif case == "tier-not-run":
        write_record(rec, H, judged, ALL_PASSED | {"gpu": "not-run"})
    elif case == "tier-missing":
        write_record(rec, H, judged, {"build": "passed", "abi": "passed", "cpu": "passed"})
    elif case == "record-for-another-image":
        other = image_id(engine, make_image())
        write_record(rec, H, other, ALL_PASSED)
    elif case == "weaker-not-asked":
        # gpu not run: the default policy refuses even though every tier that ran passed.
        write_record(rec, H, judged, {"build": "passed", "abi": "passed", "cpu": "passed", "gpu": "not-run"})
    target = Target(registry.address, "org/flash")

    with pytest.raises(PublishRefused) as exc:
        do_publish(engine, ref, rec, target)

    assert exc.value.exit_code == 17
    msg = str(exc.value)
    assert str(rec) in msg and "what to do:" in msg
    expected = {
        "unverified": f"no entry for input hash {H}",
        "failed-tier": "tier cpu is failed",
        "tier-not-run": "tier gpu is not-run",
        "tier-missing": "tier gpu has no result",
        "record-for-another-image": f"not {judged}",
        "weaker-not-asked": "--policy no-gpu",
    }[case]
    assert expected in msg
    assert catalog(registry) == []
    assert all_tags(registry, target) == {"org/flash": [], "org/flash-staging": []}


def test_weaker_policy_must_be_asked_and_is_labelled(engine, registry, make_image, tmp_path):
    ref = make_image()
    judged = image_id(engine, ref)
    rec = tmp_path / "verified" / "tiny.json"
    write_record(rec, H, judged, {"build": "passed", "abi": "passed", "cpu": "passed", "gpu": "not-run"})
    target = Target(registry.address, "org/flash")

    pub = do_publish(engine, ref, rec, target, policy=parse_policy("no-gpu"))

    sdk = engine.sdk()
    try:
        labels = sdk.images.get(f"{target}@{pub.digest}").attrs["Config"]["Labels"]
    finally:
        sdk.close()
    assert labels["io.flashkit.policy"] == "no-gpu:build,abi,cpu"
    assert labels["io.flashkit.verified-tiers"] == "build,abi,cpu"
    # The same input hash published under a different policy must not reuse the immutable tag silently.
    write_record(rec, H, judged, {"gpu": "passed"})
    with pytest.raises(PushFailed, match="immutable tag"):
        do_publish(engine, ref, rec, target)
    assert all_tags(registry, target)["org/flash"] == sorted([H[:20], "torch2.11-cu13.0-py3.11"])


CLI_ENV = "cu130-torch211"


def built_and_verified(kit_repo: Path, engine, ref: str) -> str:
    """A build result naming the tiny image as CLI_ENV's runtime image, and a passing record; returns the input hash."""
    from flashkit.images.build import BuildResult, result_path
    from flashkit.plan.inputhash import input_hash
    from flashkit.ledger.record import write_json_atomic
    from flashkit.plan.spec import load_env

    judged = image_id(engine, ref)
    h = input_hash(kit_repo, load_env(kit_repo, CLI_ENV))
    res = BuildResult(
        env=CLI_ENV, input_hash=h, runtime_ref=ref, runtime_id=judged, builder_ref=ref, builder_id=judged,
        runtime_size=1, builder_size=1, wheel_path="unused.whl", wheel_sha256="0" * 64, lock_sha256="0" * 64,
        base_image_id=None, built=True, seconds=0.0, log_path="unused.log", context={}, date=record.utc_now(),
    )  # fmt: skip
    write_json_atomic(result_path(kit_repo, CLI_ENV, h), res.to_json())
    write_record(record.record_path(CLI_ENV, kit_repo), h, judged, ALL_PASSED)
    return h


def test_cli_publishes_to_the_registry_named_by_the_environment(
    engine, registry, make_image, kit_repo, cli, monkeypatch
):
    from flashkit.plan.inputhash import tag_suffix

    h = built_and_verified(kit_repo, engine, make_image())
    monkeypatch.setenv("FLASHKIT_REGISTRY", f"{registry.address}/org/flash")
    r = cli("--repo", str(kit_repo), "publish", CLI_ENV)
    assert r.code == 0, r.err
    target = Target(registry.address, "org/flash")
    assert RegistryAPI(target).tags("org/flash") == sorted([tag_suffix(h), "torch2.11-cu13.0-py3.11"])
    published = record.load(record.record_path(CLI_ENV, kit_repo))["entries"][h]["artifact"]["published"]
    digest = published[str(target)]["digest"]
    assert f"published {target}@{digest}" in r.out


def test_changed_lockfile_after_testing_refuses_through_the_cli(engine, registry, make_image, kit_repo, cli):
    h = built_and_verified(kit_repo, engine, make_image())
    dest = f"{registry.address}/org/flash"
    ok = cli("--repo", str(kit_repo), "publish", CLI_ENV, "--registry", dest, "--dry-run")
    assert ok.code == 0, ok.err  # the set-up passes the gate: the refusal below is the lockfile's doing
    assert catalog(registry) == []  # a dry run pushes nothing

    lock = kit_repo / "lockfiles" / f"{CLI_ENV}.txt"
    lock.write_text(lock.read_text() + "# edited after testing\n")
    r = cli("--repo", str(kit_repo), "publish", CLI_ENV, "--registry", dest)

    assert r.code == 17, r.err
    assert "no build for its current input hash" in r.err and h in r.err and f"flashkit test {CLI_ENV}" in r.err
    assert catalog(registry) == []


def test_interrupted_push_leaves_no_tag(engine, make_image, tmp_path):
    """The registry dies while a layer is uploading; after it comes back, no repository has a tag."""
    ref = make_image(size=48 * 1024 * 1024)  # random, so gzip cannot make the upload instant
    judged = image_id(engine, ref)
    rec = tmp_path / "verified" / "tiny.json"
    write_record(rec, H, judged, ALL_PASSED)
    storage = tmp_path / "registry"
    reg = LocalRegistry(storage=storage).start()
    target = Target(reg.address, "org/flash")
    uploads = storage / "data" / "docker" / "registry" / "v2" / "repositories" / "org" / "flash-staging" / "_uploads"
    killed = threading.Event()

    def kill_when_uploading():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed.is_set():
            if uploads.is_dir() and any(uploads.iterdir()):
                reg._proc.kill()  # a crash, not a clean shutdown
                killed.set()
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=kill_when_uploading, daemon=True)
    watcher.start()
    try:
        with pytest.raises(PushFailed) as exc:
            do_publish(engine, ref, rec, target)
        watcher.join(5)
        assert killed.is_set(), "the push finished before the registry could be killed"
        assert exc.value.exit_code == 18
        reg.stop()
        with LocalRegistry(port=reg.port, storage=storage) as back:
            assert all_tags(back, target) == {"org/flash": [], "org/flash-staging": []}
        assert "published" not in record.load(rec)["entries"][H]["artifact"]
    finally:
        killed.set()
        reg.stop()


def test_killed_publish_leaves_no_tag_in_the_target(engine, registry, make_image, kit_repo):
    """`flashkit publish` is SIGKILLed while a layer uploads: the target repository never gets a tag.

    The engine may finish the staging push on its own after its client died; a staging tag
    (``push-*`` in ``<repository>-staging``) can then remain, which is why staging is a
    separate repository: the target's tags are written only after the pull-back check.
    """
    import signal
    import subprocess
    import sys

    built_and_verified(kit_repo, engine, make_image(size=48 * 1024 * 1024))
    target = Target(registry.address, "org/flash")
    uploads = registry.storage / "data/docker/registry/v2/repositories/org/flash-staging/_uploads"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from flashkit.cli.main import main; sys.exit(main())",
         "--repo", str(kit_repo), "publish", CLI_ENV, "--registry", str(target)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if uploads.is_dir() and any(uploads.iterdir()):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        assert proc.wait(30) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
        # Give the engine time to finish or abandon the push it was given.
        time.sleep(10)
        tags = all_tags(registry, target)
        assert tags["org/flash"] == []
        assert all(t.startswith("push-") for t in tags["org/flash-staging"])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
