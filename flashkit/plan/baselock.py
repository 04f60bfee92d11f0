"""The base lock: the exact Debian packages of an env's two base images, committed and hashed. Pure.

A debian-flavoured env starts FROM two bases made by ``mmdebstrap`` from Debian's archive: the builder's
(Python, its headers, the compilers, and Debian's CUDA toolkit where the spec takes it from Debian) and
the runtime's (Python and venv only). ``lockfiles/<env>/base.txt`` lists every package of each, name and
exact version, as ``flashkit base lock <env>`` found them; its bytes are part of the input hash, so a
re-lock is a new input hash and a new image, never a silent drift. A build installs exactly these
versions and checks the result against the lock (``flashkit.images.base``).

The format is line-oriented text so that a re-lock reads as a diff::

    # flashkit base lock cu130-torch211 ...      (header: fixed text derived from the spec)
    suite bookworm
    components main
    variant minbase
    [builder]
    requested g++=4:12.2.0-3 python3=3.11.2-1+b1 ...
    apt=2.6.1
    ...
    [runtime]
    ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flashkit.plan import compat
from flashkit.plan.spec import EnvSpec

STAGES = ("builder", "runtime")
VARIANT = "minbase"
HEADER_MARK = "# flashkit base lock"
# A Debian package name and version as dpkg writes them (policy 5.6.1 and 5.6.12).
_NAME = r"[a-z0-9][a-z0-9+.-]+"
_VERSION = r"(?:[0-9]+:)?[A-Za-z0-9.+~-]+"
_PIN = re.compile(rf"({_NAME})=({_VERSION})")


@dataclass(frozen=True)
class BaseLock:
    suite: str
    components: tuple[str, ...]
    variant: str
    requested: dict[str, tuple[str, ...]]  # stage -> "name=version" the spec asks for
    packages: dict[str, tuple[tuple[str, str], ...]]  # stage -> every (name, version) installed, sorted

    def pins(self, stage: str) -> tuple[str, ...]:
        return tuple(f"{n}={v}" for n, v in self.packages[stage])


def requested(spec: EnvSpec) -> dict[str, tuple[str, ...]]:
    """The packages each base must hold, pinned, derived from the spec alone (debian flavor)."""
    suite = compat.DEBIAN_SUITES[spec.base.suite]
    pin = suite.packages
    builder = [f"{p}={pin[p]}" for p in ("python3", "python3-venv", "python3-dev", "g++")]
    if spec.compiler.source == "debian":
        builder += [f"g++-{suite.cuda_host_gcc}={pin[f'g++-{suite.cuda_host_gcc}']}"]
        if suite.extension_gcc:
            builder += [f"g++-{suite.extension_gcc}={pin[f'g++-{suite.extension_gcc}']}"]
        builder += [f"nvidia-cuda-toolkit={spec.compiler.version}"]
    runtime = [f"{p}={pin[p]}" for p in ("python3", "python3-venv")]
    return {"builder": tuple(sorted(builder)), "runtime": tuple(sorted(runtime))}


def components(spec: EnvSpec) -> tuple[str, ...]:
    # Debian's CUDA toolkit is in non-free (and needs contrib); everything else is in main.
    return ("main", "contrib", "non-free") if spec.compiler.source == "debian" else ("main",)


def header(spec: EnvSpec) -> str:
    return (
        f"{HEADER_MARK} {spec.id}: every Debian package of its builder and runtime bases.\n"
        f"# Written by `flashkit base lock {spec.id}` (mmdebstrap); do not edit. Part of the input hash.\n"
    )


def format_lock(spec: EnvSpec, lock: BaseLock) -> str:
    lines = [
        header(spec).rstrip("\n"),
        f"suite {lock.suite}",
        f"components {' '.join(lock.components)}",
        f"variant {lock.variant}",
    ]
    for stage in STAGES:
        lines += [f"[{stage}]", "requested " + " ".join(lock.requested[stage])]
        lines += list(lock.pins(stage))
    return "\n".join(lines) + "\n"


def parse(text: str) -> tuple[BaseLock | None, list[str]]:
    """The lock in ``text``, or None and every problem found (each naming its line)."""
    fields: dict[str, str] = {}
    req: dict[str, tuple[str, ...]] = {}
    pkgs: dict[str, list[tuple[str, str]]] = {}
    problems: list[str] = []
    stage = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        if m := re.fullmatch(r"\[([a-z]+)\]", line):
            stage = m.group(1)
            if stage not in STAGES or stage in pkgs:
                problems.append(f"line {number}: section [{stage}] is unknown or repeated")
            pkgs[stage] = []
        elif stage is None:
            key, _, value = line.partition(" ")
            if key not in ("suite", "components", "variant") or not value:
                problems.append(f"line {number}: expected `suite`, `components` or `variant`, got {line[:60]!r}")
            fields[key] = value
        elif line.startswith("requested "):
            req[stage] = tuple(line.split()[1:])
        elif m := _PIN.fullmatch(line):
            pkgs[stage].append((m.group(1), m.group(2)))
        else:
            problems.append(f"line {number}: not a `name=version` pin: {line[:60]!r}")
    for stage in STAGES:
        if stage not in pkgs or not pkgs[stage]:
            problems.append(f"section [{stage}] is missing or empty")
        elif stage not in req:
            problems.append(f"section [{stage}] has no `requested` line")
        elif sorted(pkgs[stage]) != pkgs[stage] or len(set(pkgs[stage])) != len(pkgs[stage]):
            problems.append(f"section [{stage}]: pins are not sorted and unique")
    if missing := [k for k in ("suite", "components", "variant") if k not in fields]:
        problems.append(f"missing {', '.join(missing)}")
    if problems:
        return None, problems
    lock = BaseLock(
        suite=fields["suite"],
        components=tuple(fields["components"].split()),
        variant=fields["variant"],
        requested=req,
        packages={s: tuple(pkgs[s]) for s in STAGES},
    )
    return lock, []


def check(spec: EnvSpec, text: str) -> list[str]:
    """Every reason the committed base lock does not fit the spec (empty: it does). Offline."""
    again = f"run `flashkit base lock {spec.id}` (needs Debian's archive) and commit the result"
    lock, problems = parse(text)
    if lock is None:
        return [f"base lock: {p}; {again}" for p in problems]
    want = requested(spec)
    if not text.startswith(header(spec)):
        problems.append(f"base lock header is not the one for {spec.id}; {again}")
    if (lock.suite, lock.components, lock.variant) != (spec.base.suite, components(spec), VARIANT):
        problems.append(
            f"base lock is for {lock.suite} {' '.join(lock.components)}, the spec needs {spec.base.suite}; {again}"
        )
    for stage in STAGES:
        if lock.requested[stage] != want[stage]:
            problems.append(f"base lock [{stage}] was made for other packages than the spec asks; {again}")
        installed = set(lock.pins(stage))
        if missing := [r for r in want[stage] if r not in installed]:
            problems.append(f"base lock [{stage}] does not hold {', '.join(missing)}; {again}")
    return problems


def parse_installed(text: str) -> tuple[tuple[str, str], ...]:
    """``name=version`` lines as ``dpkg-query -W -f '${Package}=${Version}\\n'`` prints them, sorted."""
    out = []
    for line in text.splitlines():
        if m := _PIN.fullmatch(line.strip()):
            out.append((m.group(1), m.group(2)))
    return tuple(sorted(set(out)))


def drift(locked: tuple[tuple[str, str], ...], installed: tuple[tuple[str, str], ...]) -> list[str]:
    """How an installed package set differs from the lock: one line per package, empty when equal."""
    a, b = dict(locked), dict(installed)
    out = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            out.append(f"{name}: locked {a.get(name, '(absent)')}, installed {b.get(name, '(absent)')}")
    return out
