"""`flashkit site`: the page's answers are resolve's, its bytes are the same for the same checkout, ledger
text is never markup, the folder is replaced whole or not at all, and its colours are readable.

What only a browser can show (the script, links, requests, keyboard, a phone's width) is in
tests/integration/test_site_browser.py.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from kitsupport import REPO
from sitesupport import PAYLOAD, hostile_checkout, page_answer, resolve_in_process, resolver

from flashkit.core.errors import SpecError, UsageError
from flashkit.site import render, selector

SIZE_LIMIT = 300 * 1024  # the page without its plots


@pytest.fixture(scope="module")
def repo_site(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    files = render.pages(REPO)
    out = tmp_path_factory.mktemp("site") / "site"
    render.write_site(out, files)
    return out, files


def page_data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="fk-answers">(.*?)</script>', html, re.S)
    assert m, "the page carries no answers"
    return json.loads(m.group(1))


def test_every_choice_shows_what_resolve_prints(repo_site):
    """Every (torch, CUDA/ROCm, Python, ABI) the selects can form against resolve's text, and a sample of
    them, every kind of answer included, against the CLI's own entry point run in-process."""
    data = page_data(repo_site[1]["index.html"].decode())
    selects = data["selects"]
    assert [len(s) for s in selects][3] == 3 and all(selects), selects
    resolve = resolver(REPO)
    first_of: dict[object, list[str]] = {}
    for flat, idx in enumerate(itertools.product(*(range(len(s)) for s in selects))):
        choice = [selects[k][i] for k, i in enumerate(idx)]
        argv = [a for o in choice for a in o["argv"]]
        want = resolve(argv)
        assert page_answer(data, flat, choice) == want, argv
        first_of.setdefault((want[0], choice[0]["label"]), argv)  # each exit code of each torch, once
    assert {code for code, _ in first_of} >= {0, 33}  # both kinds of answer are on the page
    for argv in first_of.values():
        assert resolve(argv) == resolve_in_process(REPO, argv), argv


def test_the_same_checkout_gives_the_same_bytes(repo_site):
    assert render.pages(REPO) == repo_site[1]


def test_size_without_plots(repo_site):
    files = repo_site[1]
    plots = sum(len(m) for m in re.findall(rb"<svg.*?</svg>", files["index.html"], re.S))
    assert sum(len(b) for b in files.values()) - plots < SIZE_LIMIT


def test_nothing_is_fetched_from_elsewhere(repo_site):
    for name, data in repo_site[1].items():
        text = data.decode()
        assert not re.search(r"""(?:src|href)=["']?(?:https?:)?//""", text), name
        assert "@import" not in text and "url(" not in text, name


def test_every_badge_links_to_an_evidence_entry(repo_site):
    files = repo_site[1]
    index, evidence = files["index.html"].decode(), files["evidence.html"].decode()
    anchors = re.findall(r'class="badge[^"]*" href="evidence.html#([^"]+)"', index)
    assert len(anchors) >= 6 * 15
    ids = set(re.findall(r'id="([^"]+)"', evidence))
    assert not [a for a in anchors if a not in ids]


def test_the_cuda12_device_code_relation_is_named_with_its_fact(repo_site):
    """cu124-torch27's GPU verdict comes through identical device code: the badge says so, and its entry
    names the verdict's fact id, the wheel it judged, the GPU and the date."""
    from flashkit.ledger import gate, store
    from flashkit.plan.plan import load_plan

    plan = load_plan(REPO, "cu124-torch27")
    ledger = store.load(REPO, "cu124-torch27")
    art = max(ledger.artifacts(plan.input_hash), key=lambda a: a.date)
    j = gate.judgements(ledger, art, plan.spec.gpu_evidence)[gate.Tier.ARTIFACT_GPU]
    evidence = repo_site[1]["evidence.html"].decode()
    entry = evidence[evidence.index('id="cu124-torch27-artifact-gpu"') :]
    entry = entry[: entry.index("</article>")]
    assert "same device code as cu124-torch210" in entry
    for value in (j.verdict.id, j.verdict.subject.digest, j.verdict.date, "NVIDIA H200"):
        assert value in entry, value


def test_markup_in_the_ledger_and_results_is_text(kit_repo):
    hostile_checkout(kit_repo)
    files = render.pages(kit_repo)
    for name, data in files.items():
        text = data.decode()
        assert "<script>window" not in text and "<img src=x" not in text, name
    index, evidence = files["index.html"].decode(), files["evidence.html"].decode()
    shown = "&lt;script&gt;window.__fk_pwned=1&lt;/script&gt;"
    assert shown in evidence and shown in index  # there, as text: reasons, host, policy; the chart's labels
    data = page_data(index)
    assert any(PAYLOAD in line for line in data["lines"])  # the resolve lines carry it, to be shown as text


