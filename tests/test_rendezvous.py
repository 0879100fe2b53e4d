"""Forming a run without a host list: ranks started in random order meet at one address.

Three ranks with the cluster file and ``--rendezvous`` (two `akorun worker`
processes, one `akorun.run_worker(None, ..., rendezvous=...)`; no ``--rank``) start
in a random order on loopback, get ranks 0..2 from the rendezvous and end with equal
replicas under plain SGD; a rank variable (a Kubernetes indexed Job's
JOB_COMPLETION_INDEX, given to one of them) is kept. The rendezvous's own
rules (ranks asked for, arrival order, a taken rank, a full run) and the one-line
errors are tested here too."""

from __future__ import annotations

import random
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from akorun.errors import UsageError
from akorun.launching.cluster import free_ports, requested_rank
from akorun.launching.rendezvous import Registry, parse_address
from akorun.testing import REPO_ROOT, akorun_command, child_test_env, wait_for

pytestmark = pytest.mark.timeout(300)
WORKERS = 3


def _init(tmp_path: Path) -> Path:
    cluster = tmp_path / "cluster.toml"
    result = subprocess.run(akorun_command("init", "--workers", str(WORKERS), "--rounds", "6",
                                           "--optimizer", "sgd", "--lr", "0.1",
                                           "--out", str(cluster)),
                            capture_output=True, text=True, env=child_test_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    return cluster


def test_three_ranks_started_in_random_order_form_a_run_and_end_equal(tmp_path: Path) -> None:
    cluster = _init(tmp_path)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    out = tmp_path / "run"
    order = list(range(WORKERS))
    random.shuffle(order)
    procs = []
    api = (f"import akorun; akorun.run_worker(None, {str(cluster)!r}, out={str(out)!r}, "
           f"rendezvous={address!r}, peer_timeout='5s')")
    for index in order:  # index 1 is a Kubernetes indexed Job's pod: it keeps rank 1
        env = child_test_env({"JOB_COMPLETION_INDEX": "1"} if index == 1 else {})
        log = open(tmp_path / f"process-{index}.log", "w")  # noqa: SIM115 -- closed below
        command = akorun_command("worker", "--config", str(cluster), "--rendezvous", address,
                                 "--out", str(out), "--peer-timeout", "5s")
        if index == 2:  # the Python API, as a rank of the same run
            command = [sys.executable, "-c", api]
        procs.append((index, log, subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)))
    for _, log, proc in procs:
        proc.wait(timeout=240)
        log.close()
    logs = {index: (tmp_path / f"process-{index}.log").read_text() for index, _, _ in procs}
    assert all(proc.returncode == 0 for _, _, proc in procs), logs
    ranks = {}
    for index, text in logs.items():
        line = next(line for line in text.splitlines() if "rendezvous at" in line)
        ranks[index] = int(line.split(": rank ")[1].split()[0])
    assert sorted(ranks.values()) == list(range(WORKERS)) and ranks[1] == 1, logs
    replicas = []
    for rank in range(WORKERS):
        with np.load(out / f"worker-{rank}.npz") as data:
            replicas.append(np.array(data["params"]))
    for replica in replicas[1:]:
        np.testing.assert_allclose(replica, replicas[0], rtol=1e-5, atol=1e-6)


def test_the_registry_keeps_ranks_asked_for_and_gives_the_others_by_arrival() -> None:
    registry = Registry(4)
    registry.register("a", None, "h:1")
    registry.register("b", 0, "h:2")
    registry.register("a", None, "h:1")  # a retry changes nothing
    registry.register("c", None, "h:3")
    with pytest.raises(ValueError, match="rank 0 is taken by the process at h:2"):
        registry.register("x", 0, "h:9")
    with pytest.raises(ValueError, match="h:3 is registered by another process"):
        registry.register("x", None, "h:3")
    assert not registry.complete
    registry.register("d", 3, "h:4")
    assert registry.complete and registry.ranks == {"a": 1, "b": 0, "c": 2, "d": 3}
    assert registry.hosts() == ("h:2", "h:1", "h:3", "h:4")
    with pytest.raises(ValueError, match="4 ranks have all registered"):
        registry.register("e", None, "h:5")


