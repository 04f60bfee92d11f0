"""`flashkit publish` against a real registry (Debian's docker-registry on loopback) and the real engine.

Test images are tiny (one file, imported from a tarball); their ledgers are written with the
ledger's own functions. Every refusal and every
interrupted push must leave no tag in the registry, asserted through the
registry's HTTP API (/v2/_catalog and /v2/<name>/tags/list).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import docker.errors
import pytest
from kitsupport import artifact, input_hash, verdict

from flashkit.core.errors import PublishRefused, PushFailed
from flashkit.images.local_registry import LocalRegistry
from flashkit.ledger import publish, store
from flashkit.ledger.gate import Policy, parse_policy
from flashkit.ledger.publish import PublishRequest
from flashkit.ledger.registry_api import RegistryAPI, Target

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(shutil.which("docker-registry") is None, reason="apt-get install docker-registry"),
]

H = "fk1-" + "ab" * 32
ENV = "cu130-torch211"
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


def write_ledger(root: Path, input_hash: str, judged_id: str, verdicts: dict[str, str]) -> None:
    art = artifact(ENV, input_hash, image=judged_id)
    store.append(root, ENV, [art, *(verdict(art, t, v) for t, v in verdicts.items())])


def catalog(reg: LocalRegistry) -> list[str]:
    with urllib.request.urlopen(f"http://{reg.address}/v2/_catalog") as r:
        return json.loads(r.read())["repositories"] or []


def all_tags(reg: LocalRegistry, target: Target) -> dict[str, list[str]]:
    api = RegistryAPI(target)
    return {repo: api.tags(repo) for repo in (target.repository, target.staging)}


def request(ref: str, root: Path, target: Target, policy: Policy | None = None, input_hash: str = H) -> PublishRequest:
    return PublishRequest(
        root=root,
        env_id=ENV,
        input_hash=input_hash,
        immutable_tag=input_hash[:20],
        image_ref=ref,
        policy=policy or parse_policy(None),
        target=target,
        tags=("torch2.11-cu13.0-py3.11",),
    )


def do_publish(engine, ref, root, target, policy: Policy | None = None, input_hash: str = H):
    return publish.publish_image(engine, request(ref, root, target, policy, input_hash))


def publications(root: Path, input_hash: str = H):
    return store.load(root, ENV).publications(input_hash)


def test_verified_image_is_pushed_and_pulled_back_identical(engine, registry, make_image, tmp_path):
    ref = make_image()
    judged = image_id(engine, ref)
    rec = tmp_path
    write_ledger(rec, H, judged, ALL_PASSED)
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
    (recorded,) = publications(rec)
    assert recorded.judged_image_id == judged and recorded.digest == pub.digest and recorded.target == str(target)
    assert len(recorded.verdict_ids) == 4  # the verdicts the gate relied on, by id
    assert store.load(rec, ENV).verdicts(H)[-1].tier == "gpu"  # recording the publication kept the verdicts

    # Publishing again reuses the immutable tag instead of minting a second image for the same inputs.
    again = do_publish(engine, ref, rec, target)
    assert again.reused and again.digest == pub.digest
    assert [p.reused for p in publications(rec)] == [False, True]  # publications are a history


@pytest.mark.parametrize(
    "case",
    ["unverified", "failed-tier", "tier-not-run", "tier-missing", "record-for-another-image", "weaker-not-asked"],
)
def test_refusals_leave_no_tag(engine, registry, make_image, tmp_path, case):
    ref = make_image()
    judged = image_id(engine, ref)
    rec = tmp_path
    if case == "failed-tier":
        write_ledger(rec, H, judged, ALL_PASSED | {"cpu": "failed"})
    elif case == "tier-not-run":
        write_ledger(rec, H, judged, ALL_PASSED | {"gpu": "not-run"})
    elif case == "tier-missing":
        write_ledger(rec, H, judged, {"build": "passed", "abi": "passed", "cpu": "passed"})
    elif case == "record-for-another-image":
        other = image_id(engine, make_image())
        write_ledger(rec, H, other, ALL_PASSED)
    elif case == "weaker-not-asked":
        # gpu not run: the default policy refuses even though every tier that ran passed.
        write_ledger(rec, H, judged, {"build": "passed", "abi": "passed", "cpu": "passed", "gpu": "not-run"})
    target = Target(registry.address, "org/flash")

    with pytest.raises(PublishRefused) as exc:
        do_publish(engine, ref, rec, target)

    assert exc.value.exit_code == 17
    msg = str(exc.value)
    assert (case == "unverified" or f"verified/{ENV}.jsonl" in msg) and "what to do:" in msg
    expected = {
        "unverified": f"no build in its ledger at its current input hash {H}",
        "failed-tier": "cpu: failed",
        "tier-not-run": "gpu: not-run",
        "tier-missing": "gpu: not verified",
        "record-for-another-image": f"no build in the ledger produced image {judged}",
        "weaker-not-asked": "--policy no-gpu",
    }[case]
    assert expected in msg
    assert catalog(registry) == []
    assert all_tags(registry, target) == {"org/flash": [], "org/flash-staging": []}


def test_weaker_policy_must_be_asked_and_is_labelled(engine, registry, make_image, tmp_path):
    ref = make_image()
    judged = image_id(engine, ref)
    rec = tmp_path
    write_ledger(rec, H, judged, {"build": "passed", "abi": "passed", "cpu": "passed", "gpu": "not-run"})
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
    store.append(
        rec, ENV, [verdict(store.load(rec, ENV).artifacts(H)[0], "gpu", "passed", date="2026-11-30T12:00:00+00:00")]
    )
    with pytest.raises(PushFailed, match="immutable tag"):
        do_publish(engine, ref, rec, target)
    assert all_tags(registry, target)["org/flash"] == sorted([H[:20], "torch2.11-cu13.0-py3.11"])


CLI_ENV = "cu130-torch211"


def built_and_verified(kit_repo: Path, engine, ref: str) -> str:
    """The tiny image tagged as CLI_ENV's image of the current input hash, with a passing ledger."""
    from flashkit.images.build import image_ref
    from flashkit.plan.inputhash import tag_suffix

    judged = image_id(engine, ref)
    h = input_hash(kit_repo, CLI_ENV)
    sdk = engine.sdk()
    try:
        repo, tag = image_ref(CLI_ENV, tag_suffix(h)).rsplit(":", 1)
        sdk.images.get(judged).tag(repo, tag)
    finally:
        sdk.close()
    write_ledger(kit_repo, h, judged, ALL_PASSED)
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
    (published,) = publications(kit_repo, h)
    digest = published.digest
    assert f"published {target}@{digest}" in r.out


