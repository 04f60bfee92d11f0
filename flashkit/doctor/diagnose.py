"""Diagnosis: why does my flash-attention import fail, and which env fits this machine?

Pure diagnosis: :func:`diagnose` takes the facts :mod:`flashkit.doctor.probe`
gathered (plain values) and the env specs, and returns findings, each with a
severity, what was seen, the likely cause and the fix, plus the closest env
in ``envs/`` with its verification status. Nothing here runs a process, and
torch is never imported in this process (the probe asks the target
interpreter in child processes).

Exit codes of ``flashkit doctor``:
  0   healthy: no problem found
  20  problems found (at least one finding of severity "error")
  21  could not inspect: no errors, but something that matters could not be
     checked (the interpreter did not answer, a compiled module could not be
     read, pyelftools missing while there are modules to check), an
     unreadable --facts file, or a failure of doctor itself
  2   usage error (a bad command line), as for every flashkit command

They sit in the CLI's doctor range (20-29) so that neither can be mistaken
for the CLI's own 1 (internal error) or 2 (usage error).

``--json`` prints one object with ``schema_version`` (:data:`SCHEMA_VERSION`),
``status`` ("healthy" | "problems" | "uninspected"), ``exit_code``,
``findings`` (severity, code, subject, what, cause, fix, details),
``recommendation`` and the raw ``facts``. Finding codes are stable strings;
new ones may be added, existing ones keep their meaning.

``python -m flashkit.doctor`` runs the same command without the rest of the
CLI (whose other subcommands need jinja2, docker, ...). ``--facts FILE``
diagnoses facts probed elsewhere (``python -m flashkit.doctor.probe``), ``--root DIR``
reads their compiled modules from a mounted image filesystem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from flashkit.doctor import probe
from flashkit.doctor.environment import built_for_findings, environment_findings
from flashkit.doctor.model import (
    SCHEMA_VERSION,
    SEVERITIES,
    Diagnosis,
    Finding,
    RepoProblem,
    Target,
    Verification,
    build_label,
)
from flashkit.doctor.modules import module_findings
from flashkit.doctor.recommend import gpu_capabilities, recommend

# ---------------------------------------------------------------------------
# Putting it together


def diagnose(
    facts: probe.Facts,
    *,
    specs: Sequence[Any] | None = None,
    verification: Mapping[str, Verification] | None = None,
    lockfiles: Mapping[str, str | None] | None = None,
    capabilities: Sequence[str] = (),
    glibc_policy: str | None = None,
    repo_problem: RepoProblem | None = None,
    lock_cuda: Mapping[str, str | None] | None = None,
    requirements: Mapping[str, Any] | None = None,
) -> Diagnosis:
    """Findings and a recommendation from probed facts. Pure: no I/O.

    ``capabilities`` are GPU archs to check the modules against besides the
    GPUs found ("9.0"); ``glibc_policy`` a manylinux policy to hold them to;
    ``lock_cuda`` the CUDA runtime each env's lockfile pins (:func:`lock_cuda_runtime`);
    ``requirements`` the Pythons each env's production requirements cover (``production.Coverage``).
    """
    caps = gpu_capabilities(facts, capabilities)
    torch = facts.torch
    target = Target(
        python=facts.interpreter.python if facts.interpreter else None,
        glibc=facts.interpreter.glibc if facts.interpreter else None,
        glibc_policy=glibc_policy,
        torch_version=torch.version if torch is not None and torch.imported else None,
        torch_cxx11_abi=torch.cxx11_abi if torch is not None and torch.imported else None,
        torch_cuda=torch.cuda if torch is not None and torch.imported else None,
        capabilities=caps,
    )
    findings = environment_findings(facts)
    # a module's wheel label says how it binds to torch (a stable-ABI wheel: torch's C shim only)
    labels = {d.name: build_label(d.version) for d in facts.distributions}
    for m in facts.modules:
        findings.extend(module_findings(m, target, labels.get(m.distribution or "")))
    rec = None
    if repo_problem:
        findings.append(
            Finding(
                "info",
                "no-recommendation",
                "envs",
                f"no recommendation: {repo_problem.what}",
                fix=repo_problem.fix,
            )
        )
    elif specs is not None:
        rec = recommend(facts, specs, verification or {}, lockfiles or {}, caps, lock_cuda, requirements)
        if rec.python_note:
            findings.append(
                Finding(
                    "warning",
                    "python-not-covered",
                    f"env {rec.env}",
                    f"the production requirements of {rec.env} do not cover this Python",
                    cause=rec.python_note,
                    fix="use a covered Python (`flashkit matrix` lists them), or the env's image",
                )
            )
    findings.extend(
        built_for_findings(facts, findings, specs, verification or {}, lockfiles or {}, rec.env if rec else None)
    )
    if rec is not None and rec.env:
        # The env's requirements for this Python when there are some, else its merged file.
        lockfile = rec.lockfile or f"lockfiles/{rec.env}.txt"
        findings = [
            dataclasses.replace(f, fix=f.fix.replace("lockfiles/<env>.txt", lockfile).replace("<env>", rec.env))
            if f.fix and "<env>" in f.fix
            else f
            for f in findings
        ]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: (order[f.severity], f.subject, f.code))
    return Diagnosis(tuple(findings), rec)


def to_json(diagnosis: Diagnosis, facts: probe.Facts) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": diagnosis.status,
        "exit_code": diagnosis.exit_code,
        "findings": [probe.json_ready(dataclasses.asdict(f)) for f in diagnosis.findings],
        "recommendation": probe.json_ready(dataclasses.asdict(diagnosis.recommendation))
        if diagnosis.recommendation
        else None,
        "facts": facts.to_json(),
    }
