"""What the install-page tests share: a checkout whose ledger and benchmark results carry markup in every
field that reaches the page, and the answers `flashkit resolve` gives, in-process, for any choice."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from kitsupport import CHECK_COUNTS, SUITE_COUNTS, artifact, digest

# Markup that runs if it is ever inserted as HTML: a script element, an event handler, an entity, quotes.
PAYLOAD = '<script>window.__fk_pwned=1</script><img src=x onerror="window.__fk_pwned=2">&amp;\''
ENV = "cu130-torch211"


def hostile_checkout(root: Path) -> None:
    """Facts at ``root``'s current input hash of ENV with PAYLOAD in every free-text field the page shows
    (a verdict's reasons, each host fact and its context; a publication's policy and attestation
    predicate), and a benchmark result with it in every string and in a shape field."""
    from flashkit.core.names import Tier, Verdict
    from flashkit.ledger import store
    from flashkit.ledger.model import Publication, VerdictFact
    from flashkit.plan.plan import load_plan

    h = load_plan(root, ENV).input_hash
    art = artifact(ENV, h)
    host = {k: PAYLOAD for k in ("gpu", "capability", "torch", "torch_cuda", "cuda_runtime", "driver", "hostname")}
    verdicts = [
        VerdictFact(
            env=ENV,
            input_hash=h,
            date="2026-12-01T00:00:00+00:00",
            tier=Tier(t),
            verdict=Verdict.PASSED,
            subject=art.subject(Tier(t).subject),
            counts=dict(SUITE_COUNTS if Tier(t).runs_a_suite else CHECK_COUNTS),
            reasons=(PAYLOAD,),
            duration_s=1.0,
            host=host,
            source="build-host",
            context={"image_id": art.image_id, "note": PAYLOAD},
            evidence={"junit_sha256": "0" * 64},  # digests only: the schema refuses any other text there
        )
        for t in ("build", "abi", "cpu", "artifact-gpu")
    ]
    pub = Publication(
        env=ENV, input_hash=h, date="2026-12-02T00:00:00+00:00", target="registry.example:5000/org/flash",
        digest=digest("manifest"), tags=("torch2.11-cu13.0",), judged_image_id=art.image_id,
        published_image_id=art.image_id, policy=PAYLOAD, verified_tiers=("build",), verdict_ids=(verdicts[0].id,),
        reused=False,
        attestation={"digest": digest("att"), "tag": "sha256-att", "key_id": "0" * 16, "predicate_types": [PAYLOAD]},
    )  # fmt: skip
    store.append(root, ENV, [art, *verdicts, pub])
    bench = root / "benchmarks" / "results" / "hostile"
    bench.mkdir(parents=True)
    row = {"impl": PAYLOAD, "mode": PAYLOAD, "head_dim": PAYLOAD, "seqlen": 1, "batch": 1, "nheads": 1, "tflops": 1.0}
    (bench / "attention_hostile.json").write_text(
        json.dumps({"attention": [row], "command": PAYLOAD, "device": PAYLOAD, "torch": PAYLOAD, "dtype": PAYLOAD})
    )


def resolve_in_process(root: Path, argv: list[str]) -> tuple[int, list[str], list[str]]:
    """`flashkit --repo ROOT resolve ARGV`, run by the CLI's own entry point: exit code, stdout and stderr lines."""
    from flashkit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--repo", str(root), "resolve", *argv])
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


def resolver(root: Path):
    """``argv -> (exit, stdout lines, stderr lines)`` of `flashkit resolve`, its facts read once: the command's
    own text (:func:`flashkit.resolve.text.answer`) for a thousand choices in seconds, where the CLI
    reads the checkout again for each. Tests check a sample of choices against the CLI itself."""
    from flashkit.doctor import repo as repo_facts
    from flashkit.ledger import gate
    from flashkit.resolve import text as resolve_text

    facts = repo_facts.load(root, gate.DEFAULT_POLICY)
    policy = gate.parse_policy(gate.DEFAULT_POLICY).describe()

    def run(argv: list[str]) -> tuple[int, list[str], list[str]]:
        flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        abi = True if "--cxx11-abi" in argv else False if "--no-cxx11-abi" in argv else None
        q = resolve_text.parse_query(
            flags["--torch"], cuda=flags.get("--cuda"), rocm=flags.get("--rocm"), python=flags["--python"],
            cxx11_abi=abi,
        )  # fmt: skip
        text = resolve_text.answer(facts, q, policy)[1]
        return text.exit_code, list(text.stdout()), list(text.stderr())

    return run


def page_answer(data: dict, flat: int) -> tuple[int, list[str], list[str]]:
    """What the page's data holds for choice number ``flat``, read back as the page reads it."""
    from flashkit.site import selector

    shown = selector.shown(data, selector.indices(data, flat))
    return shown.code, list(shown.out), list(shown.err)


def page_data(html: str) -> dict:
    """The answers a written page carries (its JSON block)."""
    import re

    m = re.search(r'<script type="application/json" id="fk-answers">(.*?)</script>', html, re.S)
    assert m, "the page carries no answers"
    return json.loads(m.group(1))


def published_checkout(dest: Path) -> Path:
    """A copy of this checkout's envs, lockfiles, template, kernel sources and ledgers in which every env verified
    at its current input hash has its wheel published (a wheel-publication fact at https://flash.example/): the
    page and resolve as a publication makes them, with the commands a user copies."""
    import shutil

    from kitsupport import REPO, wheel_publication

    from flashkit.doctor import repo as repo_facts
    from flashkit.ledger import store

    for d in ("envs", "lockfiles", "templates", "flash_kernels", "verified", "benchmarks"):
        shutil.copytree(REPO / d, dest / d, ignore=shutil.ignore_patterns("*.lock", "__pycache__", "build"))
    facts = repo_facts.load(dest)
    for env, v in sorted(facts.verification.items()):
        cov = facts.requirements.get(env)
        if not v.verified or cov is None or not cov.covered:
            continue
        art = max(store.load(dest, env).artifacts(v.input_hash), key=lambda a: a.date)
        store.append(dest, env, [wheel_publication(art, pythons=cov.covered)])
    return dest
