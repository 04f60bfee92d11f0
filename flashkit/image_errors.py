"""Errors of the image pipeline (engine, bases, builds, containers, tiers, records): exit codes 10-19.

Each carries what failed, the evidence (``detail``, e.g. the tail of a log) and
what to do (``hint``), folded into the one message the CLI prints.

  10  the container engine is missing, too old or would not start
  11  a Debian base image could not be created, or is not the pinned one
  12  an image build failed (the message names its log)
  13  a container could not be started, or a command or copy in it failed
  14  a verification record is unreadable or does not fit the artifact
  15  a verification tier could not run (an error, not a failed check)
  16  verification finished and at least one tier did not pass
"""

from __future__ import annotations

from flashkit.errors import FlashkitError


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
