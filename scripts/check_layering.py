#!/usr/bin/env python3
"""Checks the layering of src/ against the module table in docs/architecture.md.

The table is the data: each row names a folder (`src/NAME/`, or a nested one such as `src/NAME/SUB/`,
which is a module of its own: its files belong to it, not to `src/NAME/`), its public headers (the third column, in
backticks) and the modules it depends on (the fourth column: module names in backticks; plain words there
are outside libraries). The check fails when
  * a folder under src/ has no row, or a row names a folder that does not exist;
  * the declared dependencies form a cycle;
  * a file of module A includes "B/..." where B is neither A nor a module A depends on (directly or
    through others): an arrow that runs up, or sideways without being declared;
  * a file includes a header of another module that is not one of that module's public headers.
Test files (*_test.cc, *test_util.h) may include the public headers of any module: a test composes them.

Usage: scripts/check_layering.py [--root DIR]   (exit 0: clean, 1: violations, 2: the table is unreadable)
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+/[^"]+)"')
TICKED = re.compile(r"`([^`]+)`")


def read_table(path):
    """{module: (public_headers, deps)} from the '## Modules' table."""
    modules = {}
    in_section = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("## "):
                in_section = line.strip() == "## Modules"
                continue
            if not in_section or not line.startswith("| `src/"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 4:
                raise ValueError(f"{path}:{number}: a module row needs 4 cells, found {len(cells)}")
            folder = re.fullmatch(r"`src/([A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*)/`", cells[0])
            if not folder:
                raise ValueError(f"{path}:{number}: the first cell must be `src/NAME/`, not {cells[0]}")
            headers = set(TICKED.findall(cells[2]))
            deps = set(TICKED.findall(cells[3]))
            modules[folder.group(1)] = (headers, deps, number)
    if not modules:
        raise ValueError(f"{path}: no module table under '## Modules'")
    return modules


def closure(modules):
    """Each module's dependencies, transitively; raises on a cycle."""
    done, visiting, result = set(), [], {}

    def visit(m):
        if m in done:
            return result[m]
        if m in visiting:
            cycle = visiting[visiting.index(m):] + [m]
            raise ValueError("the module table declares a cycle: " + " -> ".join(cycle))
        visiting.append(m)
        reach = set()
        for d in modules[m][1]:
            reach |= {d} | visit(d)
        visiting.pop()
        done.add(m)
        result[m] = reach
        return reach

    for m in modules:
        visit(m)
    return result


def owner(modules, path):
    """The module that a path under src/ ("backend/local/x.h") belongs to: the longest module folder
    that holds it, and the rest of the path; (None, path) when no module holds it."""
    parts = path.split("/")
    for n in range(len(parts) - 1, 0, -1):
        m = "/".join(parts[:n])
        if m in modules:
            return m, "/".join(parts[n:])
    return None, path


def is_test(name):
    return name.endswith("_test.cc") or name.endswith("test_util.h")


def check(root):
    table = os.path.join(root, "docs", "architecture.md")
    try:
        modules = read_table(table)
        for m, (_, deps, number) in modules.items():
            unknown = deps - modules.keys()
            if unknown:
                raise ValueError(f"{table}:{number}: {m} depends on unknown modules {sorted(unknown)}")
        reach = closure(modules)
    except ValueError as e:
        print(f"check_layering: {e}", file=sys.stderr)
        return 2
    problems = []
    src = os.path.join(root, "src")
    folders = {d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))}
    for m in sorted(folders - modules.keys()):
        problems.append(f"src/{m}/: no row in the module table of docs/architecture.md; add one")
    for m in sorted(modules.keys()):
        if not os.path.isdir(os.path.join(src, m)):
            problems.append(f"docs/architecture.md:{modules[m][2]}: src/{m}/ does not exist")
    for top in sorted(folders & modules.keys()):
        for dirpath, _, files in os.walk(os.path.join(src, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc", ".c")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                m, _ = owner(modules, os.path.relpath(path, src).replace(os.sep, "/"))
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        inc = INCLUDE.match(line)
                        if not inc:
                            continue
                        other, header = owner(modules, inc.group(1))
                        if other is None or other == m:
                            continue
                        where = f"{rel}:{number}: includes \"{other}/{header}\""
                        if header not in modules[other][0]:
                            public = ", ".join(sorted(modules[other][0]))
                            problems.append(f"{where}, which is internal to {other} (its public "
                                            f"headers: {public})")
                        elif not is_test(name) and other not in reach[m]:
                            problems.append(f"{where}, but {m} does not depend on {other} in the "
                                            f"module table (docs/architecture.md:{modules[m][2]})")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_layering: {len(problems)} violation(s)", file=sys.stderr)
        return 1
    print(f"check_layering: {len(modules)} modules, no violations")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    sys.exit(check(os.path.abspath(parser.parse_args().root)))


if __name__ == "__main__":
    main()
