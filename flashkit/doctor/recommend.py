"""The env that fits an inspected environment best, with its verification status, or the spec to add."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flashkit.binary import fatbin
from flashkit.doctor import probe
from flashkit.doctor.model import MIN_DRIVER_FOR_CUDA, Candidate, Query, Recommendation, Verification, vkey

if TYPE_CHECKING:  # the plan layer needs packaging; doctor itself must run where only the stdlib is
    from flashkit.plan.production import Coverage

# ---------------------------------------------------------------------------
# Recommendation


def gpu_capabilities(facts: probe.Facts, stated: Sequence[str]) -> tuple[str, ...]:
    caps = list(stated)
    for g in facts.gpus:
        if g.capability:
            caps.append(g.capability)
    if facts.torch is not None and facts.torch.cuda:  # on ROCm "capabilities" are not CUDA archs
        caps.extend(d.capability for d in facts.torch.devices if re.fullmatch(r"\d+\.\d+", d.capability))
    return tuple(dict.fromkeys(caps))


def query_of(facts: probe.Facts, caps: Sequence[str]) -> Query:
    """What an inspected environment asks of an env: its torch, accelerator, ABI, Python, driver and GPUs."""
    torch = facts.torch if facts.torch is not None and facts.torch.imported else None
    want_kind = "rocm" if torch and torch.hip else "cuda" if (torch and torch.cuda) or facts.gpus else None
    return Query(
        accelerator=want_kind,
        torch=torch.version if torch else None,
        accel_version=(torch.hip or torch.cuda) if torch else None,
        cxx11_abi=torch.cxx11_abi if torch else None,
        python="{}.{}".format(*facts.interpreter.python) if facts.interpreter is not None else None,
        driver=facts.gpus[0].driver if facts.gpus else None,
        capabilities=tuple(caps),
    )


def score_env(
    spec, facts: probe.Facts, caps: Sequence[str], lock_cuda: str | None = None, cov: Coverage | None = None
) -> Candidate:
    """How well one EnvSpec fits the probed environment (higher is closer); see :func:`score`."""
    return score(spec, query_of(facts, caps), lock_cuda, cov)


def score(spec, q: Query, lock_cuda: str | None = None, cov: Coverage | None = None) -> Candidate:
    """How well one EnvSpec fits what ``q`` asks for (higher is closer): doctor's inspected environment and
    `flashkit resolve`'s command line are matched here, by the same rules.

    ``lock_cuda`` is the CUDA runtime the env's lockfile pins for torch ("12.6"):
    the spec's accelerator version is its toolkit's, and torch's wheel may use a
    newer minor of the same major (torch 2.7.1 from PyPI is cu126 beside nvcc 12.4).
    ``cov``: the Pythons the env's production requirements cover; one that does not
    cover this Python cannot be installed here from its requirements.
    A difference in ``Candidate.blocking`` means the env's build cannot serve ``q`` at all.
    """
    s = _Score()
    kind = spec.accelerator.kind
    if q.accelerator:
        if kind == q.accelerator:
            s.add(30, f"accelerator {kind}")
        else:
            s.differs(-100, "accelerator", f"accelerator {kind} (here {q.accelerator})")
    if q.torch:
        _score_torch_version(s, spec, q.torch)
        if q.accel_version and kind == (q.accelerator or kind):
            _score_accelerator_version(s, spec, q.accel_version, lock_cuda)
        if q.cxx11_abi is not None:
            _score_cxx11_abi(s, spec, q.cxx11_abi)
    elif kind == "cuda" and q.driver:
        _score_driver(s, spec, q.driver)
    if q.python is not None:
        _score_python(s, spec, q.python, cov)
    if kind == "cuda":
        for cap in q.capabilities:
            if fatbin.targets_cover(spec.gpu_targets, cap):
                s.add(10, f"gpu_targets cover {cap}")
            else:
                s.differs(-30, "gpu_targets", f"gpu_targets {list(spec.gpu_targets)} do not cover this GPU ({cap})")
    return Candidate(
        str(spec.id), s.score, tuple(s.matches), tuple(s.diffs), tuple(dict.fromkeys(s.fields)), tuple(s.blocking)
    )


@dataclasses.dataclass
class _Score:
    """A score being made, with what matched and what differs (and in which spec field), in the order checked."""

    score: int = 0
    matches: list[str] = dataclasses.field(default_factory=list)
    diffs: list[str] = dataclasses.field(default_factory=list)
    fields: list[str] = dataclasses.field(default_factory=list)
    blocking: list[str] = dataclasses.field(default_factory=list)

    def add(self, points: int, match: str | None = None) -> None:
        self.score += points
        if match is not None:
            self.matches.append(match)

    def differs(self, points: int, field: str, text: str, *, blocks: bool = True) -> None:
        """A difference; ``blocks``: the env's build cannot serve what was asked (not a mere patch or minor)."""
        self.score += points
        self.diffs.append(text)
        self.fields.append(field)
        if blocks:
            self.blocking.append(text)


