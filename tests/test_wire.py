"""The messages of a run over several nodes (runs.wire) and its secret file (runs.secret): whatever a stranger who
reaches the controller's port puts in the store is refused before anything in it is used."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from ckptqual.host.beneath import RunTree
from ckptqual.plan.model import FilePlan, RankPlan, TensorSpec
from ckptqual.runs.node import inside
from ckptqual.runs.secret import SecretError, read_secret, write_secret
from ckptqual.runs.task import Task
from ckptqual.runs.wire import CONTROLLER, MAX_MESSAGE_BYTES, Missing, Refused, Wire, task_body, task_of

SECRET, RUN = b"s" * 32, "run1"
KEY = "ckptqual/events"


def parties(ranks: int = 4) -> tuple[Wire, Wire]:
    """A worker (rank 1) and the controller of one run."""
    return Wire(SECRET, RUN, 1, ranks), Wire(SECRET, RUN, CONTROLLER, ranks)


def opened(wire: Wire, value: bytes, key: str = KEY):
    return wire.open(key, value, {"lost", "gone"}, range(4))


def test_a_signed_message_opens_once_and_its_replay_is_refused():
    worker, controller = parties()
    first, second = worker.seal(KEY, "lost", {"line": "gloo: reset"}), worker.seal(KEY, "gone", {})
    message = opened(controller, first)
    assert (message.kind, message.sender, message.seq, message.body) == ("lost", 1, 1, {"line": "gloo: reset"})
    assert opened(controller, second).seq == 2
    with pytest.raises(Refused, match=r"from rank 1: it is a replay \(number 1, after 2\)$"):
        opened(controller, first)


def test_each_key_numbers_its_own_messages_and_a_gap_in_a_queue_names_the_missing_number():
    worker, controller = parties()
    worker.seal("ckptqual/beat/1", "beat", {"sent": {KEY: 0}})  # another key: its numbers are its own
    values = [worker.seal(KEY, "lost", {"line": str(n)}) for n in range(3)]
    assert (worker.sent(KEY), worker.sent("ckptqual/beat/1")) == (3, 1)
    assert controller.open(KEY, values[0], {"lost"}, range(4), queue=True).seq == 1
    with pytest.raises(Missing, match=r"^message 2 of rank 1 in ckptqual/events never reached the controller: it was "
                       r"put there and taken by another process that reaches the controller's store"):  # fmt: skip
        controller.open(KEY, values[2], {"lost"}, range(4), queue=True)
    assert controller.received(1, KEY) == 1  # the message after the gap was not taken either
    assert controller.open(KEY, values[2], {"lost"}, range(4)).seq == 3  # where gaps are normal (a value set again)


@pytest.mark.parametrize(
    "value",
    [
        pickle.dumps(("ready", 0, {"pid": 1})),  # what the store held before: never unpickled
        b"0" * 64 + b'\n{"kind":"gone","run":"run1","from":1,"seq":1,"body":{}}',  # a made-up signature
        b"",
    ],
)
def test_a_value_without_this_runs_signature_is_refused_naming_an_unknown_sender(value):
    with pytest.raises(
        Refused, match=r"^a message in ckptqual/events from an unknown sender: it has no valid signature of this run$"
    ):
        opened(parties()[1], value)


def test_a_message_signed_for_another_key_or_under_another_secret_is_refused():
    worker, controller = parties()
    with pytest.raises(Refused, match="no valid signature"):
        opened(controller, worker.seal("ckptqual/tasks/1", "gone", {}))  # moved to another key
    with pytest.raises(Refused, match="no valid signature"):
        opened(controller, Wire(b"t" * 32, RUN, 1, 4).seal(KEY, "gone", {}))


def test_a_message_of_another_run_an_unexpected_kind_or_sender_is_refused():
    controller = parties()[1]
    with pytest.raises(Refused, match=r"from rank 1: it is of another run \(old, this is run1\)"):
        opened(controller, Wire(SECRET, "old", 1, 4).seal(KEY, "gone", {}))
    with pytest.raises(Refused, match=r"is of the kind 'task', where only gone, lost may be"):
        opened(controller, Wire(SECRET, RUN, 2, 4).seal(KEY, "task", task_body(1, 0, Task("raw-write"))))
    with pytest.raises(Refused, match=r"from the controller: it was sent by a party that may not write there"):
        opened(controller, Wire(SECRET, RUN, CONTROLLER, 4).seal(KEY, "gone", {}))


def forged(kind: str, body: object, ranks: int = 4) -> bytes:
    """A value signed with the secret whose body skips the sender's own schema check (a bug, or a holder of the
    secret): the receiver checks it again."""
    wire = Wire(SECRET, RUN, 1, ranks)
    payload = json.dumps({"kind": kind, "run": RUN, "from": 1, "seq": 1, "body": body}).encode()
    return wire._mac(KEY, payload).encode() + b"\n" + payload


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"line": 5}, r"lost\.line: must be a string, got 5"),
        ({"line": "x", "extra": 1}, "lost.extra: unknown key; allowed: line"),
        ({}, "lost.line: missing"),
        ({"line": "x" * 70_000}, "lost.line: must be a string of at most 65,536 characters, got 70,000 characters"),
        ([], r"message\.body: must be an object, got \[\]"),
    ],
)
def test_a_signed_message_of_the_wrong_shape_is_refused_naming_what_is_wrong(body, problem):
    with pytest.raises(Refused, match=f"^a message in ckptqual/events( from rank 1)?: it is malformed: {problem}$"):
        opened(parties()[1], forged("lost", body))


def test_numbers_json_does_not_allow_duplicate_keys_and_oversized_values_are_refused():
    controller = parties()[1]
    nan = forged("lost", {"line": "x"}).replace(b'"seq": 1', b'"seq": NaN')
    with pytest.raises(Refused, match="no valid signature"):  # the signature covers every byte
        opened(controller, nan)
    mac_of = parties()[0]._mac
    for payload, problem in [
        (b'{"kind":"gone","run":"run1","from":1,"seq":NaN,"body":{}}', "NaN is not a number JSON allows"),
        (b'{"kind":"gone","kind":"lost","run":"run1","from":1,"seq":1,"body":{}}', "the key 'kind' appears twice"),
        (b'{"kind":"gone","run":"run1","from":1,"seq":true,"body":{}}', "message.seq: must be an integer, got true"),
    ]:
        with pytest.raises(Refused, match=problem):
            opened(controller, mac_of(KEY, payload).encode() + b"\n" + payload)
    with pytest.raises(Refused, match=r"from an unknown sender: it is 4,194,305 bytes, over 4,194,304"):
        opened(controller, b"x" * (MAX_MESSAGE_BYTES + 1))


def test_a_task_travels_as_plain_data_and_a_plan_path_out_of_the_checkpoint_is_refused():
    plan = RankPlan(3, (FilePlan("model/part-0.pt", (TensorSpec("w", 10, "bfloat16"),)),))
    task = Task("write", 4, "/run/checkpoints/checkpoint-00004", plan, {"engine": "stream"})
    worker, controller = parties()
    message = worker.open("ckptqual/tasks/1", controller.seal("ckptqual/tasks/1", "task", task_body(7, 3, task)),
                          {"task"}, {CONTROLLER})  # fmt: skip
    assert (message.body["number"], message.body["as_rank"], task_of(message.body)) == (7, 3, task)
    escaping = task_body(8, 3, task)
    escaping["plan"]["files"][0]["path"] = "../../etc/passwd"
    with pytest.raises(Refused, match=r"file path '\.\./\.\./etc/passwd' must be relative"):
        task_of(escaping)


def test_a_worker_acts_only_on_directories_inside_the_run_directory_and_never_through_a_symlink(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "checkpoint-00004").symlink_to(tmp_path)
    with RunTree(run_dir) as tree:
        inside(tree, run_dir / "checkpoints" / "checkpoint-00001")  # not made yet: the task makes it
        for outside in (tmp_path / "elsewhere", run_dir / ".." / "elsewhere"):
            with pytest.raises(Refused, match=r"a task naming .*: it is outside the run directory"):
                inside(tree, outside)
        with pytest.raises(Refused, match=rf"checkpoint-00004 is a symlink to {tmp_path}: an entry planted"):
            inside(tree, run_dir / "checkpoints" / "checkpoint-00004" / "sub")


def test_the_seed_is_masked_with_a_key_of_the_secret():
    wire = Wire(SECRET, RUN, CONTROLLER, 4)
    assert wire.mask(1234) != 1234 and wire.mask(wire.mask(1234)) == 1234
    assert Wire(b"t" * 32, RUN, CONTROLLER, 4).mask(1234) != wire.mask(1234)


def test_the_secret_file_is_written_0600_and_read_back_only_if_it_is_the_owners_own(tmp_path):
    path = tmp_path / "job.secret"
    run_id, secret = write_secret(path)
    assert os.stat(path).st_mode & 0o777 == 0o600 and read_secret(path) == (run_id, secret)
    assert write_secret(path) != (run_id, secret) and [p.name for p in tmp_path.iterdir()] == ["job.secret"]
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(SecretError, match=r"link is a symlink; give `ckptqual node` the --secret-file"):
        read_secret(link)
    os.chmod(path, 0o640)
    with pytest.raises(SecretError, match=r"has mode 0640: others may read or change it"):
        read_secret(path)
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, 4321, -1)
        with pytest.raises(SecretError, match=r"is owned by uid 4321, not by this worker's uid 0"):
            read_secret(path)
        os.chown(path, 0, -1)
    path.write_text("not a secret")
    with pytest.raises(SecretError, match="does not hold a run id and a secret"):
        read_secret(path)
    with pytest.raises(SecretError, match=r"cannot write it: No such file or directory"):
        write_secret(tmp_path / "missing" / "job.secret")


def test_the_secret_file_is_never_read_through_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(SecretError, match="is not a regular file"):
        read_secret(Path(fifo))
