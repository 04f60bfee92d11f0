import dataclasses
from pathlib import Path

import pytest

from flashkit.core.errors import SpecError
from flashkit.plan.envid import EnvId
from flashkit.plan.specfile import env_ids

REPO = Path(__file__).resolve().parents[1]

GOOD = ["cu124-torch27", "cu130-torch211", "rocm64-torch27", "cu131-torch210-ngc", "cu118-torch20", "cu92-torch113"]


@pytest.mark.parametrize("text", GOOD + env_ids(REPO))
def test_id_round_trips(text):
    env = EnvId.parse(text)
    assert str(env) == text
    assert EnvId.parse(str(env)) == env


def test_fields():
    env = EnvId.parse("cu124-torch27")
    assert (env.accel_kind, env.accel_version, env.torch_series, env.variant) == ("cuda", "12.4", "2.7", None)
    rocm = EnvId.parse("rocm64-torch27")
    assert (rocm.accel_kind, rocm.accel_version) == ("rocm", "6.4")
    assert EnvId.parse("cu131-torch210-ngc").variant == "ngc"
    assert EnvId.parse("cu130-torch211").torch_series == "2.11"


def test_frozen():
    env = EnvId.parse("cu124-torch27")
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.torch_minor = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    [
        "cu124",
        "cuda124-torch27",
        "cu124-torch",
        "cu0124-torch27",
        "cu124-torch207",
        "cu124-torch27-",
        "cu124-torch27-NGC",
        "cu124_torch27",
        " cu124-torch27",
        "cu1-torch27",
        "rocm-torch27",
        "cu124-torch27;rm",
    ],
)
def test_invalid_ids_are_refused(text):
    with pytest.raises(SpecError, match="invalid env id"):
        EnvId.parse(text)


def test_hand_built_value_prints_a_parseable_id():
    env = EnvId("cuda", 12, 8, 2, 8)
    assert str(env) == "cu128-torch28"
    with pytest.raises(SpecError):
        EnvId("cuda", 12, 10, 2, 8)  # a two-digit minor cannot be written back
