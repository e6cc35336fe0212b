"""scripts/check_dropped.py on a tree made for it: it finds each way of dropping a status
silently and accepts the reported and the explained ones.

Usage: python3 dropped_test.py PATH/check_dropped.py
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_tree import run_on_tree  # noqa: E402

SCRIPT = None


def run(files):
    return run_on_tree(SCRIPT, files)


class DroppedTest(unittest.TestCase):
    def test_silent_drops_are_found(self):
        code, out = run({"src/a/x.cc": "\n".join([
            "void f() {",
            "  store->Commit(b, [](absl::Status) {});",
            "  a->Release(o, i, [](absl::StatusOr<store::ClaimRecord>) {});",
            "  g([](const absl::Status& s) { });",
            "  Close().IgnoreError();",
            "}"])})
        self.assertEqual(code, 1, out)
        self.assertIn("src/a/x.cc:2:", out)
        self.assertIn("src/a/x.cc:3:", out)
        self.assertIn("src/a/x.cc:4:", out)
        self.assertIn("src/a/x.cc:5: IgnoreError()", out)

    def test_reported_and_explained_drops_pass(self):
        code, out = run({"src/a/x.cc": "\n".join([
            "void f() {",
            "  store->Commit(b, DropTo{\"a.commit\"});",
            "  g([](absl::Status s) { Log(s); });",
            "  Close().IgnoreError();  // dropped: nowhere to report it",
            "}"])})
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
