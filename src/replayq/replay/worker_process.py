"""A bulk dry-run's worker process: ``python -m replayq.replay.worker_process``.

Started by ``replayq.replay.bulk`` with a fresh interpreter; reads its set-up and
batches of job ids as JSON lines on stdin, answers each batch with one JSON line of
reports (``bulk.serve``). The answers go to the stdout it was started with; anything
else that writes to stdout (a handler's ``print``) lands on stderr instead, so it
cannot garble them. Nothing imports this module.
"""

from __future__ import annotations

import os
import sys

from replayq.replay.bulk import serve

if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, answers)
