"""Verdicts, summary and merged JUnit XML for scripts/gpu_check.sh (standard library only).

``judge NAME JUNIT OUTPUT RC`` turns one pytest run into a verdict line (PASS, FAIL or SKIP, and why) and
records it; ``record NAME STATUS DETAIL`` records a check that is no pytest run; ``summary XML`` prints every
recorded verdict and writes one JUnit XML of all the runs, with a testcase per check. Verdicts are kept in
``$GPU_CHECK_RESULTS/verdicts.tsv``. A test module or conftest that cannot import a third-party package
(``ModuleNotFoundError``) makes its check SKIP, naming the package: this machine lacks it. Exits 1 from
``summary`` if any check failed.
"""
from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

RESULTS = Path(os.environ.get("GPU_CHECK_RESULTS", "build/gpu-check"))
VERDICTS = RESULTS / "verdicts.tsv"
OWN_PACKAGES = re.compile(r"triton_serve")
MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
TIMED_OUT = (124, 137)


def missing_modules(text: str) -> list[str]:
    """Third-party modules that the text says could not be imported (this project's own ones are failures)."""
    names = {name for name in MISSING.findall(text) if not OWN_PACKAGES.match(name)}
    return sorted(names)


def verdict_of(junit: Path, output: str, rc: int) -> tuple[str, str]:
    if rc in TIMED_OUT:
        return "FAIL", "timed out (killed)"
    if not junit.is_file():
        missing = missing_modules(output)
        if missing and not re.search(r"^(FAILED|ERROR) ", output, re.MULTILINE):
            return "SKIP", f"needs {', '.join(missing)}, not installed here"
        return "FAIL", f"pytest exited {rc} without a report (see the log)"
    counts: Counter[str] = Counter()
    skip_reasons: Counter[str] = Counter()
    failures: list[str] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}".strip(".")
        failed = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failed is not None or error is not None:
            element = failed if failed is not None else error
            assert element is not None
            text = f"{element.get('message', '')}\n{element.text or ''}"
            missing = missing_modules(text)
            if error is not None and missing and "collection" in (element.get("message") or ""):
                counts["skipped"] += 1
                skip_reasons[f"needs {', '.join(missing)}, not installed here"] += 1
            else:
                counts["failed"] += 1
                failures.append(name)
        elif skipped is not None:
            counts["skipped"] += 1
            reason = skipped.get("message") or "skipped"
            if reason == "collection skipped":  # a module-level skip: its reason is the element's text
                found = re.search(r"Skipped: (.*?)['\"]\)?$", (skipped.text or "").strip())
                reason = found.group(1) if found else reason
            skip_reasons[reason.removeprefix("Skipped: ")] += 1
        else:
            counts["passed"] += 1
    tally = ", ".join(f"{count} {kind}" for kind, count in sorted(counts.items())) or "no tests selected"
    reasons = "; ".join(f"{reason} (x{n})" if n > 1 else reason for reason, n in skip_reasons.items())
    # 2: collection errors (interrupted), acceptable where each one is a missing package (counted as skipped)
    if counts["failed"] or rc not in (0, 1, 2, 5):
        shown = ", ".join(failures[:4]) + (" ..." if len(failures) > 4 else "")
        return "FAIL", f"{tally}: {shown or f'pytest exited {rc}'}"
    if counts["passed"]:
        return "PASS", tally + (f" (skipped: {reasons})" if reasons else "")
    return "SKIP", reasons or tally


def record(name: str, status: str, detail: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with VERDICTS.open("a") as verdicts:
        verdicts.write(f"{name}\t{status}\t{' '.join(detail.split())}\n")
    print(f"{status} {name}: {detail}", flush=True)


def summary(xml_path: Path) -> int:
    rows = [line.split("\t", 2) for line in VERDICTS.read_text().splitlines()] if VERDICTS.is_file() else []
    print("\n==== GPU check summary " + "=" * 57)
    for name, status, detail in rows:
        print(f"{status:4} {name:34} {detail}"[:300])
    counts = Counter(status for _, status, _ in rows)
    print(f"---- {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    suites = ET.Element("testsuites")
    checks = ET.SubElement(suites, "testsuite", name="gpu_check", tests=str(len(rows)),
                           failures=str(counts["FAIL"]), skipped=str(counts["SKIP"]), errors="0")
    for name, status, detail in rows:
        case = ET.SubElement(checks, "testcase", classname="gpu_check", name=name)
        if status == "FAIL":
            ET.SubElement(case, "failure", message=detail)
        elif status == "SKIP":
            ET.SubElement(case, "skipped", message=detail)
    for junit in sorted(RESULTS.glob("junit-*.xml")):
        root = ET.parse(junit).getroot()
        for suite in [root] if root.tag == "testsuite" else list(root):
            suite.set("name", junit.stem.removeprefix("junit-"))
            suites.append(suite)
    ET.ElementTree(suites).write(xml_path, encoding="utf-8", xml_declaration=True)
    print(f"JUnit XML: {xml_path}")
    return 1 if counts["FAIL"] or not rows else 0


def main(argv: list[str]) -> int:
    command, *args = argv
    if command == "judge":
        name, junit, output, rc = args
        status, detail = verdict_of(Path(junit), Path(output).read_text(errors="replace"), int(rc))
        record(name, status, detail)
        return 0
    if command == "record":
        record(*args)
        return 0
    if command == "summary":
        return summary(Path(args[0]))
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
