"""A throwaway PostgreSQL server on its own data folder (``scripts/postgres-server.sh``).

For the benches that need a real server (``decision_log_bench``, ``log_outage_bench``) and for
the test suite when ``scripts/with-vllm-server.sh`` did not start one (``tests/_postgres.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres-server.sh"


class ThrowawayPostgres:
    """Start with :meth:`start` (returns the URL); :meth:`stop` shuts it down and removes its data."""

    def __init__(self, prefix: str) -> None:
        # Not under pytest's private temp folder: the server's own user must reach its state.
        self.state = Path(tempfile.mkdtemp(prefix=prefix))
        os.chmod(self.state, 0o755)
        self.env = {**os.environ, "CAPGATE_PG_STATE_DIR": str(self.state)}
        self.url = ""

    def start(self) -> str:
        """Start the server; its URL, or :class:`RuntimeError` with the script's last words (the
        data folder removed)."""
        done = subprocess.run(["bash", str(SCRIPT), "start"], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(self.state, ignore_errors=True)
            raise RuntimeError(f"could not start PostgreSQL: {done.stderr.strip()[-400:]}")
        self.url = done.stdout.strip()
        return self.url

    def stop(self) -> None:
        """Shut the server down and remove its data folder."""
        subprocess.run(["bash", str(SCRIPT), "stop"], env=self.env, capture_output=True, check=False)
        shutil.rmtree(self.state, ignore_errors=True)