def _score_python(s: _Score, spec, py: str, cov: Coverage | None) -> None:
    if spec.python == py:
        s.add(10, f"python {py}")
    else:
        s.differs(
            0,
            "python",
            f"python {spec.python} in the env (here {py}; an abi3 wheel of the env still loads)",
            blocks=False,
        )
    if cov is not None and cov.covered:
        if py in cov.covered:
            s.add(5, f"requirements for python {py}")
        else:
            s.differs(-20, "python", f"no requirements for python {py} ({cov.reason(py)})")


def _score_torch_version(s: _Score, spec, version: str) -> None:
    """The same minor scores; a patch (or pre-release) that differs costs a little, another minor by how far
    it is. A builder's local label (``+cu128``, NGC's ``+b4e4ee81d3``) is not part of the comparison."""
    here, env = _release(version), _release(spec.torch)
    if here is None or env is None:
        return
    if env[0][:2] == here[0][:2]:
        s.add(40, f"torch {spec.torch}")
        if len(here[0]) > 2 and (env[0][2:3], env[1]) != (here[0][2:3], here[1]):
            s.differs(-2, "torch", f"torch patch {spec.torch} (here {version})", blocks=False)
    else:
        gap = abs((env[0][0] * 100 + env[0][1]) - (here[0][0] * 100 + here[0][1]))
        s.differs(-(10 + gap), "torch", f"torch {spec.torch} (here {version})")


def _release(text: str) -> tuple[tuple[int, ...], object] | None:
    """A torch version's release numbers and pre-release part; None when it is not a version."""
    from packaging.version import Version  # here: see the TYPE_CHECKING note above

    try:
        v = Version(text)
    except ValueError:  # InvalidVersion, or a number past Python's 4300-digit conversion limit
        return None
    return (v.release, v.pre) if len(v.release) >= 2 else None


def _score_accelerator_version(s: _Score, spec, accel_here: str, lock_cuda: str | None) -> None:
    """The env's CUDA/ROCm version against torch's here: the major first, then the minor (or the lockfile's)."""
    ah = accel_here.split(".")
    ev = spec.accelerator.version.split(".")
    if ah[:1] != ev[:1]:
        s.differs(-20, "accelerator", f"{spec.accelerator} (torch here uses {accel_here})")
        return
    s.add(20)
    if ah[:2] == ev[:2]:
        s.add(5, f"{spec.accelerator}")
    elif lock_cuda and ah[:2] == lock_cuda.split(".")[:2]:
        s.add(5, f"{spec.accelerator} toolkit, torch's CUDA {lock_cuda} runtime (lockfile)")
    else:  # the same major: minor-version compatibility, so the build still serves it
        s.differs(0, "accelerator", f"{spec.accelerator} (torch here uses {accel_here})", blocks=False)


def _score_cxx11_abi(s: _Score, spec, cxx11_abi: bool) -> None:
    if spec.cxx11_abi == cxx11_abi:
        s.add(5, f"cxx11_abi {str(spec.cxx11_abi).lower()}")
    else:
        here_abi = str(cxx11_abi).lower()
        s.differs(-15, "cxx11_abi", f"cxx11_abi {str(spec.cxx11_abi).lower()} (torch here: {here_abi})")


def _score_driver(s: _Score, spec, driver: str) -> None:
    """Without a working torch, whether this machine's driver runs the env's CUDA."""
    need = MIN_DRIVER_FOR_CUDA.get(spec.accelerator.major)
    if need and vkey(driver) < vkey(need):
        s.differs(-50, "accelerator", f"{spec.accelerator} needs driver >= {need} (here {driver})")
    else:
        s.add(10, f"{spec.accelerator} runs on driver {driver}")


def verification_line(env: str, verification: Mapping[str, Verification]) -> str:
    v = verification.get(env)
    return v.status if v is not None else f"not verified (no ledger verified/{env}.jsonl)"


@dataclasses.dataclass(frozen=True)
class InstallWay:
    """How the inspected Python gets the env: its requirements file, the exact commands, or why there are none."""

    file: str | None = None
    commands: tuple[str, ...] = ()
    not_covered: str | None = None
    not_published: str | None = None


