"""The requirement files a publication serves: what one command installs, and what the CPU tier adds.

Per env and Python, two files, both hash-pinned and rendered for the publication's URLs (the committed
lockfiles stay location-free):

- the production file: torch and everything it needs, the kernel wheel's own requirements, and the verified
  ``flash-kernels`` wheel itself, pinned by the sha256 the ledger judged. Its one option line names the index
  that serves the wheel (``--extra-index-url``: torch keeps coming from the index the user's pip already
  uses, a mirror or PyPI; the hashes make the source irrelevant to what gets installed);
- the test file: what only the kernel suite's CPU tier needs besides (pytest and its own needs, the Triton
  interpreter's numpy), installed after the production file.

Both are cut from the env's per-Python runtime set (the set its image's tiers ran with) by
:func:`flashkit.plan.production.split`. Pure: the same inputs give the same bytes.
"""

from __future__ import annotations

import dataclasses

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from flashkit.core.errors import LockError
from flashkit.plan import lock, production

PROJECT = "flash-kernels"


@dataclasses.dataclass(frozen=True)
class Pair:
    production: str
    test: str


def check_wheel_requirements(env: str, python: str, wheel_requires: tuple[str, ...], pins: dict[str, lock.Pin]) -> None:
    """Every requirement of the wheel (its Requires-Dist, markers evaluated for ``python`` on Linux) is met by a
    pin of the set: pip in hash-checking mode installs nothing that is not pinned, so an unmet one fails there."""
    marker_env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}
    marker_env |= {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    for text in wheel_requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({**marker_env, "extra": ""}):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None or not req.specifier.contains(pin.version, prereleases=True):
            got = f"pins {pin.name}=={pin.version}" if pin else f"does not pin {req.name}"
            raise LockError(
                f"{env}: the wheel requires {text}, but the Python {python} set {got}",
                hint=f"run `flashkit lock {env}` after adding it to the lock inputs",
            )


def render(
    *,
    env: str,
    python: str,
    torch: str,
    runtime_set: str,
    wheel: str,
    wheel_sha256: str,
    wheel_requires: tuple[str, ...],
    index_url: str,
    production_url: str,
    test_url: str,
    verified: str,
) -> Pair:
    """Both files of one env and Python. ``verified`` is one line saying under which input hash and policy the
    wheel passed which tiers; the URLs are where the two files will be served."""
    parts = production.split(runtime_set, tuple(Requirement(r).name for r in wheel_requires))
    check_wheel_requirements(env, python, wheel_requires, {p.name: p for p in parts.production})
    version = str(parse_wheel_filename(wheel)[1])
    pip, uv = production.install_lines(production_url)
    prod = (
        f"# flashkit {env} for Python {python} on {production.PLATFORM_TEXT}: torch {torch} and the verified "
        f"{PROJECT} {version}\n"
        f"# {verified}\n"
        "# install it into the environment you use (adds and pins these packages, removes none):\n"
        f"#   {pip}\n#   {uv}\n"
        f"# into a new venv only (it uninstalls every package this file does not list): {production.fresh_venv_line(production_url)}\n"
        f"# the kernel suite's CPU tier, afterwards: pip install --require-hashes -r {test_url}\n"
        "#   then: python -m flash_kernels.selftest --tier cpu\n"
        f"--extra-index-url {index_url}\n"
        + production.pins_text(parts.production)
        + f"{PROJECT}=={version} \\\n    --hash=sha256:{wheel_sha256}\n"
    )
    test = (
        f"# flashkit {env} for Python {python}: what the kernel suite's CPU tier needs besides the production set\n"
        f"# first: pip install --require-hashes -r {production_url}\n"
        f"# then:  pip install --require-hashes -r {test_url}\n"
        "#        python -m flash_kernels.selftest --tier cpu\n" + production.pins_text(parts.test)
    )
    return Pair(prod, test)
