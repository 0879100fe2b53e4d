"""A port in use is reported before JAX is loaded: one line naming the port, exit 2.

`akorun worker` (every rank `akorun launch` starts is one) probes its port
before it builds the workload; the subprocess reports whether JAX had been
imported when the command returned.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from akorun.errors import UsageError
from akorun.launching.cluster import read_cluster_file
from akorun.runtime.endpoints import split_host
from akorun.testing import REPO_ROOT, akorun_command, child_test_env
from akorun.transport.port_check import check_port_free

pytestmark = pytest.mark.timeout(120)

REPORTS_JAX = ("import sys\n"
               "from akorun.launching.commands import main\n"
               "code = main(sys.argv[1:])\n"
               "print('jax imported' if 'jax' in sys.modules else 'jax not imported')\n"
               "sys.exit(code)\n")


def _listening(host: str, port: int) -> socket.socket:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind((host, port))
    holder.listen(1)
    return holder


def test_the_probe_refuses_a_port_another_socket_listens_on_and_passes_a_free_one() -> None:
    with _listening("127.0.0.1", 0) as holder:
        port = holder.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port} on 127.0.0.1 is in use \\(rank 4\\)"):
            check_port_free("127.0.0.1", port, 4)
    check_port_free("127.0.0.1", port, 4)  # closed: free again
    check_port_free("no-such-host.invalid", port, 0)  # the server names a bad host


def test_akorun_worker_names_a_port_in_use_before_importing_jax(tmp_path: Path) -> None:
    cluster_file = tmp_path / "cluster.toml"
    env = child_test_env()
    made = subprocess.run(akorun_command("init", "--workers", "2", "--rounds", "3", "--out",
                                         str(cluster_file)),
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=60)
    assert made.returncode == 0, made.stderr
    host, port = split_host(read_cluster_file(cluster_file).config.cluster.hosts[1])
    with _listening(host, port):
        result = subprocess.run([sys.executable, "-c", REPORTS_JAX, "worker", "--rank", "1",
                                 "--config", str(cluster_file), "--quiet"],
                                capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                                timeout=90)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"akorun worker: error: port {port} on {host} is in use (rank 1); stop "
                     f"what holds it or write a new cluster file with `akorun init`"], lines
    assert result.stdout.strip() == "jax not imported"
