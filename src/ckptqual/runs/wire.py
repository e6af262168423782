"""The messages between the controller and the nodes' workers (runs.cluster, runs.node): signed JSON, checked.

torch's TCPStore has no authentication: anything that reaches its port reads and writes every key. So every value the
two sides put there is `HMAC-hex \\n JSON`: an HMAC-SHA256 under the run's secret over the store key it was put at and
the JSON, which holds the kind, the run id, the sender, the sender's sequence number at that key and a body of that
kind's exact schema. A value that is too long, unsigned, of another run, a replay or of the wrong shape raises Refused
before anything in it is used; nothing but JSON is ever decoded.

A queue's messages are numbered 1, 2, ... per sender, and each party's heartbeat carries the last number it sent on
each queue: a message taken from a queue by anyone else (any process that reaches the store can pop it) shows as a
gap, which raises Missing naming the queue and the number, instead of leaving the receiver waiting for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptqual.documents import checker, problem
from ckptqual.faults import RUN_FAULTS, TARGET_FAULTS
from ckptqual.host.cpu import Mark
from ckptqual.plan.model import DTYPE_BYTES, FilePlan, RankPlan, TensorSpec
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.task import Task
from ckptqual.runs.worker import OPERATIONS

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

CONTROLLER = -1  # the sender number of the controller; a worker's is its global rank
MAX_MESSAGE_BYTES = 4 << 20
MAX_RANKS = 1 << 20
MAX_TEXT = 1 << 16
_MAC_HEX = 64


class Refused(RankFailure):
    """A message that is not one the run's own processes sent, or not of the shape its kind must have."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "stopped")


class Missing(RankFailure):
    """A message of a queue that was sent but never reached its receiver: someone else took it from the store."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "stopped")


def missing_line(key: str, sender: int, number: int, receiver: str) -> str:
    """The one line of a message `number` of `sender` at queue `key` that `receiver` never read."""
    who = "the controller" if sender == CONTROLLER else f"rank {sender}"
    return (
        f"message {number} of {who} in {key} never reached {receiver}: it was put there and taken by another process "
        f"that reaches the controller's store (the store has no access control); let only the nodes reach the "
        f"--controller port"
    )


def integer(low: int, high: float = math.inf) -> dict[str, Any]:
    bounds = {"minimum": low} | ({"maximum": high} if math.isfinite(high) else {})
    return {"type": "integer", **bounds}


def real(low: float = 0.0) -> dict[str, Any]:
    return {"type": "number", "minimum": low}


def text(limit: int = MAX_TEXT) -> dict[str, Any]:
    return {"type": "string", "maxLength": limit}


def one_of(names: Collection[str]) -> dict[str, Any]:
    return {"enum": sorted(names)}


def maybe(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or null (its other keywords apply to values of its type only)."""
    return {**schema, "type": [schema["type"], "null"]}


def list_of(item: dict[str, Any], limit: int, exact: bool = False) -> dict[str, Any]:
    """A list of at most `limit` items of one schema (exactly `limit` where `exact`)."""
    return {"type": "array", "items": item, "maxItems": limit, **({"minItems": limit} if exact else {})}


def record(fields: Mapping[str, dict[str, Any]], optional: Collection[str] = ()) -> dict[str, Any]:
    """An object with exactly the keys of `fields` (those in `optional` may be left out)."""
    required = [key for key in fields if key not in optional]
    return {"type": "object", "properties": dict(fields), "required": required, "additionalProperties": False}


def map_of(key: dict[str, Any], item: dict[str, Any], limit: int) -> dict[str, Any]:
    """An object of at most `limit` keys of one schema, each holding a value of one schema."""
    return {"type": "object", "propertyNames": key, "additionalProperties": item, "maxProperties": limit}


