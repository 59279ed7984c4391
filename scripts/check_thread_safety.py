#!/usr/bin/env python3
"""Clang's thread-safety analysis over every source file of src/ (docs/architecture.md, "Locking").

Reads the compile commands of a CMake build (build/compile_commands.json, made by scripts/build.sh with
any compiler), runs each file through clang++ -fsyntax-only with -Wthread-safety as an error, and fails when
any file breaks a TAU_GUARDED_BY, TAU_REQUIRES or similar annotation (src/common/thread_annotations.h).
Only the analysis is an error here; the normal builds own the other warnings. A file that reaches no
annotation through its includes (quoted includes under src/, followed transitively) cannot break one and is
skipped, which halves the time.

Usage: scripts/check_thread_safety.py [--build DIR] [--clang clang++-14] [FILE_SUBSTRING...]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys

DROP_WITH_ARG = {"-o", "-MF", "-MT", "-MQ"}
DROP = {"-c", "-MD", "-MMD", "-Werror", "-Wall", "-Wextra", "-fno-fat-lto-objects"}


def clang_command(entry, clang):
    args = entry.get("arguments") or shlex.split(entry["command"])
    # ccache, when the build used it, stands before the compiler.
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in DROP_WITH_ARG:
            skip = True
            continue
        if a in DROP or a.startswith("-Wno-") or a == entry["file"]:
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-Wthread-safety",
                  "-Werror=thread-safety", "-Wno-unknown-warning-option", entry["file"]]


QUOTED = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MARKS = ("common/mutex.h", "common/thread_annotations.h")


def uses_annotations(path, src, memo):
    """Whether `path` includes, directly or through its quoted includes, the annotation headers."""
    if path in memo:
        return memo[path]
    memo[path] = False  # include cycles end here
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    found = any(m in text for m in MARKS)
    for inc in QUOTED.findall(text):
        if found:
            break
        for base in (os.path.dirname(path), src):
            candidate = os.path.join(base, inc)
            if os.path.isfile(candidate):
                found = uses_annotations(os.path.normpath(candidate), src, memo)
                break
    memo[path] = found
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--build", default=os.path.join(root, "build"))
    parser.add_argument("--clang", default=os.environ.get("TAU_CLANGXX", "clang++-14"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("only", nargs="*", help="check only files whose path contains one of these")
    args = parser.parse_args()
    with open(os.path.join(args.build, "compile_commands.json")) as f:
        entries = json.load(f)
    src = os.path.join(root, "src") + os.sep
    todo = {}
    memo = {}
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not path.startswith(src) or not path.endswith(".cc"):
            continue
        if args.only and not any(s in os.path.relpath(path, root) for s in args.only):
            continue
        if not uses_annotations(path, src, memo):
            continue
        e = dict(e, file=path)
        todo.setdefault(path, e)  # a file compiled into two targets is checked once

    def run(entry):
        p = subprocess.run(clang_command(entry, args.clang), cwd=entry["directory"],
                           capture_output=True, text=True)
        return entry["file"], p.returncode, p.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for path, code, err in pool.map(run, sorted(todo.values(), key=lambda e: e["file"])):
            if code != 0:
                failed.append(path)
                sys.stderr.write(err)
    if failed:
        print(f"thread-safety: {len(failed)} of {len(todo)} files fail:", file=sys.stderr)
        for path in failed:
            print("  " + os.path.relpath(path, root), file=sys.stderr)
        return 1
    print(f"thread-safety: {len(todo)} files checked, no findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
