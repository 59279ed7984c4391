"""What `tau top` and `tau gpus` show people: memory in binary units (never `24683772Ki`), RECENT
RUNS holding ended runs only (not a copy of ACTIVE RUNS), and which run holds each GPU."""
import re
import unittest

from harness import ServerTestCase

SPEC = ("schema_version: 1\nname: {name}\nrun:\n  entrypoint: main.sh\n  workload_kind: job\n"
        "compute:\n  gpus: {gpus}\n  workers: 1\n")


class DisplayTest(ServerTestCase):
    gpus = 2

    def test_top_and_gpus_show_memory_recent_runs_and_gpu_holders(self):
        done = self.submit(SPEC.format(name="done", gpus=0), {"main.sh": "#!/bin/sh\ntrue\n"})
        self.server.wait_state(done, "Succeeded")
        holder = self.submit(SPEC.format(name="holder", gpus=1),
                             {"main.sh": "#!/bin/sh\nsleep 120\n"})
        self.server.wait_state(holder, "Running")
        gpu = self.server.run_json(holder)["run"]["gpus"][0]

        top = self.server.tau("top", "--once", check=0).stdout
        # Memory in people's units: no long Ki numbers in the queues' usage.
        self.assertNotRegex(top, r"memory=\S*\d{4,}Ki", top)
        self.assertRegex(top, r"memory=\S+/[\d.]+(Mi|Gi|Ti)", top)
        active, recent = top.split("RECENT RUNS", 1)
        recent = recent.split("GPUS", 1)[0]
        self.assertIn(holder, active)
        self.assertNotIn(holder, recent)  # a running run is not recent: only ended ones
        self.assertIn(done, recent)
        # The GPU's line names the run that holds it.
        gpus = top.split("GPUS", 1)[1]
        held = [line for line in gpus.splitlines() if line.strip().startswith(str(gpu) + " ")]
        self.assertEqual(len(held), 1, gpus)
        self.assertIn(holder, held[0])

        table = self.server.tau("gpus", check=0).stdout
        self.assertIn("RUN", table.splitlines()[0])
        rows = {line.split()[0]: line for line in table.splitlines()[1:]}
        self.assertIn(holder, rows[str(gpu)])
        other = str(1 - gpu)
        self.assertNotIn(holder, rows[other])
        self.assertNotRegex(table, r"\d{4,}Ki")
        self.server.tau("cancel", holder, check=0)


if __name__ == "__main__":
    unittest.main()
