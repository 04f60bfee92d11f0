"""JUnit XML reports of the kernel suite: their counts, their failures, and the verdict they support.

Standard library only: it runs inside ``artifact_check`` on GPU hosts where flashkit is not installed.
Reports are read defensively (a result to import may be forged or broken): a size cap, no DTD or
entity declarations (the expansion bombs ``xml.etree`` would otherwise process), and counts that must
be non-negative integers. A malformed report raises :class:`JunitError`, never a parser traceback.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

MAX_REPORT_BYTES = 64 * 1024 * 1024
COUNT_KEYS = ("tests", "failed", "errors", "skipped", "passed")


class JunitError(ValueError):
    """The text is not a JUnit report this module can trust."""


def _root(xml_text: str) -> ET.Element:
    if len(xml_text) > MAX_REPORT_BYTES:
        raise JunitError(f"the report is larger than {MAX_REPORT_BYTES >> 20} MiB")
    if "<!DOCTYPE" in xml_text or "<!ENTITY" in xml_text:
        raise JunitError("the report declares a DTD or entities, which no JUnit writer does")
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise JunitError(f"not well-formed XML ({exc})") from None
    if root.tag not in ("testsuite", "testsuites"):
        raise JunitError(f"the root element is <{root.tag}>, not <testsuites> or <testsuite>")
    return root


def junit_counts(xml_text: str) -> dict[str, int]:
    """tests/failed/errors/skipped/passed, counted from the <testcase> elements themselves: the
    suites' summary attributes are a claim, the cases are the evidence."""
    tot = dict.fromkeys(COUNT_KEYS, 0)
    for case in _root(xml_text).iter("testcase"):
        tot["tests"] += 1
        if case.find("failure") is not None:
            tot["failed"] += 1
        elif case.find("error") is not None:
            tot["errors"] += 1
        elif case.find("skipped") is not None:
            tot["skipped"] += 1
        else:
            tot["passed"] += 1
    return tot


def junit_failures(xml_text: str, limit: int = 10) -> list[str]:
    """The first line of each failure or error, named by test."""
    out = []
    for case in _root(xml_text).iter("testcase"):
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None:
                msg = (el.get("message") or el.text or "").strip().splitlines()
                first = msg[0][:300] if msg else ""
                out.append(f"{kind}: {case.get('classname')}.{case.get('name')}: {first}")
    return out[:limit]


def suite_verdict(counts: dict[str, int], exit_code: int | None = 0) -> tuple[str, str | None]:
    """("passed" | "failed", why not passed) for a suite run: a pass needs a passing test and nothing
    failed, errored or exited non-zero; a run where everything was skipped verified nothing."""
    if counts["failed"] or counts["errors"]:
        return "failed", f"{counts['failed']} failed, {counts['errors']} errors of {counts['tests']}"
    if exit_code not in (0, None):
        return "failed", f"the suite exited {exit_code}"
    if counts["passed"] <= 0:
        return "failed", f"no test passed ({counts['skipped']} skipped): nothing was verified"
    return "passed", None
