"""`tau completion bash|zsh|fish`: the scripts are made from the command tree, so what they offer is
what tau takes. The bash script parses (`bash -n`) and, loaded into bash, completes commands,
subcommands, flags and (from the server) run names."""
import shutil
import subprocess
import unittest

from harness import TAU, ServerTestCase


def complete(env, *words):
    """What bash's completion offers for `words` (the last one is the word being completed)."""
    script = subprocess.run([TAU, "completion", "bash"], capture_output=True, text=True,
                            check=True).stdout
    line = " ".join(f"'{w}'" for w in (TAU, *words))
    program = (script + f"\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _tau\n"
               'printf "%s\\n" "${COMPREPLY[@]}"\n')
    p = subprocess.run(["bash", "-c", program], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


class CompletionTest(ServerTestCase):
    def test_bash_script_parses_and_completes(self):
        script = self.server.tau("completion", "bash", check=0).stdout
        p = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        env = self.server.env
        self.assertEqual(complete(env, "ca"), ["cancel"])
        self.assertEqual(complete(env, "server", "st"), ["stop"])
        self.assertIn("--follow", complete(env, "logs", "--fo"))
        self.assertIn("--all-users", complete(env, "cancel", "--all"))
        # A new command is offered with no change to the script: it is made from the tree.
        self.assertIn("completion", complete(env, "comp"))
        # Run names, from the server.
        spec = self.project("schema_version: 1\nname: comp\nrun:\n  entrypoint: main.sh\n"
                            "  workload_kind: job\n", {"main.sh": "#!/bin/sh\nsleep 60\n"})
        run = self.server.tau("run", "--detach", spec, check=0).stdout.strip()
        self.assertEqual(complete(env, "logs", run[:6]), [run])
        self.server.tau("cancel", run, check=0)

    def test_zsh_and_fish_scripts(self):
        zsh = self.server.tau("completion", "zsh", check=0).stdout
        self.assertIn("bashcompinit", zsh)
        fish = self.server.tau("completion", "fish", check=0).stdout
        self.assertIn("complete -c tau -n '__fish_use_subcommand' -a cancel", fish)
        self.assertIn("complete -c tau -n '__fish_seen_subcommand_from server' -a stop", fish)
        if shutil.which("fish"):
            p = subprocess.run(["fish", "-n"], input=fish, capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
        p = self.server.tau("completion", "tcsh", check=125)


if __name__ == "__main__":
    unittest.main()