def test_json_in_a_script_block_cannot_end_it():
    text = render.json_for_script({"a": "</script><script>alert(1)</script>", "b": "&<>"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": "</script><script>alert(1)</script>", "b": "&<>"}


def test_the_description_the_page_builds_is_resolves(kit_repo):
    """The page joins the options' phrases into the description resolve prints; selector_data refuses to
    make a page where the two would differ (it checks every choice)."""
    from flashkit.doctor import repo as repo_facts
    from flashkit.doctor import resolve_text

    facts = repo_facts.load(kit_repo)
    for choice in itertools.product(*selector.options(facts)):
        assert ", ".join(o.phrase for o in choice) == resolve_text.describe(selector.query(choice))


def test_a_folder_it_did_not_write_is_refused(tmp_path):
    out = tmp_path / "docs"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="did not write"):
        render.write_site(out, {"index.html": b"x"})
    assert (out / "keep.txt").read_text() == "mine"
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UsageError, match="not a folder"):
        render.write_site(tmp_path / "link", {"index.html": b"x"})
    assert not any(target.iterdir())


def test_a_site_is_replaced_whole(tmp_path):
    out = tmp_path / "site"
    render.write_site(out, {render.MARKER: b"m", "index.html": b"one", "old.html": b"gone"})
    render.write_site(out, {render.MARKER: b"m", "index.html": b"two"})
    assert sorted(p.name for p in out.iterdir()) == [render.MARKER, "index.html"]
    assert (out / "index.html").read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["site"]  # no staging folder left


def test_a_failed_write_leaves_the_old_site(tmp_path, monkeypatch):
    out = tmp_path / "site"
    render.write_site(out, {render.MARKER: b"m", "index.html": b"one"})

    def broken(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", broken)
    with pytest.raises(UsageError, match=r"--out .*: cannot write it: No space left on device"):
        render.write_site(out, {render.MARKER: b"m", "index.html": b"two"})
    monkeypatch.undo()
    assert (out / "index.html").read_bytes() == b"one"
    assert [p.name for p in tmp_path.iterdir()] == ["site"]


def test_cli(cli, tmp_path):
    r = cli("--repo", str(REPO), "site", "--out", str(tmp_path / "s"))
    assert r.code == 0, r.err
    assert (tmp_path / "s" / "index.html").is_file() and (tmp_path / "s" / "assets" / "select.js").is_file()
    r = cli("--repo", str(REPO), "site", "--out", str(tmp_path / "t"), "--policy", "nonsense")
    assert r.code == UsageError.exit_code and "unknown tier" in r.err
    assert not (tmp_path / "t").exists()


def test_a_broken_spec_is_named_the_page_is_made_from_the_others_and_the_exit_is_3(cli, kit_repo, tmp_path):
    (kit_repo / "envs" / "cu124-torch27.yaml").write_text("torch: !foo bar\n")
    r = cli("--repo", str(kit_repo), "site", "--out", str(tmp_path / "s"))
    assert r.code == SpecError.exit_code, r.err
    assert "left out, its spec does not validate" in r.err and "cu124-torch27.yaml" in r.err
    data = page_data((tmp_path / "s" / "index.html").read_text())
    assert {code for code, _out, _err in data["answers"]} == {SpecError.exit_code}  # as resolve says each time


# WCAG 2 relative luminance and contrast ratio; AA asks 4.5:1 for body text.
def _luminance(hex_colour: str) -> float:
    rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


PAIRS = [
    ("fg", "bg"), ("muted", "bg"), ("link", "bg"), ("fg", "code-bg"), ("muted", "code-bg"), ("link", "code-bg"),
    ("pass-fg", "pass-bg"), ("fail-fg", "fail-bg"), ("rel-fg", "rel-bg"), ("none-fg", "none-bg"), ("pass-fg", "bg"),
    ("fail-fg", "bg"), ("fg", "bg"),
]  # fmt: skip


def test_colours_meet_wcag_aa():
    css = (Path(render.__file__).parent / "static" / "site.css").read_text()
    colours = dict(re.findall(r"--([a-z-]+):\s*(#[0-9a-f]{6})", css))
    low = {f"{a}/{b}": round(_contrast(colours[a], colours[b]), 2) for a, b in PAIRS}
    assert all(v >= 4.5 for v in low.values()), low


def test_the_decode_chart_shows_backends_not_the_split_sweep():
    """bench_decode's forced split counts (cuda_s<N>) are a tuning sweep: the chart shows what a user can call
    (the API, the kernels, SDPA's backends) and marks flash_kernels' own bars."""
    from flashkit.site import plots

    row = {"batch": 1, "cache_len": 32768, "heads_q": 32, "heads_kv": 8, "head_dim": 128}
    shares = {"api": 0.66, "cuda": 0.66, "cuda_s8": 0.67, "cuda_s16": 0.70, "cuda_paged16": 0.66, "sdpa_cudnn": 0.69}
    data = {"rows": [dict(row, impl=i, share_of_copy_call=v) for i, v in shares.items()], "copy_TBps": 3.02}
    (group,) = plots.decode_chart(data, "decode.json", "abc1234").groups
    assert [(b.label, b.ours) for b in group.bars] == [
        ("flash_kernels (flash_attn_with_kvcache)", True),
        ("flash_kernels CUDA", True),
        ("flash_kernels CUDA, paged (16)", True),
        ("cuDNN (torch SDPA)", False),
    ]
