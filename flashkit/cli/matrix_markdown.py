"""`flashkit matrix --format markdown`: the matrix as the documentation shows it.

Made from the same rows as the terminal table (specs, plans, the ledger at each env's current input hash), so
the docs say what `flashkit matrix` says. It holds nothing that changes from one run to the next: no time of
writing, only facts of the checkout and its ledger. A summary line (for the README) and a table with one line
per verified env saying where its GPU evidence comes from (for docs/verification.md).
"""

from __future__ import annotations

from flashkit.core.names import TIER_ORDER
from flashkit.ledger.gate import DEFAULT_POLICY, POLICIES
from flashkit.plan.matrix import MatrixRow

COLUMNS = ("env", "torch", "Python", *(t.value for t in TIER_ORDER), "wheel", "verified")


def cell(mark: str | None) -> str:
    """A tier's verdict in words: how a passed verdict reaches the build, when not by its own digest."""
    if not mark:
        return "-"
    verdict, _, how = mark.partition("(")
    how = how.rstrip(")")
    verdict = verdict.replace("-", " ")
    if not how:
        return verdict
    kind, _, other = how.partition(":")
    said = {
        "applies": f"`{other}`'s wheel" if other else "a bit-identical wheel",
        "same-wheel": f"this wheel, judged at `{other}`",
        "device-code": f"the same device code, run by `{other}`",
    }.get(kind, how)
    return f"{verdict} ({said})"


def missing(r: MatrixRow) -> list[str]:
    """The default policy's requirements no verdict of the env's latest build meets."""
    return [
        " or ".join(t.value for t in group)
        for group in POLICIES[DEFAULT_POLICY]
        if not any(r.tiers.get(t.value, "").startswith("passed") for t in group)
    ]


def standing(r: MatrixRow) -> tuple[str, str]:
    """Where the env stands, as (a key the summary groups by, the words the table shows)."""
    if r.verdict == "invalid":
        return "invalid", "no: the spec does not validate"
    if r.verdict == "rejected":
        return "rejected", f"no: rejected by {r.reasons[0].split(':')[0]}"
    if r.status.startswith("unknown"):
        return "unknown", "unknown: the ledger does not read"
    if r.verified:
        return "verified", "yes"
    if not r.hosts.startswith("build"):
        return "unbuildable", f"no: {r.hosts} on this project's hosts"
    if not r.wheel:
        return "unbuilt", "no: not built at this input hash"
    return "waiting", f"no: needs {', '.join(missing(r)) or 'the gate'}"


def table(rows: list[MatrixRow]) -> list[str]:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        wheel = f"`+{r.wheel_local}`" if r.wheel_local else ("yes" if r.wheel else "-")
        tiers = [cell(r.tiers.get(t.value)) for t in TIER_ORDER]
        cells = [f"`{r.env}`", r.torch.split("+")[0], r.python, *tiers, wheel, standing(r)[1]]
        out.append("| " + " | ".join(cells) + " |")
    return out


def gpu_lines(rows: list[MatrixRow]) -> list[str]:
    """Where each verified env's GPU verdict comes from: the GPU, torch, driver, wheel and date it names."""
    return [f"- `{r.env}`: {r.gpu_how}" for r in rows if r.verified and r.gpu_how]


def summary(rows: list[MatrixRow]) -> str:
    """One paragraph: the verified envs by name, then how many of the others stand where, and why."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        groups.setdefault(standing(r)[0], []).append(f"`{r.env}`")
    verified = groups.pop("verified", [])
    head = f"Verified at their current input hashes: {', '.join(verified) or 'none'} ({len(verified)} of {len(rows)} envs)."
    words = (
        ("waiting", "built, waiting for evidence"),
        ("unbuilt", "not built at their current input hashes"),
        ("unbuildable", "not buildable on this project's hosts"),
        ("rejected", "rejected by a rule"),
        ("invalid", "specs that do not validate"),
        ("unknown", "ledgers that do not read"),
    )
    # Few envs are named; many are counted (the table names them all).
    rest = [
        f"{label}: {', '.join(groups[k]) if len(groups[k]) <= 2 else len(groups[k])}"
        for k, label in words
        if k in groups
    ]
    return head + (f" The others: {'; '.join(rest)}." if rest else "")


def markdown(rows: list[MatrixRow]) -> str:
    """The whole of `flashkit matrix --format markdown`: the summary, the table and the GPU evidence."""
    gpu = gpu_lines(rows)
    evidence = ["", "Where the GPU verdict of each verified env comes from:", "", *gpu] if gpu else []
    return "\n".join([summary(rows), "", *table(rows), *evidence]) + "\n"