def either(tag: str, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A value of `first` where it holds the key `tag`, else of `second`."""
    return {"if": {"type": "object", "required": [tag]}, "then": first, "else": second}


RUN_ID = {"type": "string", "pattern": "^[A-Za-z0-9]{1,64}$", "expected": "a run id of letters and digits"}
_MARK = record({"wall": real(), "cpu": list_of(integer(0), 2, exact=True), "io_ms": maybe(integer(0))})
_WAITS = record(
    {"elapsed_s": real(), "run_s": real(), "wait_s": real(), "io_blocked_s": maybe(real()), "threads": integer(0)}
)
_SAMPLER = record({"cpus": list_of(integer(0), 1 << 16), "stat": maybe(text(4096)), "device": maybe(text(256))})
_TENSOR = record({"name": text(4096), "numel": integer(0), "dtype": one_of(DTYPE_BYTES)})
_FILE = record({"path": text(4096), "tensors": list_of(_TENSOR, 1 << 20)})
_OPTIONS = record({"engine": text(64), "bytes_per_rank": integer(0)}, optional=("engine", "bytes_per_rank"))
_PHASE_NAMES = (*OPERATIONS, "mkdir", "fsync", "commit")  # the stages a rank times (RankIO.begin)
_PHASES = record({name: real() for name in _PHASE_NAMES}, optional=_PHASE_NAMES)
_DONE = record(
    {
        "start": real(),
        "end": real(),
        "bytes": integer(0),
        "payload_cpu_s": real(),
        "cpu_s": real(),
        "marks": list_of(_MARK, 2, exact=True),
        "torch_load_sampled": integer(0, 1),
        "torch_load_sampled_s": real(),
        "waits": _WAITS,
        "phases": _PHASES,
    },
    optional=("torch_load_sampled", "torch_load_sampled_s", "waits", "phases"),
)
_FAILED = record(
    {
        "error": text(),
        "fault": one_of(TARGET_FAULTS + RUN_FAULTS),
        "errno": maybe(integer(0)),
        "trace": text(1 << 20),
    },
    optional=("trace",),
)


def body_schemas(ranks: int) -> dict[str, dict[str, Any]]:
    """Each kind's body, for a run of `ranks` ranks."""
    rank = integer(0, ranks - 1)
    return {
        "run": record(
            {
                "ranks": integer(1, MAX_RANKS),  # a worker checks it against its torchrun's, saying how to fix it
                "nodes": integer(1, MAX_RANKS),
                "seed_masked": integer(0, 2**64 - 1),
                "run_dir": text(4096),
                "timeout_s": real(),
                "chunk_bytes": integer(1),
            }
        ),
        "task": record(
            {
                "number": integer(0),
                "op": one_of(OPERATIONS),
                "as_rank": rank,
                "checkpoint": integer(0),
                "directory": text(4096),
                "plan": maybe(record({"rank": integer(0), "files": list_of(_FILE, 1 << 20)})),
                "options": _OPTIONS,
            }
        ),
        "stop": record({"reason": text(), "planned": {"type": "boolean"}}),
        "ready": record(
            {
                "node": integer(0, ranks - 1),
                "local_rank": integer(0, ranks - 1),
                "hostname": text(256),
                "pid": integer(1),
                "starttime": text(32),
                "sampler": _SAMPLER,
            }
        ),
        "unable": record({"error": text(), "world": integer(1, MAX_RANKS)}),  # world: the ranks torchrun started
        "reply": record({"task": integer(0), "reply": either("error", _FAILED, _DONE)}),
        "lost": record({"line": text()}),
        "refused": record({"line": text()}),
        "missing": record({"line": text()}),
        "gone": record({}),
        "beat": record({"sent": map_of(text(64), integer(0), ranks + 1)}),
    }


def _checkers(ranks: int) -> dict[str, Validator]:
    return {kind: checker(schema) for kind, schema in body_schemas(ranks).items()}


@dataclass(frozen=True)
class Message:
    """A message that verified: its kind, sender (CONTROLLER or a rank), sequence number and checked body."""

    kind: str
    sender: int
    seq: int
    body: dict[str, Any]


class Wire:
    """Seals and opens the messages of one run (`run_id`, `secret`) for one party (`me`) of a run of `ranks` ranks.

    Sealing numbers this party's messages at each key 1, 2, ...; opening accepts from each sender at each key only a
    number above the last it accepted there (`same_ok`: or equal to it, for a value read again that was not replaced),
    and at a queue only the next number (`queue`: a gap raises Missing)."""

    def __init__(self, secret: bytes, run_id: str, me: int, ranks: int) -> None:
        self._secret, self.run_id, self.me, self.ranks = secret, run_id, me, ranks
        self._schemas = _checkers(ranks)
        self._sent: dict[str, int] = {}
        self._seen: dict[tuple[int, str], int] = {}
        self.lock = threading.Lock()  # held by a sender across sealing and putting, so numbers reach the store in order

    def seal(self, key: str, kind: str, body: Mapping[str, Any]) -> bytes:
        """The signed value of a `kind` message with `body`, to be put at `key`."""
        wrong = problem(self._schemas[kind], body, kind)
        if wrong:  # a bug of our own, caught where it is made
            raise ValueError(wrong)
        self._sent[key] = self._sent.get(key, 0) + 1
        envelope = {"kind": kind, "run": self.run_id, "from": self.me, "seq": self._sent[key], "body": body}
        payload = json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode()
        return self._mac(key, payload).encode() + b"\n" + payload

    def sent(self, key: str) -> int:
        """The number of the last message this party sealed for `key` (0: none)."""
        return self._sent.get(key, 0)

    def received(self, sender: int, key: str) -> int:
        """The number of the last message from `sender` at `key` this party opened (0: none)."""
        return self._seen.get((sender, key), 0)

    def open(
        self,
        key: str,
        value: bytes,
        kinds: Collection[str],
        senders: Collection[int],
        same_ok: bool = False,
        queue: bool = False,
    ) -> Message:
        """The message in `value` read at `key`, which must be of one of `kinds` from one of `senders`; raises Refused
        saying who sent it (or "an unknown sender", where the signature does not verify) and what is wrong, and at a
        `queue` Missing where a number was skipped."""
        where = f"a message in {key}"
        if len(value) > MAX_MESSAGE_BYTES:
            raise Refused(f"{where} from an unknown sender: it is {len(value):,} bytes, over {MAX_MESSAGE_BYTES:,}")
        mac, newline, payload = value[:_MAC_HEX], value[_MAC_HEX : _MAC_HEX + 1], value[_MAC_HEX + 1 :]
        if newline != b"\n" or not hmac.compare_digest(mac, self._mac(key, payload).encode()):
            raise Refused(f"{where} from an unknown sender: it has no valid signature of this run")
        try:
            envelope = json.loads(payload, parse_constant=_no_constant, object_pairs_hook=_unique)
        except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise Refused(f"{where}: it is malformed: {error}") from None
        wrong = problem(_ENVELOPE, envelope, "message")
        if wrong:
            raise Refused(f"{where}: it is malformed: {wrong}")
        sender, seq, kind = envelope["from"], envelope["seq"], envelope["kind"]
        who = "the controller" if sender == CONTROLLER else f"rank {sender}"
        wrong = self._problem(envelope, kinds, senders, (sender, key), same_ok)
        if wrong:
            raise Refused(f"{where} from {who}: it {wrong}")
        wrong = problem(self._schemas[kind], envelope["body"], kind)
        if wrong:
            raise Refused(f"{where} from {who}: it is malformed: {wrong}")
        if queue and seq > self.received(sender, key) + 1:
            raise Missing(missing_line(key, sender, self.received(sender, key) + 1, self._name()))
        self._seen[sender, key] = seq
        return Message(kind, sender, seq, envelope["body"])

    def _problem(
        self, envelope: dict[str, Any], kinds: Collection[str], senders: Collection[int], channel: tuple, same_ok: bool
    ) -> str | None:
        """What makes a signed envelope one this party must refuse, or None."""
        if envelope["run"] != self.run_id:
            return f"is of another run ({envelope['run']}, this is {self.run_id})"
        if envelope["kind"] not in kinds:
            return f"is of the kind {envelope['kind']!r}, where only {', '.join(sorted(kinds))} may be"
        if envelope["from"] not in senders:
            return "was sent by a party that may not write there"
        last = self._seen.get(channel, 0)
        if envelope["seq"] < last or (envelope["seq"] == last and not same_ok):
            return f"is a replay (number {envelope['seq']}, after {last})"
        return None

    def _name(self) -> str:
        return "the controller" if self.me == CONTROLLER else f"rank {self.me}"

    def _mac(self, key: str, payload: bytes) -> str:
        return hmac.new(self._secret, key.encode() + b"\0" + payload, hashlib.sha256).hexdigest()

    def mask(self, seed: int) -> int:
        """`seed` masked (and unmasked) with a key derived from the secret, so that it never travels in clear."""
        derived = hmac.new(self._secret, b"ckptqual seed " + self.run_id.encode(), hashlib.sha256).digest()
        return seed ^ int.from_bytes(derived[:8], "big")


_ENVELOPE = checker(
    record(
        {"kind": text(32), "run": RUN_ID, "from": integer(CONTROLLER), "seq": integer(1), "body": {"type": "object"}}
    )
)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"the key {next(k for k in keys if keys.count(k) > 1)!r} appears twice")
    return dict(pairs)


