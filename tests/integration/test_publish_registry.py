"""`flashkit publish` and `flashkit verify-image` against a registry as users have them: Debian's
docker-registry over TLS (a CA made for the test) with an htpasswd login, spoken to through skopeo,
and the real engine holding the images.

Test images are tiny (one file, imported from a tarball); their ledgers are written with the ledger's
own functions. Every refusal and every interrupted push must leave no tag in the registry, asserted by
listing the repository's tags with the right login.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import docker.errors
import pytest
from kitsupport import artifact, input_hash, verdict
from regsupport import PASSWORD, USER, start_secure_registry

from flashkit.core.errors import PushFailed, RegistryAuthFailed
from flashkit.ledger import store
from flashkit.ledger.gate import Policy, parse_policy
from flashkit.publish import attest
from flashkit.publish import push as publish
from flashkit.publish.local_registry import LocalRegistry
from flashkit.publish.push import PublishRequest
from flashkit.publish.registry import Registry, Target, access, engine_to_layout, layout_manifest

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("docker-registry", "skopeo")), reason="apt-get install docker-registry skopeo"
    ),
]

H = "fk2-" + "ab" * 32
ENV = "cu130-torch211"
ALL_PASSED = {"build": "passed", "abi": "passed", "cpu": "passed", "gpu": "passed"}
NO_GPU = {"build": "passed", "abi": "passed", "cpu": "passed"}
TAGS = ("torch2.11-cu13.0", "torch2.11-cu13.0-py3.11")


@pytest.fixture
def secure(tmp_path, monkeypatch):
    """The TLS + htpasswd registry, and the environment a publisher with the right login has."""
    reg = start_secure_registry(tmp_path / "secure")
    monkeypatch.setenv("FLASHKIT_REGISTRY_CA", str(reg.ca))
    monkeypatch.setenv("FLASHKIT_REGISTRY_USER", USER)
    monkeypatch.setenv("FLASHKIT_REGISTRY_PASSWORD", PASSWORD)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    (tmp_path / "docker-config").mkdir()
    (tmp_path / "docker-config" / "config.json").write_text("{}")  # a docker config with no login in it
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv("FLASHKIT_LOCK_DIR", str(tmp_path / "locks"))
    yield reg
    reg.registry.stop()


@pytest.fixture
def keys(tmp_path):
    """A throwaway ed25519 pair for this test (never the project's key)."""
    return attest.generate_keys(tmp_path / "keys", repo_root=None)


@pytest.fixture(scope="session")
def buildah_storage(tmp_path_factory):
    """A buildah storage of the tests' own (removed afterwards): test images are built like real ones."""
    from flashkit.images.buildah import find_buildah

    root = tmp_path_factory.mktemp("buildah")
    yield find_buildah(str(root))
    subprocess.run(["buildah", "--root", f"{root}/storage", "--runroot", f"{root}/run", "rmi", "--all", "--force"],
                   capture_output=True)  # fmt: skip


@pytest.fixture
def make_image(engine, buildah_storage, tmp_path):
    """Factory: a real one-layer OCI image with its own content, built by buildah and copied into the engine
    as flashkit's builds are; removed from the engine afterwards."""
    from flashkit.images import buildah

    sdk = engine.sdk()
    made: list[str] = []

    def make(size: int = 64) -> str:
        ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:8]}"
        ctx.mkdir()
        (ctx / "payload").write_bytes(uuid.uuid4().bytes + (os.urandom(size) if size > 64 else b""))
        (ctx / "Containerfile").write_text("FROM scratch\nCOPY payload /payload\nLABEL purpose=test\n")
        iid = ctx / "iid"
        bh = buildah_storage
        bh.run(
            "build",
            "--timestamp",
            "0",
            "--format",
            "oci",
            "--iidfile",
            str(iid),
            "-f",
            str(ctx / "Containerfile"),
            str(ctx),
        )
        ref = f"flashkit-publish-test/{uuid.uuid4().hex[:12]}:t"
        buildah.push_to_engine(bh, iid.read_text().strip(), ref, engine)
        made.append(ref)
        return ref

    yield make
    for ref in made:
        with contextlib.suppress(docker.errors.ImageNotFound):
            sdk.images.remove(sdk.images.get(ref).id, force=True)
    sdk.close()


def image_id(engine, ref: str) -> str:
    sdk = engine.sdk()
    try:
        return sdk.images.get(ref).id
    finally:
        sdk.close()


