"""Write the install page: read the checkout once, render the templates, replace the output folder whole.

The same checkout gives the same bytes: nothing here reads a clock, a host name or the order of a folder
listing, and the JSON is written with sorted keys. Every value reaches the page through Jinja2's
autoescaping (HTML) or as JSON inside a ``<script type="application/json">`` block, in which ``<``, ``>``
and ``&`` are written as ``\\u003c`` ... so a ledger value cannot end the block; the page's script shows
values only as text. So a verdict's reason reading ``<script>`` is shown, never run.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jinja2
import markupsafe

from flashkit.core import outputs
from flashkit.core.errors import FlashkitError, NoVerifiedFit, SpecError, UsageError
from flashkit.core.names import TIER_ORDER
from flashkit.doctor import repo as repo_facts
from flashkit.ledger import gate, store
from flashkit.site import evidence, plots, publication, selector, targets

MARKER = ".flashkit-site"  # in every folder this command writes: the one kind of folder it replaces
SELECT_NAMES = (("torch", "torch"), ("accel", "CUDA or ROCm"), ("python", "Python"), ("abi", "C++ ABI"))
EXITS = {
    0: "A verified build fits.",
    NoVerifiedFit.exit_code: "No verified build fits this choice (resolve exits 33).",
    SpecError.exit_code: "An env spec does not validate, so this answer may be incomplete (resolve exits 3).",
    35: "A verified build fits, but nothing is published yet.",
}
NOFIT_SUFFIX = " (no fit)"  # after an option that, with the other choices as they are, fits nothing


def json_for_script(data: object) -> str:
    """JSON that is safe inside an HTML script block whatever the strings in it hold (so the template may
    insert it as it is: entities are not decoded inside a script element)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _newest_fact(root: Path, envs: list[str]) -> str:
    dates = []
    for env in envs:
        try:
            dates += [f.date for f in store.load(root, env).facts]
        except FlashkitError:  # an unreadable ledger is a note on its row, not a page that cannot be made
            continue
    return max(dates, default="none")


def pages(root: Path, policy_text: str | None = None) -> dict[str, bytes]:
    """Every file of the site, by its path in the folder."""
    return site(root, policy_text)[0]


def site(
    root: Path, policy_text: str | None = None, with_publication: Path | None = None
) -> tuple[dict[str, bytes], dict[str, str], tuple[str, ...]]:
    """Every file of the site, the specs that do not validate (env -> why) and the benchmark results that do
    not read (a line each): the page is made from the rest, and says so, as resolve does. ``with_publication``:
    a publication folder to serve beside the page, checked against the ledger (:mod:`flashkit.site.publication`)."""
    policy = gate.parse_policy(policy_text)
    facts = repo_facts.load(root, policy_text)
    if facts.problem is not None or facts.specs is None:
        problem = facts.problem
        raise SpecError(problem.what if problem else "no env specs", hint=problem.fix if problem else None)
    data = selector.selector_data(facts, policy.describe())
    data["exits"] = {str(k): v for k, v in EXITS.items()}
    data["nofit_suffix"] = NOFIT_SUFFIX
    initial = selector.initial(data)
    greyed = selector.greyed(data, initial)
    first = selector.shown(data, initial)  # written into the page: what it shows without JavaScript
    envs = targets.env_targets(facts)
    rows = evidence.rows(root)
    charts, chart_problems = plots.charts(root)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("flashkit.site", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    common = {
        "policy": policy.describe(),
        "newest_fact": _newest_fact(root, [r.env for r in rows]),
        "rows": rows,
        "tiers": [t.value for t in TIER_ORDER],
        "envs": envs,
    }
    selects = [
        {"name": name, "label": label, "options": opts, "initial": initial[k], "greyed": greyed[k]}
        for k, ((name, label), opts) in enumerate(zip(SELECT_NAMES, data["selects"], strict=True))
    ]
    index = env.get_template("index.html.j2").render(
        **common,
        selects=selects,
        nofit_suffix=NOFIT_SUFFIX,
        shown=first,
        verdict=EXITS.get(first.code, f"resolve exits {first.code}."),
        platform=targets.summary(envs),
        answers_json=markupsafe.Markup(json_for_script(data)),
        charts=charts,
        chart_problems=chart_problems,
    )
    out = {
        "index.html": index.encode(),
        "evidence.html": env.get_template("evidence.html.j2").render(**common).encode(),
        MARKER: b"written by `flashkit site`; the command replaces this folder whole\n",
    }
    if with_publication is not None:
        served = publication.files_of(with_publication, facts.wheel_publications)
        clash = sorted(set(served) & set(out))
        if clash:
            raise UsageError(f"--with-publication {with_publication}: {', '.join(clash)} would replace the page's own")
        out |= served
    static = resources.files("flashkit.site") / "static"
    for name in ("site.css", "select.js", "favicon.svg"):
        out[f"assets/{name}"] = (static / name).read_bytes()
    return out, dict(facts.broken), chart_problems


def write_site(out: Path, files: dict[str, bytes]) -> None:
    """Put ``files`` at ``out`` all at once: written in a sibling folder, then swapped with the old site.

    ``out`` follows the rule of every output folder (:mod:`flashkit.core.outputs`): absent, empty, or a
    folder this command wrote (it has the marker); never under /proc, /sys, /dev or inside a git directory.
    """
    outputs.write_folder(
        out, files, flag="--out", ours=lambda d: (d / MARKER).is_file(), what=f"`flashkit site` wrote (with {MARKER})"
    )
