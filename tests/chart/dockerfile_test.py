"""Static checks of the Dockerfile (no container engine is needed or used).

- the build stage installs the build and library packages of scripts/install-deps, and
  nothing that script does not know;
- every package a runtime stage installs is a real Debian 12 package (installed on this
  Debian 12 machine as a dependency of the -dev packages, or known to apt-cache);
- each runtime stage provides every shared library the built binary it copies loads
  (ldd of the binary built here, each library mapped to its package with dpkg -S);
- the files copied between stages are the ones the build makes, and .dockerignore keeps
  what the build needs;
- the runtime stages run as uid 65532 with the right entrypoints.

Usage: python3 dockerfile_test.py --source DIR --bin-dir DIR_WITH_SBX_BINARIES
"""
import argparse
import fnmatch
import os
import re
import subprocess
import sys
import unittest

SOURCE = None
BIN_DIR = None
# Always present in any Debian image (essential); need not be installed explicitly.
ESSENTIAL = {"libc6", "libgcc-s1"}


def logical_lines(text):
    """Dockerfile lines with continuations joined and comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not cur and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    if cur:
        out.append(cur)
    return out


def parse_stages(text):
    """[{name, base, lines}] in order."""
    stages = []
    for line in logical_lines(text):
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            stages.append({"base": m.group(1), "name": m.group(2), "lines": []})
        elif stages:
            stages[-1]["lines"].append(line)
    return stages


def apt_packages(stage):
    pkgs = []
    for line in stage["lines"]:
        if not line.upper().startswith("RUN "):
            continue
        for cmd in re.split(r"&&|;", line[4:]):
            words = cmd.split()
            if len(words) >= 2 and words[0] == "apt-get" and words[1] == "install":
                pkgs += [w for w in words[2:] if not w.startswith("-")]
    return pkgs


def install_deps_groups():
    """{comment heading: [packages]} of the PACKAGES array in scripts/install-deps."""
    with open(os.path.join(SOURCE, "scripts", "install-deps")) as f:
        text = f.read()
    body = text[text.index("PACKAGES=(") + len("PACKAGES=("):]
    body = body[:body.index("\n)")]
    groups, heading = {}, ""
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("#"):
            heading = line.lstrip("# ").split(" ")[0]
            continue
        groups.setdefault(heading, []).extend(line.split())
    return groups


def package_of(path):
    """The Debian package owning a library path (usr-merged /lib or /usr/lib)."""
    real = os.path.realpath(path)
    candidates = [path, real]
    for p in list(candidates):
        if p.startswith("/usr/"):
            candidates.append(p[4:])
        else:
            candidates.append("/usr" + p)
    for p in candidates:
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    raise AssertionError("no Debian package owns %s" % path)


def shared_library_packages(binary):
    r = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True)
    pkgs = {}
    for line in r.stdout.splitlines():
        m = re.search(r"=>\s+(/\S+)", line)
        if m:
            pkgs.setdefault(package_of(m.group(1)), []).append(os.path.basename(m.group(1)))
    return pkgs


class DockerfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(SOURCE, "Dockerfile")) as f:
            cls.stages = parse_stages(f.read())
        cls.by_name = {s["name"]: s for s in cls.stages}

    def test_stages_and_users(self):
        self.assertEqual([s["name"] for s in self.stages], ["build", "sandboxd", "server"])
        self.assertEqual(self.by_name["build"]["base"], "debian:12")
        for name, binary in (("server", "sbx-server"), ("sandboxd", "sbx-sandboxd")):
            st = self.by_name[name]
            self.assertEqual(st["base"], "debian:12-slim", name)
            self.assertIn("USER 65532:65532", st["lines"], name)
            [entry] = [ln for ln in st["lines"] if ln.startswith("ENTRYPOINT")]
            self.assertIn('"/usr/local/bin/%s"' % binary, entry)

    def test_build_stage_packages_match_install_deps(self):
        groups = install_deps_groups()
        known = {p for ps in groups.values() for p in ps}
        build = set(apt_packages(self.by_name["build"]))
        self.assertTrue(build)
        # ca-certificates: for apt over https in the build stage; not a build dependency.
        self.assertEqual(sorted(build - known - {"ca-certificates"}), [],
                         "packages scripts/install-deps does not install")
        needed = set(groups["libraries"]) | set(groups["static"]) | (
            set(groups["build"]) - {"clang", "clang-format"})  # clang: the test preset only
        self.assertEqual(sorted(needed - build), [],
                         "build/library packages of scripts/install-deps missing in the build stage")
        run = " ".join(ln for ln in self.by_name["build"]["lines"] if ln.startswith("RUN"))
        self.assertIn("scripts/build release sbx-server sbx-sandboxd", run)

    def test_runtime_packages_exist(self):
        for name in ("server", "sandboxd"):
            for p in apt_packages(self.by_name[name]):
                r = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", p],
                                   capture_output=True, text=True)
                if r.returncode == 0 and "installed" in r.stdout:
                    continue
                r = subprocess.run(["apt-cache", "show", p], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, "stage %s: no Debian package %r" % (name, p))

    def test_runtime_stages_provide_the_shared_libraries(self):
        checked = 0
        for name in ("server", "sandboxd"):
            have = set(apt_packages(self.by_name[name])) | ESSENTIAL
            for line in self.by_name[name]["lines"]:
                if not line.startswith("COPY"):
                    continue
                binary = os.path.basename(line.split()[-2])
                path = os.path.join(BIN_DIR, binary)
                self.assertTrue(os.path.exists(path), "%s not built" % path)
                need = shared_library_packages(path)
                self.assertIn("libc6", need)  # the ldd parse works
                missing = {p: libs for p, libs in need.items() if p not in have}
                self.assertEqual(missing, {}, "stage %s lacks the packages of these libraries "
                                              "of %s (add them to its apt-get install)"
                                 % (name, binary))
                checked += 1
        self.assertEqual(checked, 3)

    def test_copied_files_are_built(self):
        build_run = " ".join(ln for ln in self.by_name["build"]["lines"] if ln.startswith("RUN"))
        for name in ("server", "sandboxd"):
            for line in self.by_name[name]["lines"]:
                if not line.startswith("COPY"):
                    continue
                words = line.split()
                self.assertIn("--from=build", words, line)
                src = words[-2]
                binary = os.path.basename(src)
                self.assertTrue(src.startswith("/out/"), line)
                # The build stage copies build/release/src/cmd/<binary> to /out; the same
                # target lands at the same place in every preset's build folder.
                self.assertIn("build/release/src/cmd/%s" % binary, build_run)
                self.assertTrue(os.path.exists(os.path.join(BIN_DIR, binary)), binary)
                self.assertEqual(os.path.basename(os.path.normpath(BIN_DIR)), "cmd")
                self.assertEqual(os.path.basename(os.path.dirname(os.path.normpath(BIN_DIR))),
                                 "src")

    def test_dockerignore_keeps_what_the_build_needs(self):
        with open(os.path.join(SOURCE, ".dockerignore")) as f:
            patterns = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]

        def ignored(path):
            parts = path.split("/")
            for i in range(1, len(parts) + 1):
                prefix = "/".join(parts[:i])
                for p in patterns:
                    if fnmatch.fnmatch(prefix, p) or fnmatch.fnmatch(prefix, p.lstrip("*/")):
                        return True
            return False

        needed = ["CMakeLists.txt", "CMakePresets.json", "scripts/build", "proto/sbx/v1",
                  "src/cmd/sbx_server_main.cc", "bench/CMakeLists.txt", "tools/CMakeLists.txt"]
        for path in needed:
            self.assertTrue(os.path.exists(os.path.join(SOURCE, path)), path)
            self.assertFalse(ignored(path), "%s is needed by the build but .dockerignore "
                                            "drops it" % path)
        for path in (".git", "build/clang", "tests/clients/node_modules/x"):
            self.assertTrue(ignored(path), path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--bin-dir", required=True)
    opts, rest = parser.parse_known_args()
    SOURCE, BIN_DIR = opts.source, opts.bin_dir
    unittest.main(argv=[sys.argv[0], "-v"] + rest)