def write_ledger(root: Path, h: str, judged_id: str, verdicts: dict[str, str]) -> None:
    art = artifact(ENV, h, image=judged_id)
    store.append(root, ENV, [art, *(verdict(art, t, v) for t, v in verdicts.items())])


def request(ref, root, target, key, policy: Policy | None = None, h: str = H) -> PublishRequest:
    return PublishRequest(
        root=root,
        env_id=ENV,
        input_hash=h,
        immutable_tag=h[:20],
        image_ref=ref,
        policy=policy or parse_policy(None),
        target=target,
        tags=TAGS,
        signing_key=key,
        inputs={"scheme": 2, "test": True},
    )


def do_publish(engine, ref, root, target, key, policy=None, h=H):
    return publish.publish_image(engine, request(ref, root, target, key, policy, h))


def tags(target: Target) -> list[str]:
    with access(target) as acc:
        return Registry(target, acc).tags()


def publications(root: Path, h: str = H):
    return store.load(root, ENV).publications(h)


def all_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and p.suffix != ".lock")


def test_publish_with_the_right_login_attests_tags_and_pulls_back_by_digest(
    engine, secure, make_image, keys, tmp_path, cli
):
    ref = make_image()
    judged = image_id(engine, ref)
    write_ledger(tmp_path, H, judged, ALL_PASSED)
    target = Target(secure.address, "org/flash")

    pub = do_publish(engine, ref, tmp_path, target, keys[0])

    assert pub.judged_image_id == pub.published_image_id == judged
    assert tags(target) == sorted([H[:20], *TAGS, attest.att_tag(pub.digest)])
    assert pub.attestation["tag"] == attest.att_tag(pub.digest)
    with access(target) as acc, contextlib.ExitStack() as stack:
        reg = Registry(target, acc)
        for t in (H[:20], *TAGS):
            assert reg.manifest(t)[1] == pub.digest
        # pull back by digest, into the engine: the same image id the ledger judged
        pulled = f"flashkit-publish-test/pulled-{uuid.uuid4().hex[:8]}:t"
        stack.callback(lambda: subprocess.run(["docker", "image", "rm", "-f", pulled], capture_output=True))
        subprocess.run(
            ["skopeo", "copy", "--quiet", *acc.flags("src"), target.ref(pub.digest), f"docker-daemon:{pulled}"],
            check=True,
        )
        assert image_id(engine, pulled) == judged

    r = cli("verify-image", f"{target}:{TAGS[0]}", "--key", str(keys[1]))
    assert r.code == 0, r.err
    assert pub.digest in r.out and judged in r.out and "gpu: passed" in r.out
    # the login is nowhere: not in the ledger, the output, the attestation, the image
    assert PASSWORD not in all_text(tmp_path / "verified") and USER not in all_text(tmp_path / "verified")
    assert PASSWORD not in r.out + r.err
    with access(target) as acc:
        reg = Registry(target, acc)
        layout = tmp_path / "att"
        reg.fetch(pub.attestation["tag"], layout, "att")
        config, _ = reg.config(pub.digest)
    assert PASSWORD not in all_text(layout) and PASSWORD not in config.decode()


@pytest.mark.parametrize("login", ["wrong", "missing"])
def test_wrong_or_missing_login_refuses_and_leaves_nothing(
    engine, secure, make_image, keys, tmp_path, monkeypatch, login
):
    ref = make_image()
    write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    target = Target(secure.address, "org/flash")
    with monkeypatch.context() as m:
        if login == "wrong":
            m.setenv("FLASHKIT_REGISTRY_PASSWORD", "not-the-password")
        else:
            m.delenv("FLASHKIT_REGISTRY_USER")
            m.delenv("FLASHKIT_REGISTRY_PASSWORD")
        with pytest.raises(RegistryAuthFailed) as exc:
            do_publish(engine, ref, tmp_path, target, keys[0])
    assert exc.value.exit_code == 32
    assert "not-the-password" not in str(exc.value) and PASSWORD not in str(exc.value)
    assert tags(target) == []
    assert publications(tmp_path) == []


def test_a_gate_refusal_touches_no_registry(engine, secure, make_image, keys, tmp_path, cli, kit_repo):
    ref = make_image()
    write_ledger(tmp_path, H, image_id(engine, ref), NO_GPU)
    target = Target(secure.address, "org/flash")
    with pytest.raises(publish.PublishRefused) as exc:
        do_publish(engine, ref, tmp_path, target, keys[0])
    assert exc.value.exit_code == 17 and "gpu" in str(exc.value)
    assert tags(target) == [] and publications(tmp_path) == []


