"""What doctor reads from a flashkit checkout: the specs, each env's verification status, its lockfiles
and the Pythons its production requirements cover.

An edge, separate from the pure diagnosis. A checkout that cannot be read (no envs/, flashkit's
dependencies missing on a bare GPU host) is a :class:`RepoProblem` shown as a finding, never a failure of
doctor. A spec that does not validate is in ``broken``, the other envs are read as usual.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from flashkit.doctor.model import RepoProblem, Verification

_CUDA_RUNTIME_PIN = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", re.MULTILINE | re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RepoFacts:
    specs: list[Any] | None
    verification: dict[str, Verification]
    lockfiles: dict[str, str | None]
    lock_cuda: dict[str, str | None]
    problem: RepoProblem | None
    requirements: dict[str, Any] = dataclasses.field(default_factory=dict)  # env -> production.Coverage
    broken: dict[str, str] = dataclasses.field(default_factory=dict)  # env -> why its spec does not validate
    # env -> its current wheel publication (flashkit.ledger.model.WheelPublication), verified envs only
    wheel_publications: dict[str, Any] = dataclasses.field(default_factory=dict)
    # env -> the error of its ledger, which does not read: its verification says "unknown", and a command
    # exits with the error's code after answering from the others (as `flashkit ledger show` does for it).
    unreadable: dict[str, Any] = dataclasses.field(default_factory=dict)


def lock_cuda_runtime(lock_text: str) -> str | None:
    """The CUDA runtime ("12.6") a lockfile pins for torch (nvidia-cuda-runtime[-cuXX]==...), or None."""
    m = _CUDA_RUNTIME_PIN.search(lock_text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def current_publications(found: dict[str, tuple[str | None, list[Any]]]) -> dict[str, Any]:
    """Per env, the wheel publication that still describes what is served: of the facts at the env's current
    input hash, the latest whose publication is the latest at its base URL (a publication replaces its folder
    whole, so an env left out of a later one there is no longer served). ``found``: env -> (current input
    hash, every wheel-publication fact of its ledger)."""
    # Dates are to the second; within a ledger the later line is the later fact, so ties go to append order.
    latest_at: dict[str, tuple[str, int, str]] = {}
    for _h, facts in found.values():
        for pos, f in enumerate(facts):
            if f.base_url not in latest_at or (f.date, pos) >= latest_at[f.base_url][:2]:
                latest_at[f.base_url] = (f.date, pos, f.publication)
    out = {}
    for env, (h, facts) in found.items():
        live = [(f.date, pos, f) for pos, f in enumerate(facts) if f.input_hash == h]
        live = [x for x in live if latest_at[x[2].base_url][2] == x[2].publication]
        if live:
            out[env] = max(live, key=lambda x: x[:2])[2]
    return out


def published_coverage(cov, pub) -> Any:
    """``cov`` with the URLs of the publication's requirement files (the Pythons it covers and serves)."""
    urls = {py: (pub.url(path), pub.url(pub.tests[py])) for py, path in pub.requirements.items() if py in pub.tests}
    return dataclasses.replace(cov, published=urls, index_url=pub.index_url)


def _verification(
    root: Path,
    plan,
    policy: str | None,
    wheel_pubs: dict[str, tuple[str | None, list[Any]]],
    unreadable: dict[str, Any],
) -> Verification:
    try:
        from flashkit.core.errors import FlashkitError
        from flashkit.ledger import gate, store
    except ImportError as exc:  # a bare GPU host without jsonschema/filelock: say so, do not guess
        return Verification(f"unknown (the ledger needs flashkit's dependencies: {exc})", False)
    try:
        ledger = store.load(root, plan.env_id)
        wheel_pubs[plan.env_id] = (plan.input_hash, ledger.wheel_publications())
        accepts = plan.spec.gpu_evidence
        decision = gate.latest_decision(ledger, plan.input_hash, gate.parse_policy(policy), accepts)
        published = []
        for pub in ledger.publications(plan.input_hash):
            published += [f"{pub.target}@{pub.digest}", *(f"{pub.target}:{t}" for t in pub.tags)]
        return Verification(
            gate.status(ledger, plan.input_hash, accepts),
            bool(decision),
            tuple(dict.fromkeys(published)),
            plan.input_hash,
            decision.reasons,
            tuple(j.line() for j in decision.passed if j.tier in gate.GPU_TIERS),
        )
    except ImportError as exc:  # jsonschema, imported when the first ledger is read
        return Verification(f"unknown (the ledger needs flashkit's dependencies: {exc})", False)
    except FlashkitError as exc:  # a broken ledger must not stop the diagnosis (a bug elsewhere surfaces)
        unreadable[plan.env_id] = exc
        return Verification(f"unknown (ledger unreadable: {str(exc).splitlines()[0]})", False)


def _problem(what: str, fix: str) -> RepoFacts:
    return RepoFacts(None, {}, {}, {}, RepoProblem(what, fix))


def load(repo: Path | None, policy: str | None = None) -> RepoFacts:
    """The checkout's envs; each verified or not under ``policy`` (a publish policy; default ``full``)."""
    try:
        from flashkit.core import paths
        from flashkit.core.errors import FlashkitError
        from flashkit.plan import production
        from flashkit.plan.plan import plan_of
        from flashkit.plan.specfile import load_each
    except ImportError as exc:
        return _problem(
            f"cannot read env specs here ({exc})",
            "install flashkit's dependencies (PyYAML, packaging), or probe here with "
            "`python -m flashkit.doctor.probe -o facts.json` and run `flashkit doctor --facts facts.json` "
            "where they are installed",
        )
    try:
        root = Path(repo) if repo else paths.find_repo_root()
        if not paths.is_repo_root(root):
            return _problem(
                f"--repo {root} is not a flashkit checkout (it needs envs/ and {paths.TEMPLATE})",
                "pass --repo the root of the flashkit checkout",
            )
        specs, broken = load_each(root)
    except FlashkitError as exc:  # a broken spec must not stop the diagnosis
        return _problem(str(exc), "run inside a flashkit checkout or pass --repo PATH")
    verification: dict[str, Verification] = {}
    lockfiles: dict[str, str | None] = {}
    lock_cuda: dict[str, str | None] = {}
    requirements: dict[str, Any] = {}
    wheel_pubs: dict[str, tuple[str | None, list[Any]]] = {}
    unreadable: dict[str, Any] = {}
    for s in specs:
        env = str(s.id)
        try:
            plan = plan_of(root, s)
        except FlashkitError as exc:
            verification[env] = Verification(f"not verified ({str(exc).splitlines()[0]})", False)
            lockfiles[env], lock_cuda[env] = None, None
            continue
        verification[env] = _verification(root, plan, policy, wheel_pubs, unreadable)
        lock_cuda[env] = lock_cuda_runtime(plan.locks.runtime)
        try:
            cov = production.coverage(s, production.read(root, s))
        except FlashkitError:  # unreadable production files: the image's own set still names the env
            cov = None
        else:
            requirements[env] = cov
        image_lock = paths.rel(root, paths.python_lock_file(root, env, s.python))
        lockfiles[env] = cov.merged_path if cov is not None and cov.merged_path else image_lock
    live = {
        env: pub
        for env, pub in current_publications(wheel_pubs).items()
        if env in requirements and verification[env].verified
    }
    for env, pub in live.items():
        requirements[env] = published_coverage(requirements[env], pub)
    why = {env: str(exc) for env, exc in broken.items()}
    return RepoFacts(specs, verification, lockfiles, lock_cuda, None, requirements, why, live, unreadable)