def install_for(cov: Coverage | None, facts: probe.Facts) -> InstallWay:
    """For the inspected Python: the env's published requirements and the commands, or why there are none."""
    if cov is None or facts.interpreter is None:
        return InstallWay()
    py = "{}.{}".format(*facts.interpreter.python)
    why = cov.reason(py)
    if why is not None:
        return InstallWay(cov.merged_path, not_covered=f"Python {py} is not covered: {why}")
    if py not in cov.published:
        # The committed set pins torch, not the kernel wheel: a command from it would install no kernel.
        return InstallWay(
            cov.file_for(py),
            not_published=f"nothing of {cov.env} is published for Python {py} yet (no index serves its wheel); from "
            f"a clone: `nox -s test-{cov.env}`, then `flashkit wheelhouse {cov.env}`",
        )
    return InstallWay(cov.published[py][0], cov.commands(py))


def recommend(
    facts: probe.Facts,
    specs: Sequence[Any],
    verification: Mapping[str, Verification],
    lockfiles: Mapping[str, str | None],
    caps: Sequence[str] = (),
    lock_cuda: Mapping[str, str | None] | None = None,
    requirements: Mapping[str, Coverage] | None = None,
) -> Recommendation:
    """The closest env to this environment, with its status, or which spec to add."""
    if not specs:
        return Recommendation(None, False, "no env specs found under envs/")
    by_id = {str(s.id): s for s in specs}
    scored = []
    for s in specs:
        c = score_env(s, facts, caps, (lock_cuda or {}).get(str(s.id)), (requirements or {}).get(str(s.id)))
        v = verification.get(str(s.id))
        if v is not None and v.verified:
            c = dataclasses.replace(c, score=c.score + 5, matches=(*c.matches, "verified"))
        cov = (requirements or {}).get(str(s.id))
        py = "{}.{}".format(*facts.interpreter.python) if facts.interpreter is not None else None
        if cov is not None and py in cov.published:
            # One command installs it here: worth more than an image of this very Python that nobody can get.
            c = dataclasses.replace(c, score=c.score + 15, matches=(*c.matches, f"published for python {py}"))
        scored.append(c)
    # ties go to the newest torch, then the newest accelerator version
    ranked = sorted(
        scored,
        key=lambda c: (
            -c.score,
            [-x for x in vkey(by_id[c.env].torch)],
            [-x for x in vkey(by_id[c.env].accelerator.version)],
            c.env,
        ),
    )
    best = ranked[0]
    spec = next(s for s in specs if str(s.id) == best.env)
    exact = not best.differences and facts.torch is not None and bool(facts.torch.imported)
    why = "fits this environment" if exact else "closest env; it differs in: " + "; ".join(best.differences)
    if not best.differences and not exact:
        why = "best match for this machine (no working torch here to compare against)"
    add = None if exact else _spec_to_add(facts, caps, best, specs)
    way = install_for((requirements or {}).get(best.env), facts)
    return Recommendation(
        env=best.env,
        exact=exact,
        reason=why,
        differences=best.differences,
        mismatched=best.mismatched,
        verification=verification_line(best.env, verification),
        lockfile=way.file or lockfiles.get(best.env),
        install=way.commands,
        python_note=way.not_covered,
        publication_note=way.not_published,
        publish_tags=tuple(spec.publish_tags),
        add_spec=add,
        candidates=tuple(ranked[:5]),
    )


def _spec_to_add(facts: probe.Facts, caps: Sequence[str], best: Candidate, specs: Sequence[Any]) -> str | None:
    """Name the spec change that would fit exactly, when a working torch says what fits."""
    torch = facts.torch
    if torch is None or not torch.imported or not torch.version or facts.interpreter is None:
        return None
    if set(best.mismatched) == {"python"}:
        return None  # only the image's Python differs: the env's abi3 wheel serves this Python
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", torch.version)
    accel = torch.hip or torch.cuda
    if not m or not accel:
        return None
    major, minor = accel.split(".")[:2]
    env_id = f"{'rocm' if torch.hip else 'cu'}{major}{minor}-torch{m.group(1)}{m.group(2)}"
    if best.env == env_id and set(best.mismatched) <= {"gpu_targets", "python"}:
        spec = next(s for s in specs if str(s.id) == env_id)
        missing = [c for c in caps if not fatbin.targets_cover(spec.gpu_targets, c)]
        return f"add {', '.join(repr(c) for c in missing)} to gpu_targets in envs/{env_id}.yaml"
    py = "{}.{}".format(*facts.interpreter.python)
    name = env_id if all(str(s.id) != env_id for s in specs) else f"{env_id}-py{py.replace('.', '')}"
    targets = ", ".join(f'"{c}"' for c in caps) or '"8.0", "9.0"'
    return (
        f'add envs/{name}.yaml with python: "{py}", torch: "{m.group(1)}.{m.group(2)}.{m.group(3)}", '
        f'accelerator: {{kind: {"rocm" if torch.hip else "cuda"}, version: "{major}.{minor}"}}, '
        f"cxx11_abi: {str(bool(torch.cxx11_abi)).lower()}, gpu_targets: [{targets}]"
    )
