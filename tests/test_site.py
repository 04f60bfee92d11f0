"""`flashkit site`: the page's answers are resolve's, its bytes are the same for the same checkout, ledger
text is never markup, the folder is replaced whole or not at all, and its colours are readable.

What only a browser can show (the script, links, requests, keyboard, a phone's width) is in
tests/integration/test_site_browser.py.
"""

from __future__ import annotations

import html as html_lib
import itertools
import json
import re
from pathlib import Path

import pytest
from kitsupport import REPO
from sitesupport import PAYLOAD, hostile_checkout, page_answer, page_data, resolve_in_process, resolver

from flashkit.core.errors import SpecError, UsageError
from flashkit.site import render, selector

SIZE_LIMIT = 300 * 1024  # the page without its plots


@pytest.fixture(scope="module")
def repo_site(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    files = render.pages(REPO)
    out = tmp_path_factory.mktemp("site") / "site"
    render.write_site(out, files)
    return out, files


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
        assert page_answer(data, flat) == want, argv
        first_of.setdefault((want[0], choice[0]["label"]), argv)  # each exit code of each torch, once
    # The checkout records no wheel publication: its verified fits say "not published" (35), the others 33.
    assert {code for code, _ in first_of} >= {33, 35}
    for argv in first_of.values():
        assert resolve(argv) == resolve_in_process(REPO, argv), argv


def _choices(data: dict):
    """Every choice: its index in pick, its option indices and its `flashkit resolve` arguments."""
    selects = data["selects"]
    for flat, idx in enumerate(itertools.product(*(range(len(s)) for s in selects))):
        yield flat, list(idx), [a for k, i in enumerate(idx) for a in selects[k][i]["argv"]]


# How an answer that names a fit begins: a published one, or a verified one nobody can download yet (exit 35;
# this checkout records no wheel publication).
FIT_HEADS = ("fits: ", "verified, not published: ")


def test_no_answer_ends_without_a_nearest_fit_or_nothing_near(repo_site):
    """Every exit-33 answer says first (after its header) the nearest fit or that nothing is near; the page
    finds that block, and the choice it links names the same command as the block's `ask:` line, and fits."""
    data = page_data(repo_site[1]["index.html"].decode())
    seen = set()
    for _flat, idx, _argv in _choices(data):
        shown = selector.shown(data, idx)
        if shown.code != 33:
            assert not shown.near and shown.near_choice is None
            continue
        after = [line for line in shown.err if not line.startswith("left out")][1]
        assert after.startswith(("nearest fit: ", "nothing near: ")), shown.err
        assert shown.near and shown.near[0] == after
        seen.add(after.split(":")[0])
        if after.startswith("nearest fit: "):
            ask = shown.near[2].removeprefix("  ask: ")
            assert shown.near_choice is not None, after  # the selects can form every nearest fit today
            target = selector.shown(data, shown.near_choice)
            fits = target.code != 33 and any(line.startswith(FIT_HEADS) for line in target.err)
            # resolve reads a torch's local label (NGC's 2.10.0a0+b4e4ee81d3) as the public version, so the
            # ask line names the public one while the select's option keeps the label: the same question
            assert _public_torch(target.command) == ask and fits, (ask, target.command, target.code)
    assert seen == {"nearest fit", "nothing near"}


def _public_torch(command: str) -> str:
    return re.sub(r"(--torch \S+?)\+\S+", r"\1", command)


def _options_html(html: str, name: str) -> list[tuple[str, bool, bool, str]]:
    """(data-label, greyed, selected, shown text) of each option of a select, as the page is written."""
    body = re.search(rf'<select id="sel-{name}".*?</select>', html, re.S).group(0)
    out = []
    for attrs, text in re.findall(r"<option ([^>]*)>([^<]*)</option>", body):
        label = html_lib.unescape(re.search(r'data-label="([^"]*)"', attrs).group(1))
        out.append((label, 'class="nofit"' in attrs, " selected" in attrs, html_lib.unescape(text)))
    return out


def _element(html: str, tag: str, id_: str) -> str:
    m = re.search(rf'<{tag}\b[^>]*\bid="{id_}"[^>]*>(.*?)</{tag}>', html, re.S)
    assert m, id_
    return html_lib.unescape(m.group(1))


def test_without_javascript_the_page_shows_the_default_answer(repo_site):
    """The choice selected in the page as written, and its answer written into it: what resolve prints."""
    html = repo_site[1]["index.html"].decode()
    names = [name for name, _label in render.SELECT_NAMES]
    data = page_data(html)
    chosen = []
    for name in names:
        (pos,) = [i for i, (_l, _g, selected, _t) in enumerate(_options_html(html, name)) if selected]
        chosen.append(pos)
    argv = [a for k, i in enumerate(chosen) for a in data["selects"][k][i]["argv"]]
    code, out, err = resolver(REPO)(argv)
    assert code != 33 and any(line.startswith(FIT_HEADS) for line in err)  # the default names a fit
    assert _element(html, "pre", "fk-out").splitlines() == out
    assert _element(html, "pre", "fk-err").splitlines() == err
    assert _element(html, "code", "fk-cmd") == " ".join(["flashkit", "resolve", *argv])
    assert _element(html, "p", "fk-verdict") == render.EXITS[code]
    hidden = re.search(r'<div id="fk-install"[^>]*>', html).group(0) != '<div id="fk-install">'
    assert hidden == (not out)
    assert '<fieldset id="fk-fields" disabled>' in html  # until the script runs: without it they do nothing


def test_greyed_options_are_those_resolve_fits_nothing_with(repo_site):
    """An option is marked "(no fit)" in the page as written exactly when resolve, asked for it with the
    other selects at the default, exits 33 (the chosen one is not: the answer says it); every option stays
    selectable."""
    html = repo_site[1]["index.html"].decode()
    data = page_data(html)
    resolve = resolver(REPO)
    names = [name for name, _label in render.SELECT_NAMES]
    written = {name: _options_html(html, name) for name in names}
    default = [next(i for i, o in enumerate(written[name]) if o[2]) for name in names]
    greyed_somewhere = 0
    for k, name in enumerate(names):
        for i, (label, greyed, _selected, text) in enumerate(written[name]):
            other = [*default[:k], i, *default[k + 1 :]]
            argv = [a for j, n in enumerate(other) for a in data["selects"][j][n]["argv"]]
            assert greyed == (i != default[k] and resolve(argv)[0] == 33), argv
            assert text == label + (render.NOFIT_SUFFIX if greyed else "")
            greyed_somewhere += greyed
    assert greyed_somewhere and "disabled" not in re.search(r"<select .*?>", html).group(0)


def test_the_cuda_options_are_what_torch_reports(repo_site):
    """The CUDA select offers torch.version.cuda of PyPI's wheels and PyTorch's index for the matrix's torch
    series, and what each env's lockfile pins: PyPI's torch 2.7.1 reports 12.6, and that user finds a fit."""
    from flashkit.plan import compat

    data = page_data(repo_site[1]["index.html"].decode())
    cudas = {o["label"] for o in data["selects"][1]}
    assert {"CUDA 12.6", "CUDA 12.8", "CUDA 12.9", "CUDA 13.0"} <= cudas
    assert f"CUDA {compat.TORCH_DEFAULT_CUDA['2.7']}" == "CUDA 12.6"
    seed = ["--torch", "2.7.1", "--cuda", "12.6", "--python", "3.11"]
    (flat,) = [flat for flat, _idx, argv in _choices(data) if argv == seed]
    code, out, err = page_answer(data, flat)
    # Verified (exit 35 until a publication is recorded: then its URL, tests/test_publish_wheels.py).
    assert code == 35 and out == [] and "verified, not published: cu124-torch27" in "\n".join(err)


def test_url_parameters_name_each_option_once(repo_site):
    data = page_data(repo_site[1]["index.html"].decode())
    for k, opts in enumerate(data["selects"]):
        params = [tuple(o["param"]) if o["param"] else None for o in opts]
        assert len(set(params)) == len(params), params
        assert (params.count(None) == 1) == (k == 3)  # only the ABI has a default without a parameter


def test_the_matrix_says_verified_and_each_envs_gpu_code(repo_site):
    from flashkit.doctor import repo as repo_facts

    html = repo_site[1]["index.html"].decode()
    facts = repo_facts.load(REPO)
    rows = re.findall(r'<th scope="row" class="env"><a href="evidence.html#([^"]+)">.*?</th>\s*'
                      r'<td class="verified (yes|no)"[^>]*>(yes|no)</td>', html, re.S)  # fmt: skip
    assert len(rows) == len(facts.specs)
    for env, cls, text in rows:
        assert cls == text == ("yes" if facts.verification[env].verified else "no"), env
    assert {text for _e, _c, text in rows} == {"yes", "no"}
    assert "sm_80, sm_90a; no PTX" in html and "glibc &gt;= 2.35" in html and "x86_64" in html
    assert "Ubuntu 22.04" in html  # the floor the abi tier holds every build to
    assert "compute capability 8.0, 8.6, 8.7, 8.9, 9.0" in _element(html, "ul", "runs-on")


def test_the_symptom_leads_to_doctor(repo_site):
    html = repo_site[1]["index.html"].decode()
    line = _element(html, "p", "symptom")
    assert "undefined symbol" in line and "flashkit doctor" in line


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
    for value in (j.verdict.id, j.verdict.subject.digest, j.verdict.date, j.verdict.host["gpu"]):
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
    from flashkit.resolve import text as resolve_text

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
    assert {answer[0] for answer in data["answers"]} == {SpecError.exit_code}  # as resolve says each time


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
