"""`flashkit results`: the latest result of each benchmark under benchmarks/results, with its headline.

Read from the front matter of each result folder's README and from the result files it names
(:mod:`flashkit.site.results`); ``--format markdown`` is the table docs/performance.md shows.
"""

from __future__ import annotations

import json

from flashkit.cli.common import root
from flashkit.site import results
from flashkit.site.results import Result


def table(found: list[Result], linked: bool = False) -> list[str]:
    """The markdown table: one row per result, its folder as a path (the docs site does not carry the
    results), or ``linked`` as a link relative to benchmarks/results (that folder's own README)."""
    out = ["| benchmark | result | date | code | machine | headline |", "|---|---|---|---|---|---|"]
    for r in found:
        name = r.folder.rsplit("/", 1)[-1]
        where = f"[{name}/]({name}/)" if linked else f"`{r.folder}/`"
        cells = (r.benchmark, where, r.date, r.code, r.machine, r.headline or "in its README")
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def bullets(found: list[Result]) -> list[str]:
    """The short form the README shows: benchmark, headline, machine and date."""
    return [f"- **{r.benchmark}** ({r.machine}, {r.date}): {r.headline}" for r in found if r.headline]


def markdown(found: list[Result], linked: bool = False) -> str:
    return "\n".join(table(found, linked)) + "\n"


def text(found: list[Result]) -> str:
    lines = []
    for r in found:
        lines += [f"{r.benchmark} [{r.area}]", f"  {r.folder}/  {r.date}  {r.code}  {r.machine}"]
        lines += [f"  {r.headline}"] if r.headline else []
        lines += [f"  command: {r.command}"]
    return "\n".join(lines) + "\n"


def cmd_results(args) -> int:
    found = results.every_result(root(args))
    if not args.all:
        found = results.latest(found)
    if args.area:
        found = [r for r in found if r.area == args.area]
    if args.format == "json":
        print(json.dumps([r.to_json() for r in found], indent=2, sort_keys=True))
    else:
        print(markdown(found) if args.format == "markdown" else text(found), end="")
    return 0


def register(sub) -> None:
    s = sub.add_parser(
        "results",
        help="the latest result of each benchmark in benchmarks/results: date, code, machine, headline (--format markdown)",
    )
    s.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    s.add_argument("--all", action="store_true", help="every result folder, not only the latest of each benchmark")
    s.add_argument("--area", choices=results.AREAS, help="only the results of this area")
    s.set_defaults(run=cmd_results)
