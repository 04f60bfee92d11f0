"""Site inputs of a build: the proxy CA, a pip index, a Debian mirror and netrc credentials.

They vary from host to host and are never identity: not in the input hash, not in a layer, not in an
image's history, not in any cache key. Each reaches the build as a build secret that only the RUN
lines that install can read (``--secret id=NAME,src=FILE``). What is recorded in the ledger is
credential-free by construction: a URL with a user or token is refused with the way to pass it
(a netrc file), and the CA and netrc are recorded only as "used".
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tempfile
from pathlib import Path

from flashkit.core.errors import UsageError
from flashkit.core.textcheck import check_site_url

# setting -> (environment variable, BuildKit secret id)
URL_SETTINGS = {
    "pip_index_url": ("FLASHKIT_PIP_INDEX_URL", "pip-index"),
    "debian_mirror": ("FLASHKIT_DEBIAN_MIRROR", "debian-mirror"),
}
NETRC_ENV = "FLASHKIT_NETRC"
CA_ENV = "SSL_CERT_FILE"


@dataclasses.dataclass(frozen=True)
class SiteInputs:
    urls: dict[str, str]  # setting -> credential-free URL
    ca_file: str | None
    netrc_file: str | None

    def record(self) -> dict[str, object]:
        """What the ledger keeps about them: URLs (checked credential-free) and whether files were used."""
        return {**self.urls, "ca_secret_used": self.ca_file is not None, "netrc_used": self.netrc_file is not None}


def _regular_file(path: str, what: str) -> str:
    try:
        ok = stat.S_ISREG(os.stat(path).st_mode) and os.access(path, os.R_OK)
    except OSError:
        ok = False
    if not ok:
        raise UsageError(f"{what} {path!r} is not a readable regular file")
    return path


def gather(cli_values: dict[str, str | None], environ: dict[str, str] | None = None) -> SiteInputs:
    """Site inputs from the command line (which wins) and FLASHKIT_* variables, checked."""
    environ = dict(os.environ if environ is None else environ)
    urls: dict[str, str] = {}
    for setting, (env_name, _secret) in URL_SETTINGS.items():
        value = cli_values.get(setting) or environ.get(env_name)
        if not value:
            continue
        where = f"--{setting.replace('_', '-')}" if cli_values.get(setting) else env_name
        why = check_site_url(value, where)
        if why:
            raise UsageError(why)
        urls[setting] = value
    ca = environ.get(CA_ENV)
    ca = ca if ca and os.path.isfile(ca) else None  # the host's proxy CA, when it has one
    netrc = environ.get(NETRC_ENV)
    return SiteInputs(urls, ca, _regular_file(netrc, NETRC_ENV) if netrc else None)


class SecretFiles:
    """``with SecretFiles(site) as args:`` the ``--secret`` arguments, backed by private temp files."""

    def __init__(self, site: SiteInputs, extra: dict[str, str] | None = None) -> None:
        self.site = site
        self.extra = dict(extra or {})  # secret id -> text, e.g. the build-jobs sizing
        self._dir: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> list[str]:
        self._dir = tempfile.TemporaryDirectory(prefix="flashkit-secrets-")
        os.chmod(self._dir.name, 0o700)
        args: list[str] = []
        values = {URL_SETTINGS[setting][1]: value for setting, value in self.site.urls.items()}
        for secret, value in sorted({**values, **self.extra}.items()):
            path = Path(self._dir.name, secret)
            path.write_text(value)
            args += ["--secret", f"id={secret},src={path}"]
        if self.site.ca_file:
            args += ["--secret", f"id=ca,src={self.site.ca_file}"]
        if self.site.netrc_file:
            args += ["--secret", f"id=netrc,src={self.site.netrc_file}"]
        return args

    def __exit__(self, *exc_info) -> None:
        if self._dir is not None:
            self._dir.cleanup()