def test_changed_lockfile_after_testing_refuses_through_the_cli(engine, registry, make_image, kit_repo, cli):
    h = built_and_verified(kit_repo, engine, make_image())
    dest = f"{registry.address}/org/flash"
    ok = cli("--repo", str(kit_repo), "publish", CLI_ENV, "--registry", dest, "--dry-run")
    assert ok.code == 0, ok.err  # the set-up passes the gate: the refusal below is the lockfile's doing
    assert catalog(registry) == []  # a dry run pushes nothing

    lock = kit_repo / "lockfiles" / CLI_ENV / "py3.11.txt"
    lock.write_text(lock.read_text() + "# edited after testing\n")
    r = cli("--repo", str(kit_repo), "publish", CLI_ENV, "--registry", dest)

    assert r.code == 17, r.err
    assert "no build in its ledger at its current input hash" in r.err and h[:20] in r.err
    assert f"flashkit test {CLI_ENV}" in r.err
    assert catalog(registry) == []


def test_interrupted_push_leaves_no_tag(engine, make_image, tmp_path):
    """The registry dies while a layer is uploading; after it comes back, no repository has a tag."""
    ref = make_image(size=48 * 1024 * 1024)  # random, so gzip cannot make the upload instant
    judged = image_id(engine, ref)
    rec = tmp_path
    write_ledger(rec, H, judged, ALL_PASSED)
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
        assert publications(rec) == []
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


_PUBLISH = """
import sys
from pathlib import Path
from flashkit.core.errors import FlashkitError
from flashkit.images.engine import ensure_engine
from flashkit.ledger import publish
from flashkit.ledger.gate import parse_policy
from flashkit.ledger.publish import PublishRequest
from flashkit.ledger.registry_api import Target
root, ref, host, h = sys.argv[1:5]
req = PublishRequest(Path(root), "cu130-torch211", h, h[:20], ref, parse_policy(None), Target(host, "org/flash"),
                     ("torch2.11-cu13.0-py3.11",))
try:
    print(publish.publish_image(ensure_engine(start=False), req).digest)
except FlashkitError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def publish_in_parallel(root: Path, refs: list[str], registry) -> list[subprocess.CompletedProcess]:
    """Start one real publish process per ref at the same moment; wait for all."""
    argv = [[sys.executable, "-c", _PUBLISH, str(root), ref, registry.address, H] for ref in refs]
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in argv]
    return [subprocess.CompletedProcess(p.args, p.wait(600), *p.communicate()) for p in procs]


def test_two_publishes_at_once_never_move_the_immutable_tag(engine, registry, make_image, tmp_path, monkeypatch):
    """Two different images verified under one input hash (two hosts' builds) race for the same tag."""
    monkeypatch.setenv("FLASHKIT_LOCK_DIR", str(tmp_path / "locks"))
    refs = [make_image(size=8 * 1024 * 1024), make_image(size=8 * 1024 * 1024)]
    for ref in refs:
        write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    results = publish_in_parallel(tmp_path, refs, registry)
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 18], [r.stderr[-800:] for r in results]
    winner = next(r for r in results if r.returncode == 0).stdout.strip()
    loser = next(r for r in results if r.returncode == 18)
    assert "immutable tag" in loser.stderr
    target = Target(registry.address, "org/flash")
    api = RegistryAPI(target)
    assert api.manifest("org/flash", H[:20])[2] == winner
    (recorded,) = publications(tmp_path)
    assert recorded.digest == winner


def test_the_same_image_published_twice_at_once_is_one_image_and_two_records(
    engine, registry, make_image, tmp_path, monkeypatch
):
    monkeypatch.setenv("FLASHKIT_LOCK_DIR", str(tmp_path / "locks"))
    ref = make_image(size=8 * 1024 * 1024)
    write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    results = publish_in_parallel(tmp_path, [ref, ref], registry)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-800:] for r in results]
    assert len({r.stdout.strip() for r in results}) == 1
    recorded = publications(tmp_path)
    assert sorted(p.reused for p in recorded) == [False, True] and len({p.digest for p in recorded}) == 1
