"""Signed attestations without a registry: keys, DSSE envelopes, what a verifier refuses, and the policy check."""

from __future__ import annotations

import base64
import json
import os

import pytest

from flashkit.core.errors import AttestationInvalid, KeyFileError
from flashkit.ledger.gate import parse_policy
from flashkit.publish import attest
from flashkit.publish.verify_image import check_policy

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


@pytest.fixture
def pair(tmp_path):
    priv, pub = attest.generate_keys(tmp_path / "keys", repo_root=None)
    return attest.load_signer(priv), attest.load_public_key(pub)


def envelope(signer, digest=DIGEST, ptype=attest.VERIFICATION_TYPE, predicate=None):
    return attest.sign(signer, attest.statement("r.example/org/flash", digest, ptype, predicate or {"tiers": []}))


def test_a_signed_statement_verifies_and_names_its_digest(pair):
    signer, pub = pair
    checked = attest.open_envelope(envelope(signer), pub, DIGEST)
    assert checked.predicate_type == attest.VERIFICATION_TYPE
    assert checked.statement["subject"][0]["digest"] == {"sha256": DIGEST[7:]}
    assert checked.key_id == attest.key_id(pub)


def test_a_changed_payload_does_not_verify(pair):
    signer, pub = pair
    env = json.loads(envelope(signer))
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["predicate"]["tiers"] = [{"tier": "gpu", "verdict": "passed"}]
    env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    with pytest.raises(AttestationInvalid, match="signature does not verify"):
        attest.open_envelope(json.dumps(env).encode(), pub, DIGEST)


def test_another_key_does_not_verify(pair, tmp_path):
    signer, _pub = pair
    _priv, other = attest.generate_keys(tmp_path / "other", None)
    with pytest.raises(AttestationInvalid, match="does not verify with key"):
        attest.open_envelope(envelope(signer), attest.load_public_key(other), DIGEST)


def test_a_statement_about_another_digest_is_refused(pair):
    signer, pub = pair
    with pytest.raises(AttestationInvalid, match="not " + DIGEST):
        attest.open_envelope(envelope(signer, digest=OTHER), pub, DIGEST)


def test_an_artifact_whose_subject_is_another_image_is_refused(pair, tmp_path):
    signer, pub = pair
    envs = [(t, envelope(signer, OTHER, t)) for t in (attest.PROVENANCE_TYPE, attest.VERIFICATION_TYPE)]
    attest.write_layout(tmp_path / "l", OTHER, 100, envs)
    index = json.loads((tmp_path / "l/index.json").read_text())
    manifest = (tmp_path / "l/blobs/sha256" / index["manifests"][0]["digest"][7:]).read_bytes()
    with pytest.raises(AttestationInvalid, match="refers to another image"):
        attest.read_artifact(manifest, lambda d: (tmp_path / "l/blobs/sha256" / d[7:]).read_bytes(), DIGEST, pub)


def test_an_artifact_needs_both_statements(pair, tmp_path):
    signer, pub = pair
    attest.write_layout(
        tmp_path / "l", DIGEST, 100, [(attest.PROVENANCE_TYPE, envelope(signer, ptype=attest.PROVENANCE_TYPE))]
    )
    index = json.loads((tmp_path / "l/index.json").read_text())
    manifest = (tmp_path / "l/blobs/sha256" / index["manifests"][0]["digest"][7:]).read_bytes()
    with pytest.raises(AttestationInvalid, match="lacks a signed"):
        attest.read_artifact(manifest, lambda d: (tmp_path / "l/blobs/sha256" / d[7:]).read_bytes(), DIGEST, pub)


def test_keys_are_never_written_into_the_repository(kit_repo):
    with pytest.raises(KeyFileError, match="inside the repository"):
        attest.generate_keys(kit_repo / "keys", kit_repo)
    assert not (kit_repo / "keys").exists()


def test_key_files_are_checked(tmp_path):
    priv, pub = attest.generate_keys(tmp_path / "k", None)
    assert oct(os.stat(priv).st_mode & 0o777) == "0o600"
    with pytest.raises(KeyFileError, match="already exists"):
        attest.generate_keys(tmp_path / "k", None)
    os.chmod(priv, 0o644)
    with pytest.raises(KeyFileError, match="readable by group or others"):
        attest.load_signer(priv)
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        os.chmod(pub, 0o600)
        attest.load_signer(pub)
    with pytest.raises(KeyFileError, match="cannot be read"):
        attest.load_public_key(tmp_path / "absent.pub")
    (tmp_path / "junk.pub").write_text("not a key")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        attest.load_public_key(tmp_path / "junk.pub")


@pytest.mark.parametrize(
    "tiers, asked, unmet",
    [
        (["build", "abi", "cpu", "gpu"], "full", []),
        (["build", "abi", "cpu", "artifact-gpu"], "full", []),
        (["build", "abi", "cpu"], "full", ["gpu or artifact-gpu did not pass"]),
        (["build", "abi", "cpu"], "no-gpu", []),
        (["build", "cpu"], "no-gpu", ["abi did not pass"]),
    ],
)
def test_the_asked_policy_against_the_signed_tiers(tiers, asked, unmet):
    verification = {
        "tiers": [{"tier": t, "verdict": "passed"} for t in tiers] + [{"tier": "gpu", "verdict": "not-run"}]
    }
    assert check_policy(parse_policy(asked), verification) == unmet


def test_the_cosign_style_tag():
    assert attest.att_tag(DIGEST) == "sha256-" + "ab" * 32 + ".att"
