"""The loopback registry is real: the engine pushes to it and pulls back by digest."""

from __future__ import annotations

import shutil
import urllib.request

import pytest

from flashkit.images.container import image_inspect, image_remove
from flashkit.publish.local_registry import LocalRegistry

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(shutil.which("docker-registry") is None, reason="apt-get install docker-registry"),
]


def test_push_and_pull_back_by_digest(engine, debian_base):
    sdk = engine.sdk()
    src = sdk.images.get(debian_base)
    with LocalRegistry() as reg:
        ref = f"{reg.address}/flashkit-test/base"
        src.tag(ref, "t1")
        digest = None
        try:
            last = {}
            for line in sdk.api.push(ref, tag="t1", stream=True, decode=True):
                assert "error" not in line, line
                last = line.get("aux") or last
            digest = last["Digest"]
            with urllib.request.urlopen(f"http://{reg.address}/v2/flashkit-test/base/tags/list") as r:
                assert b"t1" in r.read()
            image_remove(engine, [f"{ref}:t1"])
            pulled = sdk.images.pull(f"{ref}@{digest}")
            assert pulled.id == src.id
            assert f"{ref}@{digest}" in image_inspect(engine, pulled.id)["RepoDigests"]
        finally:
            image_remove(engine, [f"{ref}:t1"] + ([f"{ref}@{digest}"] if digest else []))
            sdk.close()
    assert not reg.storage.exists()