def test_publish_without_a_signing_key_is_refused_before_any_push(engine, secure, make_image, tmp_path):
    ref = make_image()
    write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    target = Target(secure.address, "org/flash")
    open_key = tmp_path / "open.key"
    attest.generate_keys(tmp_path / "k2", None)
    shutil.copyfile(tmp_path / "k2" / "flashkit.key", open_key)
    os.chmod(open_key, 0o644)
    for key, code in ((None, 2), (tmp_path / "absent.key", 27), (open_key, 27), (tmp_path / "k2" / "flashkit.pub", 27)):
        with pytest.raises(Exception) as exc:
            do_publish(engine, ref, tmp_path, target, key)
        assert getattr(exc.value, "exit_code", None) == code, (key, exc.value)
    assert tags(target) == []


# -- verify-image: what a user runs before `docker run` ---------------------------------------------------
@pytest.fixture
def published(engine, secure, make_image, keys, tmp_path):
    """One image published with the full policy, and one pushed by digest with no attestation."""
    ref, other = make_image(), make_image()
    write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    target = Target(secure.address, "org/flash")
    pub = do_publish(engine, ref, tmp_path, target, keys[0])
    with access(target) as acc:
        reg = Registry(target, acc)
        engine_to_layout(image_id(engine, other), tmp_path / "other")
        _b, other_digest = layout_manifest(tmp_path / "other")
        reg.push(tmp_path / "other", "image", other_digest)
    return target, pub, other_digest


def verify(cli, ref: str, key: Path, *extra: str):
    return cli("verify-image", ref, "--key", str(key), *extra)


def test_verify_image_passes_by_tag_and_by_digest(published, keys, cli):
    target, pub, _other = published
    for ref in (f"{target}:{H[:20]}", f"{target}@{pub.digest}"):
        r = verify(cli, ref, keys[1])
        assert r.code == 0, r.err


def test_verify_image_refuses_a_tampered_attestation(published, keys, cli, tmp_path):
    target, pub, _other = published
    with access(target) as acc:
        reg = Registry(target, acc)
        layout = tmp_path / "tamper"
        reg.fetch(pub.attestation["tag"], layout, "att")
        body, _d = layout_manifest(layout, "att")
        manifest = json.loads(body)
        envelopes = []
        for layer in manifest["layers"]:
            env = json.loads((layout / "blobs/sha256" / layer["digest"][7:]).read_bytes())
            stmt = attest.envelope_payload(json.dumps(env).encode())
            if stmt["predicateType"] == attest.VERIFICATION_TYPE:
                stmt["predicate"]["tiers"][0]["counts"]["failed"] = 0
                stmt["predicate"]["policy"]["name"] = "tampered"
                import base64

                env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
            envelopes.append((layer["annotations"][attest.PREDICATE_ANNOTATION], json.dumps(env).encode()))
        forged = tmp_path / "forged"
        attest.write_layout(forged, pub.digest, manifest["subject"]["size"], envelopes)
        reg.push(forged, "att", pub.attestation["tag"])
    r = verify(cli, f"{target}:{H[:20]}", keys[1])
    assert r.code == 29, r.out + r.err
    assert "signature does not verify" in r.err


def test_verify_image_refuses_the_wrong_key(published, cli, tmp_path):
    target, _pub, _other = published
    _priv, other_pub = attest.generate_keys(tmp_path / "other-keys", None)
    r = verify(cli, f"{target}:{H[:20]}", other_pub)
    assert r.code == 29, r.out + r.err


def test_verify_image_refuses_a_tag_moved_to_another_image(published, keys, cli):
    target, _pub, other = published
    with access(target) as acc:
        Registry(target, acc).tag(other, TAGS[0])  # someone re-points the card tag
    r = verify(cli, f"{target}:{TAGS[0]}", keys[1])
    assert r.code == 28, r.out + r.err
    assert other in r.err


def test_verify_image_refuses_an_attestation_of_another_digest(published, keys, cli):
    target, pub, other = published
    with access(target) as acc:
        Registry(target, acc).tag(pub.attestation["digest"], attest.att_tag(other))  # copy A's attestation to B
    r = verify(cli, f"{target}@{other}", keys[1])
    assert r.code == 29, r.out + r.err
    assert "another image" in r.err


def test_verify_image_refuses_a_missing_attestation(published, keys, cli):
    target, _pub, other = published
    r = verify(cli, f"{target}@{other}", keys[1])
    assert r.code == 28, r.out + r.err


