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

    def test_status_functions_in_headers_must_be_nodiscard(self):
        code, out = run({"src/a/x.h": "\n".join([
            "absl::Status Open(int fd);",
            "  virtual absl::StatusOr<std::string> Read(int n) = 0;",
            "  static absl::Status Make();",
            "  [[nodiscard]] absl::Status Close();",
            "  [[nodiscard]] virtual absl::StatusOr<int> Size() const = 0;",
            "  friend absl::Status Helper(X&);",
            "  absl::Status status_;",
            "absl::Status last = Open(1);"])})
        self.assertEqual(code, 1, out)
        for line in (1, 2, 3):
            self.assertIn("src/a/x.h:%d: a status-returning function without [[nodiscard]]"
                          % line, out)
        for line in (4, 5, 6, 7, 8):
            self.assertNotIn("src/a/x.h:%d:" % line, out)
        # In a .cc file (a local function) it is not required.
        code, out = run({"src/a/x.cc": "absl::Status Local(int fd);"})
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    SCRIPT = sys.argv.pop(1)
    unittest.main()
