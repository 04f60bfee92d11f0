"""Checks for text that reaches a Dockerfile line, an image label, a record or a command line.

Patterns are always matched whole (``fullmatch``): ``re.match(r"^x$", "x\\n")`` succeeds, because
``$`` also matches before a final newline, and that newline would then end a Dockerfile ARG line early.
URLs that are written anywhere (a record, a label, a layer's history) must not carry credentials.
"""

from __future__ import annotations

import re
import urllib.parse

# C0 controls and DEL; tab and newline are allowed only where free text is (notes), never in values.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_EXCEPT_LAYOUT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

NETRC_HINT = (
    "put the credentials in a netrc file (machine HOST login USER password TOKEN) and pass its path in "
    "FLASHKIT_NETRC: builds hand it to pip and apt as a BuildKit secret, which never enters a layer, "
    "the image history or the record"
)


def whole(pattern: re.Pattern[str], value: object) -> bool:
    """True when ``value`` is a string that ``pattern`` matches from its first to its last character."""
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def control_characters(value: str, *, free_text: bool = False) -> list[str]:
    """The control characters in ``value`` (as ``\\xNN``); newlines and tabs pass in free text only."""
    found = (_CONTROL_EXCEPT_LAYOUT if free_text else _CONTROL).findall(value)
    return sorted({f"\\x{ord(c):02x}" for c in found})


def credentials_in_url(url: str) -> bool:
    """Does ``url`` carry a user name or password (``https://user:token@host/...``)?"""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return bool(parts.username or parts.password) or "@" in parts.netloc


def check_site_url(value: str, what: str) -> str | None:
    """Why ``value`` cannot be used as a pip index or Debian mirror URL (None when it can)."""
    bad = control_characters(value)
    if bad:
        return f"{what} contains control characters ({', '.join(bad)})"
    if credentials_in_url(value):
        return f"{what} carries credentials, which would be written into the record and the image history; {NETRC_HINT}"
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{what} {value!r} is not an http(s) URL with a host"
    if any(c in value for c in " \"'`$\\"):
        return f"{what} {value!r} contains a space, quote, backslash or '$', which no index URL needs"
    return None
