"""The platform floor: every build's extension loads on Debian 12 and Ubuntu 22.04 (glibc 2.35, GCC 12's
libstdc++), whichever Debian suite built it. A wheel built on trixie with its g++ 14 needed
std::ios_base_library_init@GLIBCXX_3.4.32 and __cxa_call_terminate@CXXABI_1.3.15 and did not load on
bookworm's Python 3.11 (found by tests/integration/test_install_from_publication.py); the abi tier now refuses
such a build, and trixie's builds compile the extension's C++ with g++-12."""

from __future__ import annotations

from kitsupport import REPO

from flashkit.binary import elf
from flashkit.plan import baselock, compat, production
from flashkit.plan.plan import load_plan
from flashkit.plan.render import render_dockerfile
from flashkit.verify import tiers


def _obj(*needs: tuple[str, str]) -> elf.ElfObject:
    undefined = tuple(elf.DynSymbol(name, version, False, False, "FUNC") for name, version in needs)
    return elf.ElfObject("/x.so", 64, "x86_64", None, ("libstdc++.so.6", "libc.so.6"), (), (), undefined, {}, {}, (),
                         False)  # fmt: skip


def test_the_abi_tier_refuses_what_the_floor_lacks():
    policy, glibcxx = tiers.policy_for(load_plan(REPO, "cu124-torch27").spec)
    assert (policy, glibcxx) == ("manylinux_2_35", "3.4.30")
    assert tiers.policy_for(load_plan(REPO, "cu130-torch211").spec) == (policy, glibcxx)  # bookworm's: the same
    trixie_gcc14 = _obj(
        ("_ZSt21ios_base_library_initv", "GLIBCXX_3.4.32"), ("__cxa_call_terminate", "CXXABI_1.3.15"),
        ("memcpy", "GLIBC_2.14"), ("_ZNSt6thread6_StateD2Ev", "GLIBCXX_3.4.22"),
    )  # fmt: skip
    problems = tiers._symbol_version_problems(trixie_gcc14, policy, elf.glibc_of_policy(policy), glibcxx)
    assert len(problems) == 2
    assert "@GLIBCXX_3.4.32 is newer than GLIBCXX_3.4.30" in problems[0]
    assert problems[1].startswith("__cxa_call_terminate@CXXABI_1.3.15 is newer than CXXABI_1.3.13")
    assert tiers._symbol_version_problems(_obj(("x", "GLIBC_2.36")), policy, "2.35", glibcxx)  # bookworm's newest
    gcc12 = _obj(
        ("memcpy", "GLIBC_2.14"), ("_ZNSt6thread6_StateD2Ev", "GLIBCXX_3.4.22"), ("__cxa_begin_catch", "CXXABI_1.3")
    )
    assert tiers._symbol_version_problems(gcc12, policy, "2.35", glibcxx) == []


def test_trixie_builds_compile_the_extension_with_g_plus_plus_12():
    suite = compat.DEBIAN_SUITES["trixie"]
    assert suite.extension_gcc == "12" and suite.cuda_host_gcc == "13"
    plan = load_plan(REPO, "cu124-torch27")
    assert "g++-12=12.4.0-5" in baselock.requested(plan.spec)["builder"]
    rendered = render_dockerfile(plan, host_mem_gib=24)
    assert "ENV CXX=g++-12\n" in rendered
    assert "ENV CC=" not in rendered  # torch would hand CC to nvcc: nvcc keeps its host compiler, same device code
    bookworm = render_dockerfile(load_plan(REPO, "cu130-torch211"), host_mem_gib=24)
    assert "ENV CXX=" not in bookworm  # bookworm's g++ is GCC 12 already


def test_every_text_states_the_floor():
    assert "glibc >= 2.35" in production.PLATFORM_TEXT and "Ubuntu 22.04" in production.PLATFORM_TEXT
