"""A private PostgreSQL cluster a test starts itself, to stop hard and start again (issue 46).

Why not the suite's shared server (TASKGROVE_TEST_POSTGRES_URL): a test that crashes the server
must own it. The cluster is `initdb` + `pg_ctl` from /usr/lib/postgresql/<version>/bin, in a
directory of its own, listening on 127.0.0.1 on a free port (its socket in that directory too).
PostgreSQL refuses to run as root: as root, every command runs as the `postgres` user
(`runuser`), and the directory is handed to that user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.servers import free_port


def binaries() -> Path | None:
    """The newest installed PostgreSQL's bin directory with initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found and Path(found[-1]).with_name("initdb").exists() else None


def why_not() -> str | None:
    """Why a private cluster cannot run here, or None when it can."""
    if binaries() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root without runuser to run the server as 'postgres'"
    return None


class Cluster:
    def __init__(self) -> None:
        bin_dir = binaries()
        assert bin_dir is not None, why_not()
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="taskgrove-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        if check and done.returncode != 0:
            raise AssertionError(f"{tool} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n{self.server_log()}")
        return done

    def start(self) -> None:
        # fsync off only matters when the machine crashes; commits stay synchronous, so what was
        # acknowledged survives `crash()` as it would in production.
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c max_connections=100")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def crash(self) -> None:
        """`pg_ctl stop -m immediate`: every backend is gone at once, no checkpoint (recovery at
        the next start), as after a crash."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def server_log(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def remove(self) -> None:
        self.stop()
        for _ in range(3):
            shutil.rmtree(self.root, ignore_errors=True)
            if not self.root.exists():
                return
            time.sleep(0.2)
