"""Many nodes on one shared filesystem, simulated on this host: the pytest controller and two `torchrun --nnodes=2`
launches on localhost (c10d rendezvous, gloo), all on one temporary directory; real processes, files and signals."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from ckptqual.config.run_settings import host_rank_capacity, resolve_settings
from ckptqual.config.values import SettingsError
from ckptqual.host.cpu import HostSampler
from ckptqual.plan.workloads import load_workload
from ckptqual.runs import cluster
from ckptqual.runs.cluster import Pulse, Worker, shifted_readers
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.node import STOP, beat_key
from ckptqual.runs.secret import write_secret
from ckptqual.runs.wire import CONTROLLER, Wire
from suite_runs import REPO, LiveSuite, lenient_drive, parent, user_environment

# The workloads of these runs: llama3-8b-dp2, one rank a node, where the point is the run's messages, not its ranks;
# the same model on four ranks, two a node (`workload_of`), where a node's several ranks are the point.
PAIR = "llama3-8b-dp2"
# How long a torchrun agent waits on a call to the rendezvous store (hosted by one of the agents) before it gives up:
# an agent whose rendezvous host died ends after this (docs/many-nodes.md).
RENDEZVOUS_READ_TIMEOUT_S = 10
SCALE = 0.0002
TINY = ["--scale", str(SCALE), "--sample-interval", "0"]
FILL_AND_RESTORE = ("test_fill.py", "test_restore.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def processes_of(run_id: str) -> dict[int, dict[str, str]]:
    """Every live process of the torchrun job `run_id`, agents (by their command line) and workers (by the
    TORCHELASTIC_RUN_ID torchrun gives them): PID -> its environment."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        variables = dict(item.split("=", 1) for item in environ.decode(errors="replace").split("\0") if "=" in item)
        if state != "Z" and (run_id.encode() in command or variables.get("TORCHELASTIC_RUN_ID") == run_id):
            found[int(entry.name)] = variables
    return found


