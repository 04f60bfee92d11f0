"""Per-family outcome counts of a JUnit file (family = test function; parameters dropped), e.g.
``FAMILY test_kvcache passed=70 failed=0 skipped=1``. Usage: python tools/gpu/junit_counts.py FILE."""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def counts(path: str) -> dict[str, collections.Counter]:
    families: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in ET.parse(path).getroot().iter("testcase"):
        family = case.get("name", "?").split("[")[0]
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        families[family][outcome] += 1
    return families


def main(argv: list[str]) -> int:
    try:
        families = counts(argv[1])
    except (OSError, ET.ParseError) as e:
        print(f"FAMILY counts unavailable: {e}")
        return 1
    for family, c in sorted(families.items()):
        print(f"FAMILY {family} passed={c['passed']} failed={c['failed']} skipped={c['skipped']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