def test_verify_image_refuses_a_weaker_policy_than_asked(engine, secure, make_image, keys, tmp_path, cli):
    ref = make_image()
    write_ledger(tmp_path, H, image_id(engine, ref), NO_GPU)
    target = Target(secure.address, "org/flash")
    do_publish(engine, ref, tmp_path, target, keys[0], policy=parse_policy("no-gpu"))
    r = verify(cli, f"{target}:{H[:20]}", keys[1])
    assert r.code == 31, r.out + r.err
    assert "gpu or artifact-gpu did not pass" in r.err
    assert verify(cli, f"{target}:{H[:20]}", keys[1], "--policy", "no-gpu").code == 0


# -- no tag on failure, and the immutable tag ---------------------------------------------------------------
def test_interrupted_push_leaves_no_tag(engine, make_image, keys, tmp_path, monkeypatch):
    """The registry dies while a layer is uploading; after it comes back, the repository has no tag."""
    reg = start_secure_registry(tmp_path / "dies")
    monkeypatch.setenv("FLASHKIT_REGISTRY_CA", str(reg.ca))
    monkeypatch.setenv("FLASHKIT_REGISTRY_USER", USER)
    monkeypatch.setenv("FLASHKIT_REGISTRY_PASSWORD", PASSWORD)
    ref = make_image(size=48 * 1024 * 1024)  # random, so gzip cannot make the upload instant
    write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    target = Target(reg.address, "org/flash")
    uploads = reg.registry.storage / "data/docker/registry/v2/repositories/org/flash/_uploads"
    killed = threading.Event()

    def kill_when_uploading():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed.is_set():
            if uploads.is_dir() and any(uploads.iterdir()):
                reg.registry._proc.kill()  # a crash, not a clean shutdown
                killed.set()
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=kill_when_uploading, daemon=True)
    watcher.start()
    try:
        with pytest.raises(PushFailed) as exc:
            do_publish(engine, ref, tmp_path, target, keys[0])
        watcher.join(5)
        assert killed.is_set(), "the push finished before the registry could be killed"
        assert exc.value.exit_code == 18
        reg.registry.stop()
        back = start_secure_registry(tmp_path / "dies", port=reg.registry.port)
        try:
            monkeypatch.setenv("FLASHKIT_REGISTRY_CA", str(back.ca))
            assert tags(target) == []
        finally:
            back.registry.stop()
        assert publications(tmp_path) == []
    finally:
        killed.set()
        reg.registry.stop()


_PUBLISH = """
import sys
from pathlib import Path
from flashkit.core.errors import FlashkitError
from flashkit.images.engine import ensure_engine
from flashkit.publish import push as publish
from flashkit.ledger.gate import parse_policy
from flashkit.publish.push import PublishRequest
from flashkit.publish.registry import Target
root, ref, host, h, key = sys.argv[1:6]
req = PublishRequest(Path(root), "cu130-torch211", h, h[:20], ref, parse_policy(None), Target(host, "org/flash"),
                     ("torch2.11-cu13.0",), Path(key), {})
try:
    print(publish.publish_image(ensure_engine(start=False), req).digest)
except FlashkitError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def publish_in_parallel(root: Path, refs: list[str], address: str, key: Path) -> list[subprocess.CompletedProcess]:
    """Start one real publish process per ref at the same moment; wait for all."""
    argv = [[sys.executable, "-c", _PUBLISH, str(root), ref, address, H, str(key)] for ref in refs]
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in argv]
    return [subprocess.CompletedProcess(p.args, p.wait(600), *p.communicate()) for p in procs]


def test_two_publishes_at_once_never_move_the_immutable_tag(engine, secure, make_image, keys, tmp_path):
    """Two different images verified under one input hash (two hosts' builds) race for the same tag."""
    refs = [make_image(size=8 * 1024 * 1024), make_image(size=8 * 1024 * 1024)]
    for ref in refs:
        write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    results = publish_in_parallel(tmp_path, refs, secure.address, keys[0])
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 18], [r.stderr[-800:] for r in results]
    winner = next(r for r in results if r.returncode == 0).stdout.strip()
    loser = next(r for r in results if r.returncode == 18)
    assert "immutable tag" in loser.stderr
    target = Target(secure.address, "org/flash")
    with access(target) as acc:
        assert Registry(target, acc).manifest(H[:20])[1] == winner
    (recorded,) = publications(tmp_path)
    assert recorded.digest == winner


