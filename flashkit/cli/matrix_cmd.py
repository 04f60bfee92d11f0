"""`flashkit matrix`: every env at its current input hash, in 80 columns; ``--wide`` and ``--json`` for details.

The default answers "what can I use" at a glance (per env: each tier's verdict, the wheel's local version,
the published tags) in a plain table that fits an 80-column terminal, abbreviating where it must.
``--wide`` adds the rules, lock state, base, host support and the Pythons covered; ``--json`` has it all.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flashkit.cli import matrix_markdown
from flashkit.cli.common import root, say
from flashkit.core.errors import FlashkitError, LockError
from flashkit.core.names import TIER_ORDER
from flashkit.ledger import gate, store
from flashkit.plan import matrix, production
from flashkit.plan.plan import Plan, plan_of
from flashkit.plan.specfile import load_each

WIDTH = 80
MARK = {"passed": "P", "failed": "F", "not-run": "-", "error": "E"}
LEGEND = (
    "tiers at the current input hash: build abi cpu gpu artifact-gpu triton-aot",
    "  P passed  F failed  - not run  E error  . no verdict  ? ledger unreadable",
    "wheel local version, shortened: +cu130t2.11-cxx11 = +cu130torch2.11cxx11abitrue",
)
# Said only when a row shows a stable-ABI wheel, whose label is short enough to show whole.
STABLE_LEGEND = "  +cu13stable2.10 = stable ABI: one wheel for torch >= 2.10, CUDA 13 (cu12…: 12)"


def short_local(local: str) -> str:
    """The wheel's local version in fewer characters, every part of it still there. A stable-ABI label
    (cu13stable2.10: CUDA major, oldest torch) has no torch minor or cxx11 flag to shorten and stays whole."""
    return local.replace("torch", "t").replace("cxx11abitrue", "-cxx11").replace("cxx11abifalse", "-precxx11")


def matrix_rows(r: Path, unreadable: dict[str, FlashkitError]) -> list[matrix.MatrixRow]:
    """Every env's row, in id order; a spec that does not validate is a row with its error, and a ledger that
    does not read a row that says so (its error in ``unreadable``)."""
    specs, broken = load_each(r)
    rows = [matrix.invalid_row(env, str(exc)) for env, exc in broken.items()]
    for spec in specs:
        try:
            plan: Plan | None = plan_of(r, spec)
        except LockError:
            plan = None
        try:
            prod = production.read(r, spec)
            prod_problems = tuple(production.check(spec, prod))
        except LockError as exc:
            prod, prod_problems = production.Production({}), (str(exc).splitlines()[0],)
        status, seen = "not verified", None
        if plan is not None:
            try:
                ledger = store.load(r, str(spec.id))
                s = gate.summary(ledger, plan.input_hash, spec.gpu_evidence)
                status = s.status
                decision = gate.latest_decision(ledger, plan.input_hash, gate.parse_policy(None), spec.gpu_evidence)
                seen = matrix.LedgerView(s.tiers, s.wheel, s.published, s.device_code, s.gpu_how, bool(decision))
            except FlashkitError as exc:  # a broken ledger must not hide the matrix; say so instead
                status = f"unknown (ledger unreadable: {str(exc).splitlines()[0]})"
                unreadable[str(spec.id)] = exc
        cov = production.coverage(spec, prod)
        rows.append(matrix.row(spec, plan, status, cov, prod_problems, seen))
    return sorted(rows, key=lambda row: row.env)


def fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, an ellipsis marking a cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def tiers_cell(r: matrix.MatrixRow) -> str:
    if r.status.startswith("unknown") or r.verdict == "invalid":
        return "?" * len(TIER_ORDER)
    return "".join(MARK.get(r.tiers.get(t.value, "").split("(")[0], ".") for t in TIER_ORDER)


def published_cell(tags: tuple[str, ...], width: int) -> str:
    if not tags:
        return "-"
    more = f" +{len(tags) - 1}" if len(tags) > 1 else ""
    return fit(tags[0], width - len(more)) + more


# (header, width) of each column; the last takes what is left of WIDTH.
COLUMNS = (("env", 20), ("torch", 7), ("py", 4), ("tiers", 6), ("wheel local version", 20), ("published", 0))


def compact(rows: list[matrix.MatrixRow]) -> list[str]:
    """The 80-column table, its legend, and one line for each env that needs a word more."""
    last = WIDTH - sum(w + 1 for _, w in COLUMNS[:-1])

    def line(cells: list[str]) -> str:
        widths = [w for _, w in COLUMNS[:-1]] + [last]
        return " ".join(fit(c, w).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line([h for h, _ in COLUMNS])]
    notes = []
    for r in rows:
        torch = r.torch.split("+")[0]
        wheel = f"+{short_local(r.wheel_local)}" if r.wheel_local else ("(no local)" if r.wheel else "-")
        out.append(line([r.env, torch, r.python, tiers_cell(r), wheel, published_cell(r.published, last)]))
        if r.verdict == "invalid":
            notes.append(f"{r.env}: {r.status}")
        elif r.verdict == "rejected":
            notes.append(f"{r.env}: rejected by {r.reasons[0].split(':')[0]}")
        elif r.status.startswith("not verified at this input hash"):
            notes.append(f"{r.env}: verdicts only at older input hashes")
        elif r.status.startswith("unknown"):
            notes.append(f"{r.env}: {r.status}")
    out += list(LEGEND)
    if any("stable" in (r.wheel_local or "") for r in rows):
        out.append(STABLE_LEGEND)
    out += [fit(n, WIDTH) for n in notes]
    out.append("details: flashkit matrix --wide (or --json)")
    return out


def wide(rows: list[matrix.MatrixRow], verbose: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="flashkit matrix")
    cols = ("env", "torch", "accelerator", "py", "abi", "compiler", "base", "verdict", "lock", "pythons", "here")
    for col in (*cols, "status"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        verdict = "[green]accepted[/]" if r.verdict == "accepted" else f"[red]{r.verdict}[/]"
        color = {"pinned": "green", "local": "cyan", "unpinned": "yellow"}[r.pin_state]
        base = f"{r.base.split(':', 1)[0]} [{color}]{r.pin_state}[/]"
        cells = (r.env, r.torch, r.accelerator, r.python, r.abi, r.compiler.split()[0], base, verdict, r.lock)
        table.add_row(*cells, r.pythons, r.hosts, r.status)
    # Wide by request: the table is not cut to the terminal (a pager or a file takes it whole).
    console = Console(width=max(230, shutil.get_terminal_size().columns))
    console.print(table)
    for r in rows:
        if r.error:
            console.print(
                f"[bold]{r.env}[/]: [red]spec invalid[/]\n  " + r.error.replace("\n", "\n  "), highlight=False
            )
            continue
        console.print(f"[bold]{r.env}[/]: {r.base}; {r.hosts_why}", highlight=False)
        if r.wheel or r.published:
            tags = ", ".join(r.published) or "none"
            console.print(f"  wheel {r.wheel or '-'}; published tags: {tags}", highlight=False, soft_wrap=True)
        console.print(f"  gpu evidence accepted: {', '.join(r.gpu_evidence)}", highlight=False)
        if r.device_code:
            console.print(f"  device code {r.device_code}", highlight=False)
        if r.gpu_how and r.input_hash and r.wheel:
            console.print(f"  {r.gpu_how}", highlight=False, soft_wrap=True)
        for reason in r.reasons:
            console.print(f"  [red]rejected[/] by {reason}", highlight=False)
        req = r.requirements
        if req["covered"]:
            console.print(f"  requirements: {req['file']} covers Python {', '.join(req['covered'])}", highlight=False)
        for py, why in req["not_covered"].items():
            console.print(f"  [yellow]Python {py} not covered[/]: {why}", highlight=False)
        if verbose:
            for rule_id, ok, why in r.rules:
                if ok:
                    console.print(f"  [green]accepted[/] by {rule_id}: {why}", highlight=False)


def cmd_matrix(args) -> int:
    unreadable: dict[str, FlashkitError] = {}
    rows = matrix_rows(root(args), unreadable)
    # A broken spec (3) is more fundamental than a rule's rejection (4), as in `flashkit validate`, and both
    # than a ledger that does not read (its own code, as `flashkit ledger show` exits: 14, or 34).
    codes = [3] * any(r.verdict == "invalid" for r in rows) + [4] * any(r.verdict == "rejected" for r in rows)
    code = min(codes + [exc.exit_code for exc in unreadable.values()], default=0)
    if args.json or args.format == "json":
        print(json.dumps([r.to_json() for r in rows], indent=2, sort_keys=True))
    elif args.format == "markdown":
        print(matrix_markdown.markdown(rows), end="")
    elif args.wide or args.verbose:
        wide(rows, args.verbose)
    else:
        print("\n".join(compact(rows)))
    for r in rows:
        if r.error:
            say(r.error)
    for env, exc in unreadable.items():
        say(f"{env}: ledger unreadable: {exc}")
    return code


def register(sub) -> None:
    s = sub.add_parser(
        "matrix",
        help="every env at its current input hash: tier verdicts, wheel, published tags (80 columns; --wide, --json)",
    )
    s.add_argument("--json", action="store_true", help="machine-readable output, every detail (= --format json)")
    s.add_argument(
        "--format",
        choices=("text", "json", "markdown"),
        default="text",
        help="text (the 80-column table, or --wide), json, or markdown (the table the docs show)",
    )
    s.add_argument(
        "--wide", action="store_true", help="also rules, lock state, base, host support and the Pythons covered"
    )
    s.add_argument("-v", "--verbose", action="store_true", help="--wide, and why every rule accepts each env")
    s.set_defaults(run=cmd_matrix)