def test_rank_variables_of_slurm_and_kubernetes_and_none() -> None:
    assert requested_rank(None, {}, 3) is None
    assert requested_rank(None, {"JOB_COMPLETION_INDEX": "2"}, 3) == 2
    assert requested_rank(None, {"SLURM_PROCID": "1", "SLURM_NTASKS": "3"}, 3) == 1
    with pytest.raises(UsageError, match="SLURM_NTASKS=4 disagrees"):
        requested_rank(None, {"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, 3)
    with pytest.raises(UsageError, match="JOB_COMPLETION_INDEX .Kubernetes. 5 is out of range"):
        requested_rank(None, {"JOB_COMPLETION_INDEX": "5"}, 3)
    assert parse_address("[::1]:29400") == ("::1", 29400)


@pytest.mark.parametrize(("flags", "said"), [
    (("--rendezvous", "node01"), "expected HOST:PORT"),
    (("--rendezvous", "node01:http"), "expected HOST:PORT"),
    (("--rendezvous", ":29400"), "expected HOST:PORT"),
    (("--rendezvous", "node01:70000"), "expected HOST:PORT"),
    (("--rendezvous", "127.0.0.1:29400", "--resume"), "--resume cannot meet the others")])
def test_bad_rendezvous_input_is_one_line_and_exit_2(tmp_path: Path, flags: tuple[str, ...],
                                                     said: str) -> None:
    cluster = _init(tmp_path)
    result = subprocess.run(akorun_command("worker", "--config", str(cluster), *flags),
                            capture_output=True, text=True, env=child_test_env(),
                            cwd=REPO_ROOT, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], lines


def test_a_rank_with_another_runs_cluster_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """The rendezvous answers only holders of the run's secret: a process with the
    cluster file of another run gets a 401 and exits 2 with one line."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    address = f"127.0.0.1:{free_ports(1)[0]}"
    serving = subprocess.Popen(
        akorun_command("worker", "--config", str(_init(ours)), "--rendezvous", address,
                       "--join-timeout", "60s"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_test_env(),
        cwd=REPO_ROOT)
    try:
        wait_for(lambda: _listening(address), 60, "the first process serving the rendezvous")
        result = subprocess.run(akorun_command("worker", "--config", str(_init(theirs)),
                                               "--rendezvous", address),
                                capture_output=True, text=True, env=child_test_env(),
                                cwd=REPO_ROOT, timeout=60)
    finally:
        serving.kill()
        serving.wait()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused our registration (401)" in lines[0], lines


def _listening(address: str) -> bool:
    host, port = parse_address(address)
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


def test_the_slurm_and_kubernetes_examples_start_ranks_at_a_rendezvous() -> None:
    """The examples' command lines are akorun's own (parsed here), without a rank or a
    host list, and give the ranks the rendezvous address by the environment."""
    from akorun.launching.cli_parser import build_parser

    sbatch = (REPO_ROOT / "examples" / "slurm" / "akorun.sbatch").read_text()
    srun = next(line for line in sbatch.splitlines() if line.startswith("srun akorun"))
    args = build_parser().parse_args(shlex.split(srun)[2:])
    assert args.command == "worker" and args.config == "cluster.toml" and args.rank is None
    assert 'export AKORUN_RENDEZVOUS="$head_address:29400"' in sbatch
    yaml = pytest.importorskip("yaml")
    manifest = (REPO_ROOT / "examples" / "kubernetes" / "akorun-job.yaml").read_text()
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(manifest)}
    job = documents["Job"]["spec"]
    pod = job["template"]["spec"]
    container = pod["containers"][0]
    args = build_parser().parse_args(container["command"][1:])
    assert args.command == "worker" and args.rank is None and args.rendezvous is None
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"]
    address = {item["name"]: item["value"] for item in container["env"]}["AKORUN_RENDEZVOUS"]
    host, _ = parse_address(address)
    service = documents["Service"]
    assert host == f"akorun-0.{pod['subdomain']}" and pod["subdomain"] == \
        service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
