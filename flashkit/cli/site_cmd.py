"""`flashkit site --out DIR`: the install page, from the ledger, the specs, the lockfiles and the benchmarks."""

from __future__ import annotations

from pathlib import Path

from flashkit.cli.common import root, say
from flashkit.core.errors import SpecError
from flashkit.ledger import gate


def run(args) -> int:
    from flashkit.site import render  # jinja2 and the templates only for this command

    pub = Path(args.with_publication) if args.with_publication else None
    files, broken = render.site(root(args), args.policy, pub)
    render.write_site(Path(args.out), files)
    size = sum(len(b) for b in files.values())
    say(f"flashkit site: {len(files)} files, {size / 1024:.0f} KiB, in {args.out} (open index.html)")
    for why in broken.values():
        say(f"left out, its spec does not validate: {why}")
    # The page is written from the other envs, but it is not the whole matrix: exit 3, as resolve and matrix.
    return SpecError.exit_code if broken else 0


def register(sub) -> None:
    p = sub.add_parser(
        "site",
        help="write the install page (static HTML: selector, matrix with evidence, benchmarks) to a folder",
        description="Write a static site from this checkout's ledger, env specs, lockfiles and benchmark results: "
        "an install selector that shows what `flashkit resolve` prints for each choice, the matrix with each "
        "tier's verdict linked to its evidence, and the latest benchmarks. No server, no CDN; the same "
        "checkout gives the same bytes. DIR is replaced whole; a folder that this command did not write is refused.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (replaced whole)")
    p.add_argument("--policy", default=gate.DEFAULT_POLICY, help="tiers that must have passed, as for resolve")
    p.add_argument(
        "--with-publication",
        metavar="PUBDIR",
        help="serve this `flashkit publish-wheels` folder beside the page (checked against the ledger first)",
    )
    p.set_defaults(run=run)
