"""A wheel publication served beside the install page (``flashkit site --with-publication DIR``).

The page names URLs from the ledger's ``wheel-publication`` facts; the folder that ``flashkit publish-wheels``
wrote is what those URLs point at. Before the two are put in one site, they are checked against each other,
so that every command the page shows names a file the site serves, with the bytes the ledger recorded:

- the folder's ``index.json`` is the publication the ledger's current facts for its base URL name (its
  sha256 is their ``publication``);
- every file those facts name is in the folder, with the sha256 they record.

Anything else is refused (exit 2) with what differs; nothing is written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from flashkit.core import safeio
from flashkit.core.errors import UsageError

MANIFEST = "index.json"
MARKER = ".flashkit-publication"
MAX_FILE_BYTES = 2 * 1024 * safeio.MIB  # a kernel wheel with every cubin is well under this


def _read(folder: Path, rel: str) -> bytes:
    return safeio.read_bytes(
        folder / rel, what="published file", error=UsageError, max_bytes=MAX_FILE_BYTES, root=folder
    )


def files_of(folder: Path, live: dict) -> dict[str, bytes]:
    """Every file of the publication at ``folder``, checked against ``live`` (env -> current
    WheelPublication fact, as :func:`flashkit.doctor.repo.load` finds them)."""
    # os.path: False, not OSError, for a name too long to look up
    if not os.path.isfile(folder / MARKER) or not os.path.isfile(folder / MANIFEST):
        raise UsageError(
            f"--with-publication {folder}: not a folder `flashkit publish-wheels` wrote (no {MARKER} or {MANIFEST})"
        )
    manifest = _read(folder, MANIFEST)
    shown = f"--with-publication {folder}: {MANIFEST}"
    data = safeio.parse_json(manifest, shown=shown, what="publication manifest", error=UsageError)
    base = data.get("base_url") if isinstance(data, dict) else None
    if not isinstance(base, str):
        raise UsageError(f"{shown} is not a publication manifest (no base_url)")
    facts = [f for f in live.values() if f.base_url == base]
    if not facts:
        raise UsageError(
            f"--with-publication {folder}: the ledger records no current publication at {base} for a verified env",
            hint="publish with `flashkit publish-wheels` from this checkout first; its facts are what the page shows",
        )
    digest = hashlib.sha256(manifest).hexdigest()
    stale = sorted(f.env for f in facts if f.publication != digest)
    if stale:
        raise UsageError(
            f"--with-publication {folder}: its {MANIFEST} (sha256 {digest[:16]}) is not the publication the ledger "
            f"records at {base} for {', '.join(stale)}",
            hint="pass the folder of the latest `flashkit publish-wheels` to that URL",
        )
    out: dict[str, bytes] = {}
    for path in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()):
        out[path] = _read(folder, path)
    for f in facts:
        for rel, sha in f.files.items():
            if rel not in out:
                raise UsageError(f"--with-publication {folder}: {rel} ({f.env}) is missing")
            if hashlib.sha256(out[rel]).hexdigest() != sha:
                raise UsageError(f"--with-publication {folder}: {rel} is not the file the ledger recorded for {f.env}")
    return out
