"""A throwaway PostgreSQL server for tests: initdb in a temp dir, listening on 127.0.0.1 only.

Uses Debian's `postgresql` package (which .ci/run installs); tests skip when it is absent. As root
(CI), the server runs as the `postgres` user the package creates, since PostgreSQL refuses root.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.support.ports import free_port


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class PostgresServer:
    def __init__(self, root: Path):
        self.root, self.data, self.port = root, root / "data", None

    @staticmethod
    def missing() -> str | None:
        if not (_bin("initdb") and _bin("pg_ctl")):
            return "PostgreSQL is not installed (apt-get install postgresql)"
        if os.geteuid() == 0 and not shutil.which("runuser"):
            return "runuser (util-linux) is needed to run PostgreSQL as its own user"
        try:
            import psycopg  # noqa: F401  # lazy: the optional 'postgres' extra; its absence is a skip reason
        except ImportError:
            return "psycopg is not installed"
        return None

    def start(self) -> "PostgresServer":
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.port = free_port()
        run = dict(check=True, capture_output=True, timeout=120)
        subprocess.run(
            _as_owner(
                [_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]
            ),
            **run,
        )
        opts = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} -c fsync=off"
        subprocess.run(
            _as_owner(
                [
                    _bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    opts,
                    "-l",
                    str(self.root / "log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            **run,
        )
        return self

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg  # lazy: the optional 'postgres' extra (see missing)

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            _as_owner([_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]),
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 10
        while (self.data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