def listener(port: int) -> int:
    """The PID of the process listening on TCP `port` of this host (from /proc/net/tcp* and the processes' fds)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                return int(entry.name)
    raise AssertionError(f"nothing listens on port {port}")


def workload_of(tmp_path: Path, ranks: int) -> str:
    """LLaMA 3 8B on `ranks` data-parallel ranks (ZeRO-3): llama3-8b-dp2 for two, else a workload file written here."""
    if ranks == 2:
        return PAIR
    path = tmp_path / f"llama3-8b-dp{ranks}.toml"
    pair = (REPO / "fixtures" / "workloads" / f"{PAIR}.toml").read_text()
    path.write_text(pair.replace("dp = 2\n", f"dp = {ranks}\n").replace("on two ranks", f"on {ranks} ranks"))
    return str(path)


class TwoNodes:
    """A run over two simulated nodes: the suite as controller, and one torchrun launch per node of `per_node` ranks
    each, for a plan of `workload` (default: one of as many ranks as both nodes start)."""

    def __init__(
        self,
        tmp_path: Path,
        *suite_args: str,
        tests: tuple[str, ...] = FILL_AND_RESTORE,
        per_node: int = 1,
        workload: str | None = None,
    ) -> None:
        self.workload = workload or workload_of(tmp_path, 2 * per_node)
        self.run_id = f"ckptqual-test-{uuid.uuid4().hex[:8]}"
        self.target, self.results = tmp_path / "shared", tmp_path / "results.json"
        self.target.mkdir()
        self.port, self.secret = free_port(), tmp_path / "job.secret"
        controller = f"127.0.0.1:{self.port}"
        drive = lenient_drive(tmp_path / "lenient.toml", "lenient drive")
        self.suite = LiveSuite(
            tmp_path / "controller.log",
            *("--nodes", "2", "--controller", controller, "--target", str(self.target), "--drive", str(drive)),
            *("--secret-file", str(self.secret), "--results", str(self.results), *TINY, *suite_args),
            *("--workload", self.workload),
            tests=tests,
        )
        self.rendezvous_port = free_port()
        rendezvous = f"127.0.0.1:{self.rendezvous_port}"
        self.logs = [tmp_path / f"node-launch-{index}.log" for index in range(2)]
        self.launches = [self._torchrun(log, rendezvous, controller, per_node) for log in self.logs]

    def _torchrun(self, log: Path, rendezvous: str, controller: str, per_node: int) -> subprocess.Popen:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous}", f"--rdzv-id={self.run_id}", "--max-restarts=0",
            f"--rdzv-conf=read_timeout={RENDEZVOUS_READ_TIMEOUT_S}",
            "-m", "ckptqual.cli", "node", "--controller", controller, "--secret-file", str(self.secret),
        ]  # fmt: skip
        with log.open("w") as out:
            return subprocess.Popen(command, cwd=REPO, env=user_environment(), stdout=out, stderr=subprocess.STDOUT)

    def finish(self, timeout_s: float = 300) -> tuple[int, list[int | None]]:
        """The suite's exit code, and each launch's once it ended (None: it did not end within a minute more)."""
        code = self.suite.finish(timeout_s)
        deadline = time.monotonic() + 60
        for launch in self.launches:
            with contextlib.suppress(subprocess.TimeoutExpired):  # asked below: whether it ended
                launch.wait(timeout=max(0.1, deadline - time.monotonic()))
        return code, [launch.poll() for launch in self.launches]

    def output(self) -> str:
        launches = "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-2000:]}" for log in self.logs)
        return f"{self.suite.output()[-4000:]}\n{launches}"

    def data(self) -> dict:
        return json.loads(self.results.read_text())

    def kill_leftovers(self) -> None:
        """Teardown: nothing of this test may outlive it, whatever it asserted."""
        self.suite.process.kill()
        for pid in processes_of(self.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for launch in self.launches:
            launch.kill()
            launch.wait()
        self.suite.process.wait()


@pytest.fixture
def two_nodes(tmp_path) -> Iterator[Callable[..., TwoNodes]]:
    started: list[TwoNodes] = []

    def start(*args: str, **kwargs) -> TwoNodes:
        started.append(TwoNodes(tmp_path, *args, **kwargs))
        return started[-1]

    yield start
    for run in started:
        run.kill_leftovers()


def test_two_nodes_write_exactly_their_planned_files_and_the_slowest_rank_is_the_time(two_nodes):
    run = two_nodes("--checkpoints-per-pass", "2", "--passes", "1", "--keep", per_node=2)
    code, launches = run.finish()
    data = run.data()
    assert data["errors"] == [], run.output()
    assert launches == [0, 0], run.output()  # both nodes stopped as planned when the run ended
    assert code in (0, 1), run.output()  # QUALIFIED, or a verdict on figures this busy host measured
    plan = load_workload(run.workload).plan().scaled(SCALE)
    assert data["settings"]["nodes"] == 2 and len(plan.ranks) == 4
    checkpoints = data["checkpoints"]
    assert len(checkpoints) == 2
    for checkpoint in checkpoints:
        ranks = checkpoint["ranks"]
        assert [r["rank"] for r in ranks] == list(range(4)) and {r["node"] for r in ranks} == {0, 1}
        assert [(r["bytes"], r["files"]) for r in ranks] == [(rank.nbytes, len(rank.files)) for rank in plan.ranks]
        # MLPerf Storage's timing: the slowest rank of all nodes is the checkpoint's time, the throughput the total's.
        assert checkpoint["seconds"] == max(r["done_s"] for r in ranks)
        assert (
            checkpoint["bytes"] == plan.total_bytes
            and checkpoint["GBps"] == plan.total_bytes / checkpoint["seconds"] / 1e9
        )
        nodes = checkpoint["nodes"]
        assert [n["node"] for n in nodes] == [0, 1]
        for node in nodes:
            mine = [r for r in ranks if r["node"] == node["node"]]
            assert node["ranks"] == [r["rank"] for r in mine] and len(mine) == 2
            assert node["seconds"] == max(r["done_s"] for r in mine)
            assert node["slowest_rank"] == max(mine, key=lambda r: r["done_s"])["rank"]
            assert node["bytes"] == sum(r["bytes"] for r in mine) and node["read_files_of_node"] is None
        assert checkpoint["seconds"] == max(n["seconds"] for n in nodes)
    # Every rank wrote exactly its planned files: no more, no fewer, each holding its planned tensors.
    (run_dir,) = run.target.glob("ckptqual-run-*")
    for checkpoint in checkpoints:
        directory = run_dir / "checkpoints" / f"checkpoint-{checkpoint['checkpoint']:05d}"
        planned = {spec.path: spec for rank in plan.ranks for spec in rank.files}
        assert {str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()} == set(planned)
        for path, spec in planned.items():
            state = torch.load(directory / path, weights_only=True, mmap=True)
            assert [(t.name, t.nbytes) for t in spec.tensors] == [(k, v.nbytes) for k, v in state.items()]
    # The restore read every file back, each node what the other wrote, every byte checked against its writer's rank.
    (restore,) = data["restore"]
    assert [(n["node"], n["read_files_of_node"]) for n in restore["nodes"]] == [(0, 1), (1, 0)]
    assert restore["bytes"] == plan.total_bytes
    assert restore["seconds"] == max(r["done_s"] for r in restore["ranks"])
    restored = data["tests"]["tests_qual/test_restore.py::test_restore"]
    host_limited = ("host-bound", "verification was the bottleneck")  # this busy host's, not the files'
    assert restored["outcome"] in ("PASS", "MARGINAL") or any(why in restored["message"] for why in host_limited)
    assert processes_of(run.run_id) == {}


def test_a_killed_node_fails_the_run_on_both_nodes_within_the_rank_timeout_and_nothing_is_left(two_nodes):
    timeout_s = 60
    run = two_nodes("--checkpoints-per-pass", "50", "--passes", "1", "--rank-timeout", str(timeout_s), per_node=2)
    run.suite.wait_for("ckptqual: pass 1 checkpoint 1/50")
    # The worst node to lose: the one whose torchrun agent hosts the rendezvous store the other agent relies on.
    agent = listener(run.rendezvous_port)
    workers = {pid: env for pid, env in processes_of(run.run_id).items() if parent(pid) == agent}
    assert len(workers) == 2 and agent in [launch.pid for launch in run.launches]
    (node,) = {env["GROUP_RANK"] for env in workers.values()}
    killed_at = time.monotonic()
    for pid in (agent, *workers):
        os.kill(pid, signal.SIGKILL)
    code, launches = run.finish(timeout_s=timeout_s + 60)
    # Found within the rank timeout (about 20 s alone); the rest is the other node's cleanup and report, which a
    # second test run beside this one (pytest -n 2 on 2 cores) can slow by half a minute.
    assert time.monotonic() - killed_at < timeout_s + 30, run.output()
    assert code != 0 and set(launches) == {1, -signal.SIGKILL}, (launches, run.output())
    assert processes_of(run.run_id) == {}, run.output()  # no agent or worker left on either node
    data = run.data()
    outcome = data["tests"]["tests_qual/test_fill.py::test_fill_pass[1]"]
    assert outcome["outcome"] == "ERROR", outcome
    error = outcome["message"]
    # The killed node is named whole; a rank of the other node that its own agent ended before it could tell what it
    # saw (torchrun stops its workers once the rendezvous is gone) may be named beside it.
    whole, also = rf"node {node} \(host [^)]+, all its 2 ranks\)", r"((; |, )rank \d on node \d \(host [^)]+\))*"
    assert re.search(rf"{whole}{also} stopped answering during checkpoint ", error), error
    assert "lost its peers (gloo: " in error, error
    assert data["cleanup"]["removed"] is True and list(run.target.iterdir()) == []


def test_ctrl_c_of_the_controller_ends_every_node_and_cleans_the_shared_target(two_nodes):
    """Ctrl-C at the controller's terminal (node 0's pytest; the other nodes' torchrun launches get no signal): the
    run is INCOMPLETE, every worker and agent on every node ends, and the shared target is left clean."""
    run = two_nodes("--checkpoints-per-pass", "50", "--passes", "1")
    run.suite.wait_for("ckptqual: pass 1 checkpoint 2/50")
    run.suite.process.send_signal(signal.SIGINT)
    code, launches = run.finish(timeout_s=120)
    assert code == 2, run.output()
    assert launches == [1, 1], (launches, run.output())  # both nodes' agents ended: their workers were stopped
    assert processes_of(run.run_id) == {}, run.output()
    data = run.data()
    assert data["verdict"]["overall"] == "INCOMPLETE" and "interrupted by SIGINT" in data["verdict"]["reasons"][0]
    assert data["tests"]["tests_qual/test_fill.py::test_fill_pass[1]"]["outcome"] == "INTERRUPTED"
    assert data["cleanup"]["removed"] is True and list(run.target.iterdir()) == []


class Payload:
    """A pickle that runs a shell command where it is unpickled: what a stranger on the controller's port sends."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return os.system, (self.command,)


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* shows them) that listen on TCP `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":
                found.add(local.rsplit(":", 1)[0])
    return found


def forged_ready(victim: int) -> bytes:
    """A "ready" event naming another process, signed with a made-up key."""
    body = {"node": 0, "local_rank": 0, "hostname": socket.gethostname(), "pid": victim, "starttime": "1",
            "sampler": {"cpus": [0], "stat": None, "device": None}}  # fmt: skip
    envelope = {"kind": "ready", "run": "0" * 16, "from": 0, "seq": 99, "body": body}
    return (
        Wire(b"k" * 32, "0" * 16, 0, 8)._mac("ckptqual/events", json.dumps(envelope).encode()).encode()
        + b"\n"
        + (json.dumps(envelope).encode())
    )


ATTACKS = {  # what the stranger does, and how the run's failure line must begin
    "pickle-event": (
        lambda client, payload, victim: client.queue_push("ckptqual/events", payload),
        "the controller refused a message in ckptqual/events from an unknown sender: it has no valid signature",
    ),
    "run-key": (
        lambda client, payload, victim: client.set("ckptqual/run", payload),
        "the controller found the run's settings in ckptqual/run replaced by an unknown sender",
    ),
    "own-tasks": (
        lambda client, payload, victim: [client.queue_push(f"ckptqual/tasks/{rank}", payload) for rank in range(2)],
        "rank ",  # the worker that popped it refused it, naming itself
    ),
    "forged-ready": (
        lambda client, payload, victim: client.queue_push("ckptqual/events", forged_ready(victim)),
        "the controller refused a message in ckptqual/events from an unknown sender: it has no valid signature",
    ),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_stranger_on_the_controllers_port_is_refused_reported_never_executed_and_the_run_is_not_qualified(
    two_nodes, tmp_path, attack
):
    """A real TCPStore client on 127.0.0.1, without the run's secret, writes into the running controller's store: a
    pickle into the events, over the run's settings, into every rank's task queue, or a "ready" naming another
    process. Nothing of it runs, the run fails naming the refusal, and no process is signalled."""
    run = two_nodes("--checkpoints-per-pass", "50", "--passes", "1", tests=("test_fill.py",))
    run.suite.wait_for("ckptqual: pass 1 checkpoint 1/50")
    assert listening_addresses(run.port) == {"0100007F"}, run.output()  # 127.0.0.1 only, not every interface
    marker, victim = tmp_path / "payload-ran", subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        client = torch.distributed.TCPStore("127.0.0.1", run.port, is_master=False, timeout=timedelta(seconds=30))
        act, refusal = ATTACKS[attack]
        act(client, pickle.dumps(Payload(f"touch {marker}")), victim.pid)
        code, launches = run.finish(timeout_s=240)
        data = run.data()
        assert code != 0 and data["verdict"]["overall"] != "QUALIFIED", run.output()
        message = data["tests"]["tests_qual/test_fill.py::test_fill_pass[1]"]["message"]
        assert refusal in message and "the run was stopped" in message, message
        if attack == "own-tasks":
            assert "refused a message in ckptqual/tasks/" in message and "from an unknown sender: it has" in message, (
                message
            )
        assert not marker.exists() and victim.poll() is None  # the payload never ran; the named process lives
        assert launches == [1, 1] and processes_of(run.run_id) == {}, run.output()
        assert data["cleanup"]["removed"] is True and list(run.target.iterdir()) == []
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("queue", ["ckptqual/events", "ckptqual/tasks/1"])
def test_a_message_a_stranger_pops_from_a_queue_ends_the_run_at_once_naming_the_queue_and_the_number(two_nodes, queue):
    """A real TCPStore client on 127.0.0.1 takes one message from a queue mid-run: a worker's event (a reply) or a
    rank's next task. The heartbeats say what was sent, so the run fails within seconds, not at the rank timeout,
    naming the queue and the missing number; no traceback, and every process ends."""
    timeout_s = 600
    run = two_nodes("--checkpoints-per-pass", "50", "--passes", "1", "--rank-timeout", str(timeout_s),
                    tests=("test_fill.py",))  # fmt: skip
    run.suite.wait_for("ckptqual: pass 1 checkpoint 1/50")
    client = torch.distributed.TCPStore("127.0.0.1", run.port, is_master=False, timeout=timedelta(seconds=120))
    while True:  # waits for the next message there, and takes it; where the receiver was quicker, the one after
        with contextlib.suppress(torch.distributed.QueueEmptyError):
            client.queue_pop(queue)
            break
    popped_at = time.monotonic()
    code, launches = run.finish(timeout_s=240)
    assert time.monotonic() - popped_at < 120, run.output()  # found at once; the rest is cleanup and the report
    data = run.data()
    assert code != 0 and data["verdict"]["overall"] != "QUALIFIED", run.output()
    message = data["tests"]["tests_qual/test_fill.py::test_fill_pass[1]"]["message"]
    receiver = "the controller" if queue.endswith("events") else "rank 1"
    sender = r"rank \d" if queue.endswith("events") else "the controller"
    assert re.search(
        rf"ERROR: message \d+ of {sender} in {queue} never reached {receiver}: it was put there and taken by another "
        "process that reaches the controller's store", message
    ), message  # fmt: skip
    assert "Traceback" not in run.suite.output(), run.output()
    assert launches == [1, 1] and processes_of(run.run_id) == {}, run.output()
    assert data["cleanup"]["removed"] is True and list(run.target.iterdir()) == []


def test_nodes_started_with_the_wrong_rank_count_are_refused_with_the_command_to_use(two_nodes, tmp_path):
    run = two_nodes(per_node=1, workload=workload_of(tmp_path, 4))  # 2 ranks in all, for a plan of 4
    code, launches = run.finish()
    assert code != 0 and launches == [1, 1], run.output()  # every worker refused, so both nodes' agents failed
    data = run.data()
    fill = data["tests"]["tests_qual/test_fill.py::test_fill_pass[1]"]
    assert fill["outcome"] == "ERROR" and fill["message"].endswith(
        "could not start: torchrun started 2 ranks in all (--nnodes x --nproc-per-node) but the plan has 4; start it "
        "with --nnodes 2 --nproc-per-node 2 on every node"
    ), fill
    assert processes_of(run.run_id) == {} and list(run.target.iterdir()) == []


def test_each_node_reads_what_the_next_node_wrote():
    def worker(rank: int, node: int, local_rank: int) -> Worker:
        return Worker(rank, node, local_rank, "host", 1, "", HostSampler())

    three_nodes = [worker(rank, rank // 2, rank % 2) for rank in range(6)]
    assert shifted_readers(three_nodes, 3) == [2, 3, 4, 5, 0, 1]
    interleaved = [worker(0, 1, 0), worker(1, 0, 0), worker(2, 1, 1), worker(3, 0, 1)]  # ranks need not follow nodes
    assert shifted_readers(interleaved, 2) == [1, 0, 3, 2]


def test_nodes_must_split_the_ranks_and_name_the_controller_and_the_host_limit_counts_ranks_per_node():
    tiny = {"workload": "llama3-8b", "scale": "0.0002"}
    with pytest.raises(SettingsError, match=r"^--nodes 3: the workload has 8 ranks, 2.66667 per node; use a number"):
        resolve_settings({**tiny, "nodes": "3", "controller": "127.0.0.1:29400"})
    with pytest.raises(SettingsError, match=r"^--nodes 2: .*; give --controller HOST:PORT"):
        resolve_settings({**tiny, "nodes": "2"})
    with pytest.raises(SettingsError, match=r"^--controller 'node0': must be HOST:PORT with a port from 1 to 65535"):
        resolve_settings({**tiny, "nodes": "2", "controller": "node0"})
    with pytest.raises(SettingsError, match=r"^--controller 'nohost\.invalid:29400': .* and a HOST that resolves"):
        resolve_settings({**tiny, "nodes": "2", "controller": "nohost.invalid:29400"})  # at once, not in minutes
    with pytest.raises(SettingsError, match=r"^--nodes 2: give --secret-file PATH, a file in a directory of yours"):
        resolve_settings({**tiny, "nodes": "2", "controller": "127.0.0.1:29400"})
    huge = {"workload": "llama3-1t", "scale": "1e-6"}
    if host_rank_capacity() < 1024:  # not a host that runs them all
        with pytest.raises(SettingsError, match=r"^--workload llama3-1t: 1024 ranks, but this host can run at most"):
            resolve_settings(huge)
    secret = {"controller": "localhost:29400", "secret_file": "/tmp/job.secret"}
    run = resolve_settings({**huge, "nodes": "128", **secret})  # 8 ranks per node fit any host
    assert (run.nodes, run.controller, run.sources["nodes"]) == (128, "localhost:29400", "command line")


def test_the_controller_tells_ranks_that_stopped_beating_from_live_ranks_that_are_busy(monkeypatch, tmp_path):
    """A node's death is told by its ranks' heartbeats, not by which ranks were quick to reply: a live rank still
    writing when a peer lost the group is not named (the CI failure of a survivor named "stopped answering")."""
    monkeypatch.setattr(cluster, "SILENT_S", 2.0)
    port, secret = free_port(), tmp_path / "job.secret"
    run_id, key = write_secret(secret)
    wire = Wire(key, run_id, CONTROLLER, 4)
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    watch = (
        "import sys; from ckptqual.runs.node import _watch; from ckptqual.runs.secret import read_secret; "
        "from ckptqual.runs.wire import Wire; run, key = read_secret(sys.argv[3]); rank = int(sys.argv[2]); "
        "_watch(sys.argv[1], Wire(key, run, rank, 4), rank)"
    )
    command = [sys.executable, "-c", watch, f"127.0.0.1:{port}"]
    live = [subprocess.Popen([*command, str(rank), str(secret)]) for rank in (0, 1)]
    try:
        started_by = time.monotonic() + 60
        while not store.check([beat_key(0), beat_key(1)]) and time.monotonic() < started_by:
            time.sleep(0.1)
        pulse = Pulse(store, wire, 4)  # ranks 2 and 3 never beat: their node is gone
        assert pulse.silent() == set()  # nothing is silent before SILENT_S has passed
        deadline = time.monotonic() + 30
        while not pulse.silent() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pulse.silent() == {2, 3}
        time.sleep(2.5)  # the live ranks go on beating however long they are busy
        assert pulse.silent() == {2, 3}
        store.set(STOP, b"stop")  # a stop without the secret's signature: refused, told, and the watch goes on
        store.set(beat_key(2), b"beat")  # and a beat nobody signed
        with pytest.raises(RankFailure, match=r"^a message in ckptqual/beat/2 from an unknown sender: it has no valid"):
            while True:
                pulse.silent()
                time.sleep(0.1)
        assert [proc.poll() for proc in live] == [None, None]
        store.set(STOP, wire.seal(STOP, "stop", {"reason": "", "planned": True}))
        assert [proc.wait(timeout=10) for proc in live] == [0, 0]  # each saw the signed stop and ended as planned
    finally:
        for proc in live:
            proc.kill()
