"""Where the Debian bases come from: the host's apt sources, unless overridden."""

from __future__ import annotations

from flashkit.images import base


def apt_dir(tmp_path, sources_list="", extra=None):
    d = tmp_path / "apt"
    (d / "sources.list.d").mkdir(parents=True)
    (d / "sources.list").write_text(sources_list)
    for name, text in (extra or {}).items():
        (d / "sources.list.d" / name).write_text(text)
    return d


def test_deb822_debian_archive_is_found_and_security_and_third_party_skipped(tmp_path):
    d = apt_dir(
        tmp_path,
        extra={
            "debian.sources": (
                "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\n"
                "Types: deb\n# comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
                "Components: main\n"
            ),
            "nodesource.sources": "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\n",
        },
    )
    assert base.host_mirror(d) == "http://mirror.example/debian"


def test_one_line_sources_with_options(tmp_path):
    d = apt_dir(
        tmp_path,
        "# deb http://old/debian bookworm main\n"
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://ftp.de.debian.org/debian trixie main\n",
    )
    assert base.host_mirror(d) == "http://ftp.de.debian.org/debian"


def test_no_debian_source_falls_back_to_deb_debian_org(tmp_path):
    assert base.host_mirror(apt_dir(tmp_path)) == base.DEFAULT_MIRROR


def test_flag_beats_environment_beats_host(monkeypatch):
    monkeypatch.setenv("FLASHKIT_DEBIAN_MIRROR", "http://env.example/debian/")
    assert base.resolve_mirror("http://flag.example/debian") == ("http://flag.example/debian", "--mirror")
    assert base.resolve_mirror(None) == ("http://env.example/debian", "FLASHKIT_DEBIAN_MIRROR")
    monkeypatch.delenv("FLASHKIT_DEBIAN_MIRROR")
    assert base.resolve_mirror(None)[1] == "host apt sources"