def task_body(number: int, as_rank: int, task: Task) -> dict[str, Any]:
    """A task as plain data: which task it is and the rank whose part it acts as."""
    plan = task.plan
    files = [{"path": f.path, "tensors": [vars(t) for t in f.tensors]} for f in plan.files] if plan else None
    return {
        "number": number,
        "op": task.op,
        "as_rank": as_rank,
        "checkpoint": task.checkpoint,
        "directory": task.directory,
        "plan": {"rank": plan.rank, "files": files} if plan else None,
        "options": dict(task.options),
    }


def task_of(body: Mapping[str, Any]) -> Task:
    """The Task of a checked task body (a plan file path with ".." or a leading "/" raises Refused)."""
    plan = body["plan"]
    try:
        files = tuple(
            FilePlan(f["path"], tuple(TensorSpec(t["name"], t["numel"], t["dtype"]) for t in f["tensors"]))
            for f in plan["files"]
        ) if plan else ()  # fmt: skip
    except ValueError as error:
        raise Refused(f"a task from the controller: it is malformed: {error}") from None
    rank_plan = RankPlan(plan["rank"], files) if plan else None
    return Task(body["op"], body["checkpoint"], body["directory"], rank_plan, dict(body["options"]))


def reply_data(reply: Mapping[str, Any]) -> dict[str, Any]:
    """A rank's reply (runs.worker.run_task) as plain data: its marks as objects."""
    if "marks" not in reply:
        return dict(reply)
    return {**reply, "marks": [vars(mark) | {"cpu": list(mark.cpu)} for mark in reply["marks"]]}


def reply_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """The reply runs.timing and runs.failure read, of a checked reply body."""
    if "marks" not in data:
        return dict(data)
    return {**data, "marks": tuple(Mark(m["wall"], tuple(m["cpu"]), m["io_ms"]) for m in data["marks"])}