def test_the_same_image_published_twice_at_once_is_one_image_and_two_records(
    engine, secure, make_image, keys, tmp_path
):
    ref = make_image(size=8 * 1024 * 1024)
    write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    results = publish_in_parallel(tmp_path, [ref, ref], secure.address, keys[0])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-800:] for r in results]
    assert len({r.stdout.strip() for r in results}) == 1
    recorded = publications(tmp_path)
    assert sorted(p.reused for p in recorded) == [False, True] and len({p.digest for p in recorded}) == 1


# -- through the command line -----------------------------------------------------------------------------
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
    engine, secure, make_image, keys, kit_repo, cli, monkeypatch
):
    from flashkit.plan.inputhash import tag_suffix

    monkeypatch.setenv("FLASHKIT_IMAGE_NAMESPACE", "flashkit-publish-test")
    h = built_and_verified(kit_repo, engine, make_image())
    monkeypatch.setenv("FLASHKIT_REGISTRY", f"{secure.address}/org/flash")
    monkeypatch.setenv("FLASHKIT_SIGNING_KEY", str(keys[0]))
    r = cli("--repo", str(kit_repo), "publish", CLI_ENV)
    assert r.code == 0, r.err
    target = Target(secure.address, "org/flash")
    (published,) = publications(kit_repo, h)
    assert tags(target) == sorted(
        [tag_suffix(h), "torch2.11-cu13.0", "torch2.11-cu13.0-py3.11", attest.att_tag(published.digest)]
    )
    assert f"published {target}@{published.digest}" in r.out
    assert PASSWORD not in r.out + r.err
    prov = store.load(kit_repo, CLI_ENV).publications(h)[0]
    assert list(prov.attestation["predicate_types"]) == sorted([attest.PROVENANCE_TYPE, attest.VERIFICATION_TYPE])


def test_changed_lockfile_after_testing_refuses_through_the_cli(
    engine, secure, make_image, keys, kit_repo, cli, monkeypatch
):
    monkeypatch.setenv("FLASHKIT_IMAGE_NAMESPACE", "flashkit-publish-test")
    h = built_and_verified(kit_repo, engine, make_image())
    dest = f"{secure.address}/org/flash"
    ok = cli("--repo", str(kit_repo), "publish", CLI_ENV, "--registry", dest, "--dry-run")
    assert ok.code == 0, ok.err  # the set-up passes the gate: the refusal below is the lockfile's doing

    lock = kit_repo / "lockfiles" / CLI_ENV / "py3.11.txt"
    lock.write_text(lock.read_text() + "# edited after testing\n")
    r = cli("--repo", str(kit_repo), "publish", CLI_ENV, "--registry", dest, "--signing-key", str(keys[0]))
    assert r.code == 17, r.err
    assert "no build in its ledger at its current input hash" in r.err and h[:20] in r.err
    assert tags(Target(secure.address, "org/flash")) == []


def test_killed_publish_leaves_no_tag(engine, secure, make_image, keys, kit_repo, monkeypatch):
    """`flashkit publish` is SIGKILLed while a layer uploads: the repository never gets a tag."""
    monkeypatch.setenv("FLASHKIT_IMAGE_NAMESPACE", "flashkit-publish-test")
    built_and_verified(kit_repo, engine, make_image(size=48 * 1024 * 1024))
    target = Target(secure.address, "org/flash")
    uploads = secure.registry.storage / "data/docker/registry/v2/repositories/org/flash/_uploads"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from flashkit.cli.main import main; sys.exit(main())",
         "--repo", str(kit_repo), "publish", CLI_ENV, "--registry", str(target), "--signing-key", str(keys[0])],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if uploads.is_dir() and any(uploads.iterdir()):
                os.killpg(proc.pid, signal.SIGKILL)  # flashkit and the skopeo it started
                break
            time.sleep(0.01)
        assert proc.wait(30) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
        time.sleep(2)
        assert tags(target) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_plain_http_loopback_registry_still_works(engine, make_image, keys, tmp_path, monkeypatch):
    """`flashkit registry` (loopback, no TLS, no login) for local trials."""
    for name in ("FLASHKIT_REGISTRY_CA", "FLASHKIT_REGISTRY_USER", "FLASHKIT_REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHKIT_LOCK_DIR", str(tmp_path / "locks"))
    ref = make_image()
    write_ledger(tmp_path, H, image_id(engine, ref), ALL_PASSED)
    with LocalRegistry(storage=tmp_path / "plain") as reg:
        target = Target(reg.address, "org/flash")
        pub = do_publish(engine, ref, tmp_path, target, keys[0])
        assert H[:20] in tags(target) and pub.attestation is not None
