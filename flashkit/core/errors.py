"""Errors a user can act on. Each class carries the process exit code the CLI returns for it.

Exit codes: EXIT_CODES below (printed by `flashkit --help`, listed in the README).
"""

from __future__ import annotations

EXIT_CODES = (
    ("0", "success"),
    ("1", "internal error (a bug in flashkit; rerun with --debug for the traceback)"),
    ("2", "usage error (bad command line)"),
    ("3", "invalid input: an env spec, an unknown env id, a repository layout problem"),
    ("4", "an env was rejected by a compatibility rule"),
    ("5", "lockfile problem: missing, stale, inconsistent, or the resolver (uv) failed"),
    ("6", "lint failed: hadolint reported findings on a rendered Dockerfile"),
    ("7", "a required external tool is missing or failed to start (uv, hadolint, docker)"),
    ("8", "not implemented yet"),
    ("10-16", "image pipeline: engine, base, build, container, record, tier error, not verified (image_errors.py)"),
    ("17-19", "publish: refused by the record, push failed, pulled-back image differs (publish.py)"),
    ("20-21", "doctor: 20 problems found, 21 could not inspect the environment (doctor.py)"),
    ("30", "build --check: the cold rebuild's wheel is not bit-identical to the first build's"),
)

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2


class FlashkitError(Exception):
    """Base of every error the CLI reports as a message (no traceback unless --debug)."""

    exit_code: int = EXIT_INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SpecError(FlashkitError):
    """An env spec (or the repository holding it) is not valid input."""

    exit_code = 3


class RuleRejected(FlashkitError):
    """A compatibility rule rejected an env; the message names the rule, the reason and the fix."""

    exit_code = 4


class LockError(FlashkitError):
    """A lockfile is missing, stale or inconsistent, or resolving it failed."""

    exit_code = 5


class LintError(FlashkitError):
    """hadolint reported findings on a rendered Dockerfile."""

    exit_code = 6


class ToolError(FlashkitError):
    """An external tool the command needs is missing or could not be run."""

    exit_code = 7


class NotImplementedYet(FlashkitError):
    """The subcommand exists in the design but its module has not been delivered."""

    exit_code = 8


# -- the image pipeline (10-16): each carries what failed, the evidence (detail) and what to do (hint)
class ImageError(FlashkitError):
    exit_code = 10

    def __init__(self, message: str, *, detail: str | None = None, hint: str | None = None):
        text = message
        if detail:
            text += "\n" + "\n".join("  " + line for line in detail.rstrip().splitlines())
        if hint:
            text += f"\nwhat to do: {hint}"
        super().__init__(text)
        self.detail = detail
        self.hint = hint


class EngineError(ImageError):
    """The container engine is missing, too old, or could not be started."""

    exit_code = 10


class BaseImageError(ImageError):
    """A Debian base image could not be created or is not what the record pins."""

    exit_code = 11


class BuildError(ImageError):
    """An image build failed."""

    exit_code = 12


class ContainerError(ImageError):
    """A container could not be created, or a command or copy inside it failed."""

    exit_code = 13


class RecordError(ImageError):
    """A verification record is unreadable or does not fit the artifact."""

    exit_code = 14


class TierError(ImageError):
    """A verification tier could not run at all."""

    exit_code = 15


class NotVerified(ImageError):
    """Verification ran and at least one tier did not pass."""

    exit_code = 16
