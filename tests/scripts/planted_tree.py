"""Runs one of scripts/check_*.py on a source tree a test plants in a temporary folder."""
import os
import subprocess
import sys
import tempfile


def run_on_tree(script, files):
    """`files`: {relative path: text}. Returns (exit code, stdout + stderr)."""
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, script, "--root", root], capture_output=True,
                           text=True)
        return p.returncode, p.stdout + p.stderr
