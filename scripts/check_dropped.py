#!/usr/bin/env python3
"""No silent failures: fails on a status dropped without a word in src/.

An empty completion callback taking a status (`[](absl::Status) {}`,
`[](absl::StatusOr<T>) {}`) must become sbx::DropTo{"site"} (src/common/dropped.h: logged
and counted in sbx_dropped_errors_total{site}); an `.IgnoreError()` must say why on its
line (`// dropped: ...`, or a comment where dropping is the design); a header's
status-returning function must be [[nodiscard]]. Run from the
repository root, or pass --root. Exit 0 when clean, 1 with one line per finding.
"""
import argparse
import os
import re
import sys

EMPTY_CALLBACK = re.compile(
    r"\[[^\]]*\]\s*\(\s*(const\s+)?absl::Status(Or<[^()]*>)?\s*&{0,2}\s*\w*\s*\)\s*(->\s*void\s*)?\{\s*\}")
IGNORE = re.compile(r"\.IgnoreError\(\)")
# A function declared in a header that returns a status: it must be [[nodiscard]] (the
# clang build's -Werror then refuses a call whose status is dropped). Friend declarations
# cannot carry the attribute (the function's own declaration does).
STATUS_DECL = re.compile(
    r"^\s*((?:static|virtual|inline|constexpr)\s+)*absl::Status(Or<.*>)?\s+[A-Za-z_][A-Za-z_0-9:~]*\(")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    args = ap.parse_args()
    findings = []
    for base, _, files in os.walk(os.path.join(args.root, "src")):
        for name in sorted(files):
            if not name.endswith((".cc", ".h")):
                continue
            path = os.path.join(base, name)
            rel = os.path.relpath(path, args.root)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in EMPTY_CALLBACK.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                findings.append("%s:%d: a status dropped by an empty callback: use "
                                "sbx::DropTo{\"site\"} (src/common/dropped.h)" % (rel, line))
            for n, line_text in enumerate(text.splitlines(), 1):
                if name.endswith(".h") and STATUS_DECL.match(line_text):
                    findings.append("%s:%d: a status-returning function without [[nodiscard]] "
                                    "(a caller could drop its status silently)" % (rel, n))
                if IGNORE.search(line_text) and "//" not in line_text[IGNORE.search(line_text).end():]:
                    findings.append("%s:%d: IgnoreError() without a reason on its line "
                                    "(// dropped: why), or report it with sbx::ReportDropped"
                                    % (rel, n))
    for f in findings:
        print(f)
    print("dropped errors: %s" % ("ok" if not findings else "%d finding(s)" % len(findings)))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
