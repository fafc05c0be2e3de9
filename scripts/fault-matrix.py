#!/usr/bin/env python3
"""Runs the fault-matrix test (or reads its output) and prints the matrix as a Markdown table.

Each survivor of a cell prints "fault-matrix: <victim>_<fault>_<phase> rank=R seconds=S ...";
a table cell shows the slowest survivor's time to error and whether every survivor passed.
The network-cut cells run in the multi-host namespace setup (tests/multinode, root only); their
lines come from every rank, the cut-off host's too.

  scripts/fault-matrix.py build/tests/core/weft_fault_matrix_test   # run it (all cells, -j2)
  scripts/fault-matrix.py build/tests/core/weft_fault_matrix_test \
      --multinode build/tests/multinode/weft_multinode_check        # and the network cuts
  scripts/fault-matrix.py - < output.txt                            # collect a saved run
"""
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

PHASES = ["init", "split", "blocking_allreduce", "stream_allreduce", "group_sendrecv",
          "direct_path", "registered_zero_copy"]
ROWS = [("root", "kill"), ("root", "stop"), ("root", "cut"), ("nonroot", "kill"),
        ("nonroot", "stop"), ("nonroot", "cut"), ("root_and_nonroot", "kill"),
        ("root_and_nonroot", "stop"), ("two_nonroots", "kill"), ("two_nonroots", "stop")]
VICTIMS = {"root": "rank 0 (root)", "nonroot": "rank 2", "root_and_nonroot": "ranks 0 and 3 (of 4)",
           "two_nonroots": "ranks 2 and 3 (of 4)"}
CUT_VICTIMS = {"root": "host a (root's)", "nonroot": "host c"}
FAULTS = {"kill": "SIGKILL", "stop": "SIGSTOP", "cut": "network cut"}
CUT_PHASES = {"init": "init", "split": "split", "blocking": "blocking_allreduce", "stream": "stream_allreduce",
              "group": "group_sendrecv"}
LINE = re.compile(r"fault-matrix: (\w+?)_(kill|stop|cut)_(\w+) rank=(\d+) seconds=([\d.]+)")
MULTINODE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "multinode", "multinode_test.sh")


def run_cells(binary):
    """Runs every cell as its own process, two at a time; returns the output and failed cells."""
    names = [f"Cells/FaultMatrix.SurvivorsFailWithinTheBoundNamingTheVictim/{v}_{f}_{p}"
             for v, f in ROWS if f != "cut" for p in PHASES]

    def one(name):
        done = subprocess.run([binary, f"--gtest_filter={name}"], capture_output=True, text=True)
        return done.stdout + done.stderr, done.returncode != 0

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, names))
    failed = {name.rsplit("/", 1)[1] for name, (_, bad) in zip(names, results) if bad}
    return "".join(text for text, _ in results), failed


def run_cut_cells(check_binary):
    """Runs the network-cut cells one at a time (they share the namespaces' addresses)."""
    text, failed = "", set()
    with tempfile.TemporaryDirectory(prefix="weft-fault-matrix-") as work:
        for victim in ("root", "nonroot"):
            for phase, phase_name in CUT_PHASES.items():
                done = subprocess.run(["bash", MULTINODE_SCRIPT, "cut", check_binary,
                                       os.path.join(work, f"{victim}_{phase}"), victim, phase],
                                      capture_output=True, text=True)
                text += done.stdout + done.stderr
                if done.returncode == 77:
                    print(f"network cut cells skipped: {done.stdout.strip()}", file=sys.stderr)
                    return text, failed
                if done.returncode != 0:
                    failed.add(f"{victim}_cut_{phase_name}")
    return text, failed


def main():
    args = sys.argv[1:]
    multinode = None
    if len(args) == 3 and args[1] == "--multinode":
        multinode = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.exit(__doc__)
    if args[0] == "-":
        text, failed = sys.stdin.read(), set()
        failed = set(re.findall(r"\[  FAILED  \] \S+/(\w+),", text))
        failed |= set(re.findall(r"multinode_test\[cut (\w+)\]: FAIL", text))
    else:
        text, failed = run_cells(args[0])
        if multinode:
            cut_text, cut_failed = run_cut_cells(multinode)
            text += cut_text
            failed |= cut_failed
    seconds = {}
    for victim, fault, phase, _rank, value in LINE.findall(text):
        key = (victim, fault, phase)
        seconds[key] = max(seconds.get(key, 0.0), float(value))
    print("| victim | fault | " + " | ".join(PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    for victim, fault in ROWS:
        cells = []
        for phase in PHASES:
            key = (victim, fault, phase)
            mark = " FAIL" if f"{victim}_{fault}_{phase}" in failed else ""
            cells.append(f"{seconds[key]:.2f} s{mark}" if key in seconds else f"–{mark}")
        who = CUT_VICTIMS[victim] if fault == "cut" else VICTIMS[victim]
        print(f"| {who} | {FAULTS[fault]} | " + " | ".join(cells) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
