#!/usr/bin/env python3
"""Tests of scripts/check_layering.py: it passes on this tree and fails, saying where, on small trees with
a deliberate violation (an include that runs up, an internal header, a folder without a row, a cycle)."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_layering.py")

TABLE = """# arch

## Modules

| folder | owns | public headers | depends on |
|---|---|---|---|
| `src/base/` | the bottom | `base.h` | fmt |
| `src/mid/` | the middle | `mid.h` | `base`; yaml-cpp |
| `src/top/` | the top | `top.h` | `mid` |

## Next
"""


def run(root):
    p = subprocess.run([sys.executable, CHECK, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


class Tree:
    def __init__(self, table=TABLE):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        self.write("docs/architecture.md", table)
        self.write("src/base/base.h", "#pragma once\n")
        self.write("src/base/internal.h", "#pragma once\n")
        self.write("src/base/base.cc", '#include "base/base.h"\n#include "base/internal.h"\n')
        self.write("src/mid/mid.h", '#pragma once\n#include "base/base.h"\n')
        self.write("src/mid/mid.cc", '#include "mid/mid.h"\n#include <vector>\n')
        self.write("src/top/top.cc", '#include "mid/mid.h"\n#include "base/base.h"\n')

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


class CheckLayeringTest(unittest.TestCase):
    def test_this_repository_is_clean(self):
        code, out = run(os.path.join(HERE, ".."))
        self.assertEqual(code, 0, out)
        self.assertIn("no violations", out)

    def test_a_clean_tree_passes_with_transitive_dependencies(self):
        t = Tree()
        code, out = run(t.root)
        self.assertEqual(code, 0, out)

    def test_an_include_that_runs_up_fails_and_says_where(self):
        t = Tree()
        t.write("src/base/base.cc", '#include "base/base.h"\n\n#include "mid/mid.h"\n')
        code, out = run(t.root)
        self.assertEqual(code, 1, out)
        self.assertIn('src/base/base.cc:3: includes "mid/mid.h", but base does not depend on mid', out)

    def test_an_internal_header_of_another_module_fails(self):
        t = Tree()
        t.write("src/mid/mid.cc", '#include "base/internal.h"\n')
        code, out = run(t.root)
        self.assertEqual(code, 1, out)
        self.assertIn('src/mid/mid.cc:1: includes "base/internal.h", which is internal to base', out)

    def test_tests_may_include_public_headers_of_any_module_but_not_internal_ones(self):
        t = Tree()
        t.write("src/base/base_test.cc", '#include "top/top.h"\n')
        t.write("src/top/top.h", "#pragma once\n")
        self.assertEqual(run(t.root)[0], 0)
        t.write("src/base/base_test.cc", '#include "mid/internal.h"\n')
        self.assertEqual(run(t.root)[0], 1)

    def test_a_folder_without_a_row_fails(self):
        t = Tree()
        t.write("src/extra/extra.cc", "\n")
        code, out = run(t.root)
        self.assertEqual(code, 1, out)
        self.assertIn("src/extra/: no row in the module table", out)

    def test_a_declared_cycle_is_refused(self):
        t = Tree(TABLE.replace("| the bottom | `base.h` | fmt |", "| the bottom | `base.h` | `top` |"))
        code, out = run(t.root)
        self.assertEqual(code, 2, out)
        self.assertIn("cycle: ", out)

    def test_an_unknown_dependency_is_refused(self):
        t = Tree(TABLE.replace("`base`; yaml-cpp", "`base`, `nothing`"))
        code, out = run(t.root)
        self.assertEqual(code, 2, out)
        self.assertIn("mid depends on unknown modules ['nothing']", out)

    def test_a_nested_folder_with_a_row_is_a_module_of_its_own(self):
        # src/mid/impl/ is its own module: it may use mid (declared), but mid may not use it, and
        # a third module sees only its public header.
        t = Tree(TABLE.replace("| `src/top/` |", "| `src/mid/impl/` | an implementation | `impl.h` | `mid` |\n| `src/top/` |")
                 .replace("| the top | `top.h` | `mid` |", "| the top | `top.h` | `mid/impl` |"))
        t.write("src/mid/impl/impl.h", '#pragma once\n#include "mid/mid.h"\n')
        t.write("src/mid/impl/detail.h", "#pragma once\n")
        t.write("src/mid/impl/impl.cc", '#include "mid/impl/impl.h"\n#include "mid/impl/detail.h"\n')
        t.write("src/top/top.cc", '#include "mid/impl/impl.h"\n#include "mid/mid.h"\n')
        code, out = run(t.root)
        self.assertEqual(code, 0, out)
        t.write("src/mid/mid.cc", '#include "mid/mid.h"\n#include "mid/impl/impl.h"\n')
        code, out = run(t.root)
        self.assertEqual(code, 1, out)
        self.assertIn('src/mid/mid.cc:2: includes "mid/impl/impl.h", but mid does not depend on mid/impl', out)
        t.write("src/mid/mid.cc", '#include "mid/mid.h"\n')
        t.write("src/top/top.cc", '#include "mid/impl/detail.h"\n')
        code, out = run(t.root)
        self.assertEqual(code, 1, out)
        self.assertIn('includes "mid/impl/detail.h", which is internal to mid/impl', out)

    def test_a_nested_row_for_a_missing_folder_fails(self):
        t = Tree(TABLE.replace("| `src/top/` |", "| `src/mid/gone/` | nothing | `gone.h` | `mid` |\n| `src/top/` |"))
        code, out = run(t.root)
        self.assertEqual(code, 1, out)
        self.assertIn("src/mid/gone/ does not exist", out)


if __name__ == "__main__":
    unittest.main()
