"""The publish gate and its configuration: pure, no docker, no registry."""

from __future__ import annotations

import pytest
from kitsupport import H1 as H
from kitsupport import artifact, full_ledger

from flashkit.core.errors import PublishRefused, UsageError
from flashkit.ledger import store
from flashkit.ledger.gate import DEFAULT_POLICY, gate, parse_policy
from flashkit.publish.push import refuse_hint
from flashkit.publish.registry import Target, parse_target

IMG = "sha256:" + "1" * 64


def test_default_policy_requires_a_gpu_tier():
    p = parse_policy(None)
    assert p.name == DEFAULT_POLICY == "full"
    assert p.describe() == "build,abi,cpu,gpu|artifact-gpu"


@pytest.mark.parametrize(
    "text, weaker", [("full", False), ("no-gpu", True), ("build,abi,cpu,artifact-gpu", False), ("build", True)]
)
def test_named_and_listed_policies(text, weaker):
    assert parse_policy(text).weaker_than_default is weaker


def test_unknown_tier_is_a_usage_error_with_a_suggestion():
    with pytest.raises(UsageError, match="Perhaps you meant 'artifact-gpu'"):
        parse_policy("build,artifact_gpu")


def test_refusal_hint_names_the_gpu_ways_out(tmp_path):
    a = artifact(image=IMG)
    full_ledger(tmp_path, a, tiers=("build", "abi", "cpu"))
    led = store.load(tmp_path, a.env)
    assert not gate(led, H, IMG, parse_policy("full"))
    d = gate(led, H, IMG, parse_policy("no-gpu"))
    assert d.ok and d.passed_tiers == ("build", "abi", "cpu")
    hint = refuse_hint("cu130-torch211", gate(led, H, IMG, parse_policy("full")))
    assert "--policy no-gpu" in hint and "flashkit test cu130-torch211" in hint


@pytest.mark.parametrize(
    "text,host,repo,scheme",
    [
        ("127.0.0.1:5000/org/flash", "127.0.0.1:5000", "org/flash", "http"),
        ("localhost:5000/flash", "localhost:5000", "flash", "http"),
        ("registry.example.com/org/flash", "registry.example.com", "org/flash", "https"),
        ("registry.example.com:8443/a/b/c", "registry.example.com:8443", "a/b/c", "https"),
    ],
)
def test_registry_target(text, host, repo, scheme):
    t = parse_target(text)
    assert (t.host, t.repository, t.loopback) == (host, repo, scheme == "http")
    assert t.ref("latest") == f"docker://{host}/{repo}:latest"
    assert t.ref("sha256:" + "a" * 64) == f"docker://{host}/{repo}@sha256:" + "a" * 64


@pytest.mark.parametrize(
    "text,needle",
    [
        (None, "FLASHKIT_REGISTRY"),
        ("", "FLASHKIT_REGISTRY"),
        ("org/flash", "HOST[:PORT]/REPOSITORY"),
        ("127.0.0.1:5000", "HOST[:PORT]/REPOSITORY"),
        ("127.0.0.1:5000/Org/flash", "'Org' is not allowed"),
        ("user:token@registry.example.com/org/flash", "FLASHKIT_REGISTRY_USER"),
        ("https://registry.example.com/org/flash", "without a scheme"),
        ("127.0.0.1:5000/org/flash\n", "is not allowed"),
    ],
)
def test_bad_registry_target(text, needle):
    with pytest.raises(UsageError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_target(text)


def test_target_is_configuration():
    assert str(Target("127.0.0.1:5000", "org/flash")) == "127.0.0.1:5000/org/flash"


def test_cli_without_registry_is_a_usage_error(kit_repo, cli, monkeypatch):
    monkeypatch.delenv("FLASHKIT_REGISTRY", raising=False)
    r = cli("--repo", str(kit_repo), "publish", "cu130-torch211")
    assert r.code == 2 and "FLASHKIT_REGISTRY" in r.err


def test_cli_refuses_an_env_never_built(kit_repo, cli):
    r = cli("--repo", str(kit_repo), "publish", "cu130-torch211", "--registry", "127.0.0.1:1/org/flash")
    assert r.code == PublishRefused.exit_code == 17
    assert "no build in its ledger at its current input hash" in r.err and "flashkit test cu130-torch211" in r.err


def test_a_status_code_inside_a_port_is_not_a_refused_login():
    """A registry on port 41401 that died mid-upload gave a broken pipe that read as "401" (a flaky
    integration failure): only a status code standing as a word means a refused login."""
    from flashkit.publish.registry import auth_refused

    died = (
        'writing blob: Patch "https://127.0.0.1:41401/v2/org/flash/blobs/uploads/6fe8-401a?_state=x401%3D": write tcp'
    )
    assert not auth_refused(died)
    assert auth_refused("reading manifest: received unexpected HTTP status: 401 Unauthorized")
    assert auth_refused("requested access to the resource is denied")
    assert auth_refused("error: 403 (forbidden)")
