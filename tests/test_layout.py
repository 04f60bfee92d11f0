"""The kit's architecture, kept by a test: layers import only downwards, no module imports itself back
through others, and modules and functions stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "flashkit"
# Each layer may import itself and the layers listed; anything else is an upward or sideways dependency.
ALLOWED = {
    "core": set(),
    # runs on GPU hosts with the standard library alone; core is standard library only too (where outputs may go)
    "evidence": {"core"},
    "binary": {"core", "evidence"},
    "plan": {"core"},  # pure: reads and checks; runs no tool
    "locking": {"core", "plan"},  # uv, to write lockfiles
    "images": {"core", "binary", "evidence", "plan"},
    "verify": {"core", "binary", "evidence", "plan", "images"},  # the tiers, run on built images
    "ledger": {"core", "binary", "evidence", "plan", "images", "verify"},
    # registry, attestations, wheelhouse; the kit lock that a publication ships
    "publish": {"core", "binary", "evidence", "plan", "locking", "images", "ledger"},
    "doctor": {"core", "binary", "plan", "ledger"},
    "resolve": {"core", "plan", "doctor"},  # the verified env that fits a query, by doctor's match
    "site": {"core", "binary", "plan", "ledger", "doctor", "resolve"},
    "cli": {
        "core",
        "binary",
        "evidence",
        "plan",
        "locking",
        "images",
        "verify",
        "ledger",
        "publish",
        "doctor",
        "resolve",
        "site",
    },
}
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = path
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    # `python -m flashkit.doctor` is an entry point: it belongs to the command line.
    return "cli" if parts[-1] == "__main__" else (parts[1] if len(parts) > 1 else "root")


def imports(path: Path, known: set[str]) -> set[str]:
    """Every flashkit module ``path`` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flashkit"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("flashkit")}
    return {m for m in found if m in known}


GRAPH = {name: imports(path, set(modules())) for name, path in modules().items()}


def test_every_module_is_in_a_layer():
    assert {layer(m) for m in GRAPH} - {"root"} <= set(ALLOWED)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_layers_import_only_downwards(module):
    mine = layer(module)
    if mine == "root":
        return
    bad = sorted(m for m in GRAPH[module] if layer(m) not in ALLOWED[mine] | {mine, "root"})
    assert not bad, f"{module} ({mine}) imports {bad}; {mine} may import {sorted(ALLOWED[mine])}"


