"""The publish gate and its configuration: pure, no docker, no registry."""

from __future__ import annotations

import pytest

from flashkit.ledger import record
from flashkit.ledger.publish import (
    DEFAULT_POLICY,
    PublishRefused,
    Target,
    UsageError,
    gate,
    image_labels,
    parse_policy,
    parse_target,
    refuse_hint,
)
from flashkit.ledger.record import TierResult

H = "fk1-" + "cd" * 32
IMG = "sha256:" + "1" * 64
OTHER = "sha256:" + "2" * 64


def rec_with(tmp_path, verdicts: dict[str, str], image_id: str = IMG, judged: dict[str, str] | None = None) -> dict:
    path = tmp_path / "verified" / "env.json"
    tiers = [
        TierResult(
            tier=t,
            verdict=v,
            counts={"passed": 2} if v == "passed" else {"failed": 1},
            reasons=() if v == "passed" else (f"{t} said no",),
            duration_s=1.0,
            judged=judged or {"image_id": image_id},
        )
        for t, v in verdicts.items()
    ]
    record.upsert_entry(path, H, {"image_id": image_id, "wheel_sha256": "a" * 64}, tiers)
    return record.load(path)


FULL = {"build": "passed", "abi": "passed", "cpu": "passed", "gpu": "passed"}


def test_default_policy_requires_a_gpu_tier():
    p = parse_policy(None)
    assert p.name == DEFAULT_POLICY == "full"
    assert p.describe() == "build,abi,cpu,gpu|artifact-gpu"
    assert not p.weaker_than_default


@pytest.mark.parametrize(
    "text,weaker",
    [("no-gpu", True), ("build,abi,cpu", True), ("build,abi,cpu,gpu", False), ("build,abi,cpu,artifact-gpu", False)],
)
def test_named_and_listed_policies(text, weaker):
    assert parse_policy(text).weaker_than_default is weaker


def test_unknown_tier_is_a_usage_error_with_a_suggestion():
    with pytest.raises(UsageError, match=r"unknown tier 'cpuu'.*Perhaps you meant 'cpu'") as exc:
        parse_policy("build,cpuu")
    assert exc.value.exit_code == 2


def test_full_record_passes_the_gate(tmp_path):
    d = gate(rec_with(tmp_path, FULL), H, IMG, parse_policy(None))
    assert d.ok and d.passed_tiers == ("build", "abi", "cpu", "gpu")


def test_artifact_gpu_stands_in_for_gpu(tmp_path):
    verdicts = FULL | {"gpu": "not-run"}
    rec = rec_with(tmp_path, verdicts)
    assert not gate(rec, H, IMG, parse_policy(None))
    # An artifact-gpu result judges the wheel, not the image.
    wheel = TierResult(
        tier="artifact-gpu", verdict="passed", counts={"passed": 9}, reasons=(), duration_s=1.0,
        judged={"wheel_sha256": "a" * 64},
    )  # fmt: skip
    record.add_tier_result(tmp_path / "verified" / "env.json", H, wheel)
    d = gate(record.load(tmp_path / "verified" / "env.json"), H, IMG, parse_policy(None))
    assert d.ok and "artifact-gpu" in d.passed_tiers and "gpu" not in d.passed_tiers


@pytest.mark.parametrize(
    "verdicts,image,input_hash,needle",
    [
        (FULL | {"abi": "failed"}, IMG, H, "tier abi is failed"),
        (FULL | {"gpu": "not-run"}, IMG, H, "tier gpu is not-run"),
        ({"build": "passed", "abi": "passed", "cpu": "passed"}, IMG, H, "tier gpu has no result"),
        (FULL, OTHER, H, f"judged image {IMG}, not {OTHER}"),
        (FULL, IMG, "fk1-" + "ef" * 32, "no entry for input hash"),
    ],
)
def test_gate_refuses_with_the_reason(tmp_path, verdicts, image, input_hash, needle):
    d = gate(rec_with(tmp_path, verdicts), input_hash, image, parse_policy(None))
    assert not d.ok
    assert any(needle in r for r in d.reasons), d.reasons


def test_a_tier_that_judged_another_image_does_not_count(tmp_path):
    rec = rec_with(tmp_path, FULL, judged={"image_id": OTHER})
    d = gate(rec, H, IMG, parse_policy(None))
    assert not d.ok and f"judged image {OTHER}" in d.reasons[0]


def test_weaker_policy_passes_only_when_asked(tmp_path):
    rec = rec_with(tmp_path, FULL | {"gpu": "not-run"})
    assert not gate(rec, H, IMG, parse_policy("full"))
    d = gate(rec, H, IMG, parse_policy("no-gpu"))
    assert d.ok and d.passed_tiers == ("build", "abi", "cpu")
    hint = refuse_hint("cu130-torch211", gate(rec, H, IMG, parse_policy("full")))
    assert "--policy no-gpu" in hint and "flashkit test cu130-torch211" in hint


def test_labels_state_policy_and_judged_image():
    labels = image_labels("e", H, IMG, parse_policy("no-gpu"), ("build", "abi", "cpu"))
    assert labels["io.flashkit.policy"] == "no-gpu:build,abi,cpu"
    assert labels["io.flashkit.verified-tiers"] == "build,abi,cpu"
    assert labels["io.flashkit.judged-image"] == IMG


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
    assert (t.host, t.repository, t.base_url.split(":")[0]) == (host, repo, scheme)
    assert t.staging == repo + "-staging"


@pytest.mark.parametrize(
    "text,needle",
    [
        (None, "FLASHKIT_REGISTRY"),
        ("", "FLASHKIT_REGISTRY"),
        ("org/flash", "HOST[:PORT]/REPOSITORY"),
        ("127.0.0.1:5000", "HOST[:PORT]/REPOSITORY"),
        ("127.0.0.1:5000/Org/flash", "'Org' is not allowed"),
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
    assert "no build for its current input hash" in r.err and "flashkit test cu130-torch211" in r.err
