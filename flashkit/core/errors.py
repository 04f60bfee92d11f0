"""Errors a user can act on. Each class carries the exit code the CLI returns for it.

Every code flashkit returns is listed once, in ``EXIT_CODES`` (printed by ``flashkit --help``; a test keeps
docs/exit-codes.md's table the same), so a script can branch on them. Messages say what failed, the evidence
(``detail``: a log tail, a record line) and what to do (``hint``), folded into the one message the
CLI prints; a traceback only with ``--debug``. Exit 1 is reserved for bugs in flashkit itself: no
bad input may end there.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
# The shell's 128 + signal number, as if the signal had ended the process; but only after the clean-up ran.
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_TERMINATED = 143


class Terminated(BaseException):
    """SIGTERM, raised in the main thread while a command runs: it unwinds (``finally``, ``with``) like
    Ctrl-C's KeyboardInterrupt does, and no ``except Exception`` takes it for an error."""


class FlashkitError(Exception):
    """Base of every error the CLI reports as a message (no traceback unless --debug)."""

    exit_code: int = EXIT_INTERNAL

    def __init__(self, message: str, *, detail: str | None = None, hint: str | None = None):
        text = message
        if detail:
            text += "\n" + "\n".join("  " + line for line in detail.rstrip().splitlines())
        if hint:
            text += f"\nwhat to do: {hint}"
        super().__init__(text)
        self.message = text
        self.detail = detail
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(FlashkitError):
    """A bad command line that argparse cannot see (an env id, a registry, a policy)."""

    exit_code = EXIT_USAGE


class SpecError(FlashkitError):
    """An input file of the repository (spec, template, kernel sources) or its layout is not valid."""

    exit_code = 3


class RuleRejected(FlashkitError):
    """A compatibility rule rejected an env; the message names the rule, the reason and the fix."""

    exit_code = 4


class LockError(FlashkitError):
    """A lockfile is missing, unreadable, stale or inconsistent, or resolving it failed."""

    exit_code = 5


class LintError(FlashkitError):
    """hadolint reported findings on a rendered Dockerfile."""

    exit_code = 6


class ToolError(FlashkitError):
    """An external tool the command needs is missing or could not be run."""

    exit_code = 7


# -- the image pipeline -------------------------------------------------------------------------------
class EngineError(FlashkitError):
    """The container engine is missing, too old, or could not be started."""

    exit_code = 10


class BaseImageError(FlashkitError):
    """A Debian base image could not be created or is not what the base record pins."""

    exit_code = 11


class BuildError(FlashkitError):
    """An image build failed, or a cached build result is unreadable."""

    exit_code = 12


class ContainerError(FlashkitError):
    """A container could not be created, or a command or copy inside it failed."""

    exit_code = 13


# -- the ledger -----------------------------------------------------------------------------------------
class RecordError(FlashkitError):
    """A ledger file is unreadable, malformed, or was written by a newer flashkit."""

    exit_code = 14


class TierError(FlashkitError):
    """A verification tier could not run at all (an error, not a failed check)."""

    exit_code = 15


class NotVerified(FlashkitError):
    """Verification ran and at least one required tier did not pass."""

    exit_code = 16


class PublishRefused(FlashkitError):
    """The ledger does not show every tier the policy requires passed for exactly this artifact."""

    exit_code = 17


class PushFailed(FlashkitError):
    """A push or a registry call failed, or the registry answered something unusable; no tag was moved."""

    exit_code = 18


class PullBackMismatch(FlashkitError):
    """What the registry serves by digest is not the image that was pushed."""

    exit_code = 19


# 20 and 21 belong to doctor (flashkit.doctor.model): problems found / could not inspect.
EXIT_DOCTOR_PROBLEMS = 20
EXIT_DOCTOR_UNINSPECTED = 21


class ResultMalformed(FlashkitError):
    """An imported GPU result is not a complete, well-formed result file."""

    exit_code = 22


class EvidenceMismatch(FlashkitError):
    """An imported GPU result disagrees with the JUnit report it came with (counts, verdict, digest)."""

    exit_code = 23


class EnvMismatch(FlashkitError):
    """An imported GPU result ran on another env, torch, CUDA or GPU architecture than the env's."""

    exit_code = 24


class UnknownArtifact(FlashkitError):
    """An imported GPU result judged a wheel that no build in the ledger produced."""

    exit_code = 25


class PythonNotCovered(FlashkitError):
    """An env's production requirements do not cover the Python asked for; the message says why and which do."""

    exit_code = 26


class KeyFileError(FlashkitError):
    """A signing or public key is missing, unreadable, too open, or not an ed25519 key."""

    exit_code = 27


class AttestationMissing(FlashkitError):
    """verify-image: no signed attestation is attached to the image's digest."""

    exit_code = 28


class AttestationInvalid(FlashkitError):
    """verify-image: the attestation's signature, subject digest or content does not check out."""

    exit_code = 29


class NotReproducible(FlashkitError):
    """build --check: the cold rebuild's wheel or an image is not bit-identical to the first build's."""

    exit_code = 30


class PolicyNotMet(FlashkitError):
    """verify-image: the attestation does not show every tier the asked policy requires as passed."""

    exit_code = 31


class RegistryAuthFailed(FlashkitError):
    """The registry refused the credentials, or none were found where a login is needed; no tag was moved."""

    exit_code = 32


class NoVerifiedFit(FlashkitError):
    """resolve: no verified build fits the asked torch, CUDA/ROCm, Python and ABI; the message says why."""

    exit_code = 33


class DeviceCodeMismatch(FlashkitError):
    """A device-code relation that does not hold: the digests differ, or a fact it names is missing or altered."""

    exit_code = 34


class NotPublished(FlashkitError):
    """Resolve: a verified build fits, but nothing of it is published yet; the message says how to build it."""

    exit_code = 35


def _table() -> tuple[tuple[str, str], ...]:
    classes = [c for c in globals().values() if isinstance(c, type) and issubclass(c, FlashkitError)]
    first = {
        c.exit_code: (c.__doc__ or "").strip().split("\n")[0].rstrip(".") for c in classes if c.exit_code > EXIT_USAGE
    }
    rows = {code: text[0].lower() + text[1:] for code, text in first.items()}
    rows[EXIT_DOCTOR_PROBLEMS] = "doctor: problems found in the inspected environment"
    rows[EXIT_DOCTOR_UNINSPECTED] = "doctor: something that matters could not be inspected"
    head = (
        ("0", "success"),
        ("1", "internal error: a bug in flashkit (rerun with --debug for the traceback); no bad input ends here"),
        ("2", "usage error: a bad command line"),
    )
    tail = (
        (str(EXIT_INTERRUPTED), "interrupted: Ctrl-C (SIGINT); the command's clean-up ran first"),
        (
            str(EXIT_BROKEN_PIPE),
            "output closed: the reader of the command's output (head, a pager) stopped reading; nothing more is printed",
        ),
        (
            str(EXIT_TERMINATED),
            "terminated: SIGTERM (kill, timeout, docker stop, a CI cancel); the same clean-up ran first",
        ),
    )
    return head + tuple((str(code), text) for code, text in sorted(rows.items())) + tail


EXIT_CODES = _table()
