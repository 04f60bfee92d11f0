"""Property-based tests (hypothesis, the fixed profile of conftest.py): the readers of untrusted text end in a
result or a documented FlashkitError, never another exception."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kitsupport import H1, REPO, artifact, verdict  # noqa: E402

from flashkit.cli.resolve_cmd import query_of  # noqa: E402
from flashkit.core.errors import FlashkitError, RecordError, SpecError, UsageError  # noqa: E402
from flashkit.ledger import store  # noqa: E402
from flashkit.plan import lock  # noqa: E402
from flashkit.plan.specfile import parse_spec  # noqa: E402

SPEC = (REPO / "envs" / "cu124-torch27.yaml").read_text()
YAML_BITS = ["\n", " ", "  ", ":", "- ", "[", "]", "{", "}", ",", "!", "!!", "&a", "*a", "?", "<<", "#", "'", '"',
             "|", ">", "%YAML 1.1\n", "---\n", "torch", "python", "base", "ref", "2026-13-01", "3.10", "1e999",
             "!!python/object/apply:os.system", "\t", "\x00", "\ufeff", "é"]  # fmt: skip


def _spec(text: str):
    return parse_spec(text, env_id="cu124-torch27", display="envs/cu124-torch27.yaml", source=Path("x"),
                      repo_root=REPO)  # fmt: skip


@given(st.lists(st.sampled_from(YAML_BITS) | st.text(max_size=8), max_size=40))
def test_the_spec_reader_on_yaml_like_text(parts):
    with contextlib.suppress(SpecError):
        _spec("".join(parts))


@given(st.integers(0, len(SPEC)), st.lists(st.sampled_from(YAML_BITS), min_size=1, max_size=6))
def test_the_spec_reader_on_a_real_spec_with_an_edit(at, inserted):
    try:
        _spec(SPEC[:at] + "".join(inserted) + SPEC[at:])
    except SpecError as exc:
        assert str(exc).startswith("envs/cu124-torch27.yaml")


ART = artifact("cu130-torch211", H1)
LINES = [ART.line(), verdict(ART, "cpu").line()]


@given(st.lists(st.sampled_from(LINES) | st.text(max_size=40), max_size=6), st.integers(0, 200), st.text(max_size=6))
def test_the_ledger_reader_on_mangled_lines(lines, cut, inserted):
    text = "\n".join(lines)
    text = text[:cut] + inserted + text[cut:]
    try:
        store.parse_lines(text, env=None, shown="x.jsonl")
    except FlashkitError as exc:  # RecordError, or DeviceCodeMismatch for two digests of one wheel
        assert str(exc).startswith("x.jsonl:")


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                    max_leaves=30))  # fmt: skip
def test_the_ledger_reader_on_any_json_value(value):
    with contextlib.suppress(RecordError):
        store.parse_lines(json.dumps(value), env=None, shown="x.jsonl")


@given(st.text(max_size=30), st.one_of(st.none(), st.text(max_size=8)), st.one_of(st.none(), st.text(max_size=8)))
def test_resolve_reads_any_torch_cuda_and_python_as_a_query_or_a_usage_error(torch, cuda, python):
    args = argparse.Namespace(torch=torch, cuda=cuda, rocm=None, python=python, cxx11_abi=None)
    try:
        q = query_of(args)
    except UsageError:
        return
    assert q.torch.count(".") in (1, 2)


PIN_BITS = ["torch==2.7.1", " \\\n", "    --hash=sha256:" + "a" * 64, "\n", "#", " ; python_version >= '3.10'",
            "-e .", "==", "[extra]", "@ file:///x", "--index-url x", "\\", "\t"]  # fmt: skip


@given(st.lists(st.sampled_from(PIN_BITS) | st.text(max_size=10), max_size=20))
def test_the_requirements_reader_returns_pins_and_problems(parts):
    try:
        pins, problems = lock.parse("".join(parts))
    except FlashkitError:
        return
    assert isinstance(pins, list) and all(isinstance(p, str) for p in problems)
