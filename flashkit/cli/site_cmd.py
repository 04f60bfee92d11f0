"""`flashkit site --out DIR`: the install page, from the ledger, the specs, the lockfiles and the benchmarks."""

from __future__ import annotations

from pathlib import Path

from flashkit.cli.common import root, say
from flashkit.core import outputs
from flashkit.core.errors import SpecError
from flashkit.ledger import gate, store
from flashkit.plan.specfile import env_ids


def run(args) -> int:
    from flashkit.site import render  # jinja2 and the templates only for this command

    r = root(args)
    outputs.check_path(args.out, flag="--out")  # before the work; write_site checks the folder itself again
    pub = Path(args.with_publication) if args.with_publication else None
    files, broken, uncharted = render.site(r, args.policy, pub)
    render.write_site(Path(args.out), files)
    size = sum(len(b) for b in files.values())
    say(f"flashkit site: {len(files)} files, {size / 1024:.0f} KiB, in {args.out} (open index.html)")
    for why in broken.values():
        say(f"left out, its spec does not validate: {why}")
    unreadable = store.unreadable(r, [e for e in env_ids(r) if e not in broken])
    for env, exc in unreadable.items():
        say(f"{env}: its row has no verdicts, the ledger is unreadable: {exc}")
    for problem in uncharted:
        say(f"not charted: {problem}")
    # The page is written from the rest, but it is not whole: the exit code says why, as resolve, matrix,
    # results and `ledger show` say it (a spec or a benchmark result: 3; a ledger: its own code, 14 or 34).
    codes = [SpecError.exit_code] * bool(broken or uncharted) + [exc.exit_code for exc in unreadable.values()]
    return min(codes, default=0)


def register(sub) -> None:
    p = sub.add_parser(
        "site",
        help="write the install page (static HTML: selector, matrix with evidence, benchmarks) to a folder",
        description="Write a static site from this checkout's ledger, env specs, lockfiles and benchmark results: "
        "an install selector that shows what `flashkit resolve` prints for each choice, the matrix with each "
        "tier's verdict linked to its evidence, and the latest benchmarks. No server, no CDN; the same "
        "checkout gives the same bytes. DIR is replaced whole; a folder that this command did not write is refused, "
        "as is one under /proc, /sys or /dev or inside a git directory (exit 2). An env whose spec does not "
        "validate (exit 3) or whose ledger does not read (exit 14, or 34 for a device-code relation that does not "
        "hold) is named, and the page is made from the others; so is a benchmark result that does not read "
        "(exit 3), whose chart is left out.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (replaced whole)")
    p.add_argument("--policy", default=gate.DEFAULT_POLICY, help="tiers that must have passed, as for resolve")
    p.add_argument(
        "--with-publication",
        metavar="PUBDIR",
        help="serve this `flashkit publish-wheels` folder beside the page (checked against the ledger first)",
    )
    p.set_defaults(run=run)
