"""Compatibility rules: data with reasons and fixes; the repository's envs are all accepted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flashkit.core.errors import RuleRejected
from flashkit.plan import compat, rules
from flashkit.plan.specfile import load_all, load_env

REPO = Path(__file__).resolve().parents[1]
SPECS = load_all(REPO)


def test_rules_are_data_with_reason_and_fix():
    ids = [r.id for r in rules.RULES]
    assert len(ids) == len(set(ids)) >= 10
    for r in rules.RULES:
        assert r.reason and r.fix and callable(r.check)


@pytest.mark.parametrize("spec", SPECS, ids=[str(s.id) for s in SPECS])
def test_repository_envs_are_accepted_with_a_note_per_rule(spec):
    verdicts = rules.check(spec)
    assert len(verdicts) == len(rules.RULES)
    assert all(isinstance(v, rules.Accepted) and v.note for v in verdicts), [v for v in verdicts if not v.ok]
    rules.require_accepted(spec)


def test_rejected_verdict_names_rule_reason_and_fix():
    spec = dataclasses.replace(load_env(REPO, "cu124-torch27"), cxx11_abi=False)
    (bad,) = rules.rejections(spec)
    assert bad.rule.id == "pypi-torch-abi" and "cxx11" in bad.reason and bad.fix == bad.rule.fix
    with pytest.raises(RuleRejected) as exc:
        rules.require_accepted(spec)
    assert exc.value.exit_code == 4 and "Fix:" in str(exc.value)


def test_torch26_is_pre_cxx11_and_cuda124_matches_its_wheels():
    spec = load_env(REPO, "cu124-torch26")
    notes = {v.rule.id: v.note for v in rules.check(spec)}
    assert "pre-cxx11" in notes["pypi-torch-abi"]
    assert "CUDA 12.4" in notes["torch-cuda-major"]


def test_minor_cuda_mismatch_is_accepted_with_a_note():
    notes = {v.rule.id: v.note for v in rules.check(load_env(REPO, "cu124-torch27"))}
    assert "minor differs" in notes["torch-cuda-major"]


def test_arch_table_edges():
    spec = load_env(REPO, "cu128-torch28")
    assert all(v.ok for v in rules.check(spec))  # sm_100 and sm_120 with CUDA 12.8
    older = dataclasses.replace(spec, accelerator=dataclasses.replace(spec.accelerator, version="12.6"))
    reasons = " ".join(v.reason for v in rules.rejections(older))
    assert "sm_100 needs CUDA >= 12.8" in reasons and "sm_120 needs CUDA >= 12.8" in reasons
    volta = dataclasses.replace(load_env(REPO, "cu130-torch211"), gpu_targets=("7.0",), backends=("triton",))
    assert any("dropped in CUDA 13" in v.reason for v in rules.rejections(volta))


def test_kernels_need_ampere_for_the_cuda_backend():
    spec = dataclasses.replace(load_env(REPO, "cu124-torch27"), gpu_targets=("7.5", "8.0"))
    assert [v.rule.id for v in rules.rejections(spec)] == ["kernels-min-sm"]
    triton_only = dataclasses.replace(spec, backends=("triton",))
    assert rules.rejections(triton_only) == []


def test_every_torch_series_has_python_data_and_cuda_defaults_agree_with_facts():
    assert compat.TORCH_DEFAULT_CUDA["2.7"] == "12.6"
    assert compat.TORCH_DEFAULT_CUDA["2.11"] == "13.0"
    assert compat.TORCH_PYTHONS["2.15"][0] == "3.11"
    assert set(compat.TORCH_DEFAULT_CUDA) <= set(compat.TORCH_PYTHONS)
    # PyPI's default wheel is one of the CUDA builds PyTorch's own index has for that series.
    assert set(compat.TORCH_INDEX_CUDA) <= set(compat.TORCH_DEFAULT_CUDA)
    assert all(compat.TORCH_DEFAULT_CUDA[s] in cudas for s, cudas in compat.TORCH_INDEX_CUDA.items())
    assert compat.TORCH_INDEX_CUDA["2.8"] == ("12.6", "12.8", "12.9")


def test_unknown_torch_series_is_rejected_not_guessed():
    spec = dataclasses.replace(load_env(REPO, "cu130-torch215"), torch="2.16.0")
    ids = {v.rule.id for v in rules.rejections(spec)}
    assert {"python-supported-by-torch", "torch-cuda-major"} <= ids


def test_torch25_on_python313_has_no_triton_and_is_refused_with_the_rule():
    """torch 2.5.1 requires triton only below Python 3.13: an env with the Triton backend (and the CPU tier,
    which is Triton's interpreter) cannot exist there. trixie, the only Debian with CUDA 12, has 3.13 only."""
    spec = dataclasses.replace(load_env(REPO, "cu124-torch26"), torch="2.5.1")
    (bad,) = rules.rejections(spec)
    assert bad.rule.id == "torch-triton-python"
    assert "requires triton only on Python 3.9, 3.10, 3.11, 3.12: on 3.13 it has none" in bad.reason
    on_312 = [v.rule.id for v in rules.rejections(dataclasses.replace(spec, python="3.12"))]
    assert on_312 == ["base-provides-python-and-cuda"]  # torch would bring triton; trixie has no 3.12
    assert rules.rejections(dataclasses.replace(load_env(REPO, "cu124-torch26"))) == []  # 2.6 has it on 3.13
