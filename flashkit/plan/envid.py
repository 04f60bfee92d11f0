"""Environment ids such as ``cu124-torch27``, ``rocm64-torch27`` or ``cu131-torch210-ngc``.

An id is parsed once into a typed value; ``str()`` gives the same string back. Grammar:

    <accel><digits>-torch<major><minor>[-<variant>]

``cu124`` is CUDA 12.4 (the last digit is the minor version), ``rocm64`` is ROCm 6.4, ``torch27`` is
torch 2.7 (the first digit is torch's major version). The optional variant (lower-case letters and
digits, starting with a letter) tells apart envs that share accelerator and torch, e.g. an NGC base.
Leading zeros are refused so that every id has exactly one spelling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flashkit.core.errors import SpecError

ACCEL_PREFIX = {"cuda": "cu", "rocm": "rocm"}
_PREFIX_KIND = {v: k for k, v in ACCEL_PREFIX.items()}

_ID_RE = re.compile(
    r"^(?P<prefix>cu|rocm)(?P<accel>[1-9][0-9]{0,2})"
    r"-torch(?P<tmajor>[1-9])(?P<tminor>0|[1-9][0-9]?)"
    r"(?:-(?P<variant>[a-z][a-z0-9]{0,15}))?$"
)


@dataclass(frozen=True, order=True)
class EnvId:
    accel_kind: str  # "cuda" | "rocm"
    accel_major: int
    accel_minor: int
    torch_major: int
    torch_minor: int
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> EnvId:
        m = _ID_RE.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise SpecError(
                f"invalid env id {text!r}: expected <cu|rocm><version digits>-torch<major><minor>[-variant], "
                "e.g. 'cu124-torch27', 'rocm64-torch27', 'cu131-torch210-ngc'"
            )
        accel = m["accel"]
        if len(accel) < 2:
            raise SpecError(
                f"invalid env id {text!r}: accelerator version {accel!r} needs a major and a minor digit "
                "(e.g. cu124 for CUDA 12.4, rocm64 for ROCm 6.4)"
            )
        return cls(
            accel_kind=_PREFIX_KIND[m["prefix"]],
            accel_major=int(accel[:-1]),
            accel_minor=int(accel[-1]),
            torch_major=int(m["tmajor"]),
            torch_minor=int(m["tminor"]),
            variant=m["variant"],
        )

    @property
    def accel_version(self) -> str:
        """``"12.4"`` for cu124."""
        return f"{self.accel_major}.{self.accel_minor}"

    @property
    def torch_series(self) -> str:
        """``"2.7"`` for torch27."""
        return f"{self.torch_major}.{self.torch_minor}"

    @property
    def card_tag(self) -> str:
        """The image tag in the form model cards use: ``torch2.7-cu12.4`` (``-ngc`` etc. kept)."""
        accel = "cu" if self.accel_kind == "cuda" else "rocm"
        out = f"torch{self.torch_series}-{accel}{self.accel_version}"
        return f"{out}-{self.variant}" if self.variant else out

    def __str__(self) -> str:
        out = f"{ACCEL_PREFIX[self.accel_kind]}{self.accel_major}{self.accel_minor}-torch{self.torch_major}{self.torch_minor}"
        if self.variant:
            out += f"-{self.variant}"
        return out

    def __post_init__(self) -> None:
        # A value built by hand must still print to an id that parses back to itself.
        if self.accel_kind not in ACCEL_PREFIX:
            raise SpecError(f"accelerator kind {self.accel_kind!r} is not one of {sorted(ACCEL_PREFIX)}")
        if not (0 <= self.accel_minor <= 9 and self.accel_major >= 1):
            raise SpecError(
                f"accelerator version {self.accel_major}.{self.accel_minor} cannot be written in an env id "
                "(minor must be a single digit)"
            )
        if not (1 <= self.torch_major <= 9 and 0 <= self.torch_minor <= 99):
            raise SpecError(f"torch version {self.torch_major}.{self.torch_minor} cannot be written in an env id")
