"""Instructions per job of a traced job that takes ``ctx.lock`` and writes, by callgrind.

The same one-step job three ways, each on a fresh SQLite file, leased and executed
inline on one thread (lease one, execute it), so the count barely moves between runs:

* ``none``: the step reads and writes ``order:<n>``, no lock (the job without one);
* ``inner``: the lock on ``warehouse:1`` taken inside the step around the write (its
  release waits for the step's commit);
* ``outer``: the lock taken around the step.

The jobs are enqueued in a process of their own before valgrind starts; instructions
per job = (the run of ``--jobs`` jobs - the run of ``--base`` jobs) / the difference, so
the interpreter's start and the imports cancel out. User space only. The lock's own
cost is ``inner`` or ``outer`` minus ``none`` from the same invocation.

    python benchmarks/lock_instructions.py [--jobs 120] [--base 20]
                                           [--variants none,inner,outer] [--json]

The tree measured is the one ``replayq`` is imported from (``PYTHONPATH=<tree>/src``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from machine import callgrind_count, commit, load_average

SCRIPT = """
import sys
import replayq

path, jobs, variant, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
app = replayq.App("sqlite:///" + path, auto_migrate=True)


@app.job("locked")
def locked(ctx: replayq.Context, n: int) -> int:
    if variant == "inner":
        with ctx.step("reserve"):
            with ctx.lock("warehouse:1", ttl="30s"):
                ctx.state.get("order", n)
                ctx.state.put("order", n, {"n": n})
    elif variant == "outer":
        with ctx.lock("warehouse:1", ttl="30s"), ctx.step("reserve"):
            ctx.state.get("order", n)
            ctx.state.put("order", n, {"n": n})
    else:
        with ctx.step("reserve"):
            ctx.state.get("order", n)
            ctx.state.put("order", n, {"n": n})
    return n


if mode == "enqueue":
    app.enqueue_many([replayq.EnqueueRequest("locked", {"n": n}) for n in range(jobs)])
else:
    worker = replayq.Worker(app, worker_id="counted")
    done = 0
    while leased := worker.lease(1):
        for job in leased:
            worker.execute(job)
            done += 1
    assert done == jobs, done
    assert all(app.get_job(i + 1).state is replayq.JobState.SUCCEEDED for i in range(jobs))
app.close()
"""


def counted(variant: str, jobs: int) -> int:
    """Instructions of one process that leases and executes ``jobs`` fresh jobs."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "queue.db")
        script = os.path.join(directory, "locked_job.py")
        with open(script, "w") as file:
            file.write(SCRIPT)
        args = [path, str(jobs), variant]
        subprocess.run([sys.executable, script, *args, "enqueue"], check=True)
        out = os.path.join(directory, "callgrind.out")
        run = [sys.executable, script, *args, "run"]
        return callgrind_count(run, out, f"{variant}: the counted run")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=120, help="jobs of the larger run")
    parser.add_argument("--base", type=int, default=20, help="jobs of the smaller run")
    parser.add_argument("--variants", default="none,inner,outer", help="comma-separated")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    per_job = {}
    for variant in args.variants.split(","):
        large, small = counted(variant, args.jobs), counted(variant, args.base)
        per_job[variant] = (large - small) // (args.jobs - args.base)
    result = {
        "instructions_per_job": per_job,
        "lock_cost": {v: n - per_job["none"] for v, n in per_job.items() if "none" in per_job},
        "jobs": args.jobs,
        "base": args.base,
        "load_average": load_average(),
        "commit": commit(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for variant, count in per_job.items():
        extra = result["lock_cost"].get(variant)
        print(
            f"{variant:>6}: {count:>10,} instructions a job" + (f" ({extra:+,})" if extra else "")
        )


if __name__ == "__main__":
    main()