def test_no_import_cycles():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(GRAPH[m]):
            if dep in GRAPH and state.get(dep) == 1 and dep != m and not m.startswith(dep + "."):
                cycle = [*stack[stack.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep in GRAPH and dep not in state:
                visit(dep)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_modules_and_functions_stay_readable(module):
    path = modules()[module]
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module} has {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            assert n <= MAX_FUNCTION_LINES, f"{module}.{node.name} has {n} lines"


def test_the_cli_wires_commands_by_explicit_imports():
    text = (ROOT / "cli" / "main.py").read_text()
    assert "importlib" not in text and "EXTENSIONS" not in text


# What a script looks like, in any language: its suffix, a name that build tools run, or a first line "#!".
SCRIPT_SUFFIXES = frozenset({
    ".py", ".pyw", ".ipynb", ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat", ".pl", ".rb", ".js", ".mjs", ".ts",
    ".lua", ".r", ".jl", ".tcl", ".awk", ".sed", ".mk", ".cmake", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h",
    ".hpp", ".patch", ".diff",
})  # fmt: skip
SCRIPT_NAMES = frozenset({"Makefile", "makefile", "Dockerfile", "Containerfile", "Justfile", "noxfile.py"})


def is_script(path: Path) -> bool:
    if path.suffix.lower() in SCRIPT_SUFFIXES or path.name in SCRIPT_NAMES or path.stat().st_mode & 0o111:
        return True
    with path.open("rb") as fh:
        return fh.read(2) == b"#!"


def test_benchmark_results_hold_results_only():
    """benchmarks/results keeps the latest result of each benchmark (the history is in git): under 1 MB, no
    script of any language (a run's command lives in the benchmark's options and in the folder's README; a
    GPU-host tool in flash_kernels/tools/gpu/), and a README in every folder that says what produced it."""
    results = ROOT.parent / "benchmarks" / "results"
    files = [p for p in results.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 1024 * 1024
    scripts = sorted(p.relative_to(results).as_posix() for p in files if is_script(p))
    assert not scripts, f"scripts under benchmarks/results (move them to benchmarks/ or tools, or drop them): {scripts}"
    folders = [p for p in results.iterdir() if p.is_dir()]
    assert folders and (results / "README.md").is_file()
    bare = sorted(p.name for p in folders if not (p / "README.md").is_file())
    assert not bare, f"result folders without a README saying which command produced them: {bare}"


def test_a_script_is_recognised_whatever_its_language(tmp_path):
    for name, text in (("run.py", "x"), ("x.patch", "x"), ("go", "#!/bin/sh\n"), ("Makefile", "all:\n")):
        (tmp_path / name).write_text(text)
        assert is_script(tmp_path / name), name
    (tmp_path / "bench.log").write_text("fwd 1.0 ms\n")
    assert not is_script(tmp_path / "bench.log")


# Where a process may be started other than through flashkit.core.procs.run: the standard-library-only GPU
# host runner (it must not import the kit), c++filt's best-effort demangling (any failure falls back to
# another demangler), and the long-lived or streamed children that procs.stop ends (buildah build's log,
# dockerd, the local registry, triton-aot's worker group).
OWN_PROCESS_CALLS = {
    "flashkit.evidence.artifact_check": 2,
    "flashkit.binary.elf": 1,
    "flashkit.images.buildah": 1,
    "flashkit.images.engine": 1,
    "flashkit.publish.local_registry": 1,
    "flashkit.verify.triton_aot": 1,
}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_external_commands_run_through_one_wrapper(module):
    """flashkit.core.procs.run gives every call a time limit and turns a missing, hung or failing tool into
    the caller's error; a module that calls subprocess itself must be one of the listed exceptions."""
    if module == "flashkit.core.procs":
        return
    calls = [
        node
        for node in ast.walk(ast.parse(modules()[module].read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "subprocess"
        and node.func.attr in ("run", "Popen", "call", "check_call", "check_output")
    ]
    assert len(calls) == OWN_PROCESS_CALLS.get(module, 0), (
        f"{module} starts {len(calls)} process(es) with subprocess directly: use flashkit.core.procs.run"
    )


KERNELS = ROOT.parent / "flash_kernels"


@pytest.mark.parametrize(
    "path", sorted(KERNELS.rglob("*.py")), ids=lambda p: str(p.relative_to(KERNELS)) if isinstance(p, Path) else p
)
def test_the_kernels_stand_alone_and_stay_readable(path):
    """The kernels never import the kit (they ship alone, in a wheel), and their modules stay as readable as
    the kit's. Functions are not bounded here: a Triton kernel is one function by design."""
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.relative_to(KERNELS)} has {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        assert not [n for n in names if n.split(".")[0] == "flashkit"], f"{path.relative_to(KERNELS)} imports the kit"


def unlinked_notes(repo: Path) -> list[str]:
    """The files under notes/ that no page of the documentation (README.md, docs/*.md) names by path: notes/
    keeps design notes the docs point to; a lab notebook's history belongs in the changelog or in git."""
    notes = repo / "notes"
    pages = "\n".join(p.read_text() for p in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))] if p.is_file())
    found = sorted(p.relative_to(repo).as_posix() for p in notes.rglob("*") if p.is_file()) if notes.is_dir() else []
    return [rel for rel in found if rel not in pages]


def test_notes_hold_only_design_notes_the_docs_link_to():
    assert not unlinked_notes(ROOT.parent), "notes/ files no doc links to (link them or move them to the changelog)"


def test_an_unlinked_note_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "design.md").write_text("why\n")
    (tmp_path / "notes" / "lab.md").write_text("tried\n")
    (tmp_path / "docs" / "index.md").write_text("See [the design](../notes/design.md).\n")
    assert unlinked_notes(tmp_path) == ["notes/lab.md"]
