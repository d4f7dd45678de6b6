"""A command run inside another process leaves that process's logging as it found it.

``replayq`` commands that load an app log through a redacting handler on the root
logger when none is configured (``cli/env.py``). A process that runs a command in
itself (``main([...], standalone_mode=False)``, as click's ``CliRunner`` does) and
configures its own logging afterwards must get what it configures: a real Python
process, outside pytest (whose capture puts handlers on the root logger).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import logging, sys
from replayq.cli import main

main(["--db", sys.argv[1], "jobs", "list"], standalone_mode=False)
logging.basicConfig(filename=sys.argv[2], level=logging.INFO, format="%(name)s %(message)s")
logging.getLogger("shop").info("configured after the command")
"""


def test_logging_configured_after_an_in_process_command_takes_effect(tmp_path: Path) -> None:
    log = tmp_path / "shop.log"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'q.db'}", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert log.exists(), f"basicConfig did nothing after the command: {done.stderr}"
    assert log.read_text() == "shop configured after the command\n"
