"""Workloads: a model architecture and its parallelism (pure data in TOML) -> the exact checkpoint plan."""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ckptqual.bounded import load_toml
from ckptqual.documents import checker, problem
from ckptqual.plan.formats import FORMATS
from ckptqual.plan.model import DTYPE_BYTES, CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.resources import named_files, read_text_file, resolve

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

WORKLOAD_DIR = "fixtures/workloads"
MAX_FILE_BYTES = 1 << 20  # a workload file is a few dozen lines
MAX_PLAN_FILES = 1_000_000  # the largest shipped workload writes 2,072 files per checkpoint
LAYOUTS = ("deepspeed", "dlio-v2")
DEEPSPEED_DIR = "global_epoch1_step1"
ARCH_KEYS = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab")
# Adam keeps three fp32 states per parameter (master copy, momentum, variance), each with 5h extra elements.
OPTIMIZER_STATES = 3
OPTIMIZER_EXTRA_PER_HIDDEN = 5


class WorkloadError(ValueError):
    """A workload file or value that cannot be used; the message names the file, the key and the fix."""


class ModelTensor(NamedTuple):
    """One tensor of the unsplit model; `tp_split` says whether tensor parallelism divides it."""

    name: str
    numel: int
    tp_split: bool


def shard(n: int, k: int, i: int) -> int:
    """Elements of shard `i` of `n` split exactly into `k` shards (the first n % k shards get one more)."""
    return n // k + (1 if i < n % k else 0)


def _check_int(key: str, value: Any, minimum: int = 1, maximum: int | None = None) -> None:
    """Raise WorkloadError unless `value` is an integer in [minimum, maximum]."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    if ok and (maximum is None or value <= maximum):
        return
    bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    raise WorkloadError(f"{key}: must be an integer {bound}, got {value!r}")


def _check_dtype(key: str, value: Any) -> None:
    """Raise WorkloadError unless `value` names a dtype of plan.DTYPE_BYTES."""
    if not isinstance(value, str) or value not in DTYPE_BYTES:
        raise WorkloadError(f"{key}: must be one of {', '.join(DTYPE_BYTES)}, got {value!r}")


def _check_layout(value: Any) -> None:
    """Raise WorkloadError unless `value` is one of LAYOUTS."""
    if value not in LAYOUTS:
        raise WorkloadError(f"layout: must be one of {', '.join(LAYOUTS)}, got {value!r}")


@dataclass(frozen=True)
class Architecture:
    """A LLaMA-style decoder: GQA attention, gated MLP, untied embedding and LM head, RMS norms."""

    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int

    def __post_init__(self) -> None:
        for key in ARCH_KEYS:
            _check_int(f"model.{key}", getattr(self, key))
        if self.heads % self.kv_heads:
            raise WorkloadError(f"model.kv_heads: must divide model.heads ({self.heads}), got {self.kv_heads}")

    @property
    def kv_dim(self) -> int:
        """d_kv = (hidden // heads) * kv_heads, the K and V width: the head size floored, as DLIO computes it."""
        return self.hidden // self.heads * self.kv_heads

    def transformer_layer(self, index: int) -> tuple[ModelTensor, ...]:
        """The six tensors of one transformer layer; the two norms are replicated over TP, the rest split."""
        h, prefix = self.hidden, f"layers.{index}."
        return (
            ModelTensor(prefix + "attention_norm", h, False),
            ModelTensor(prefix + "attention.wqkv", h * (h + 2 * self.kv_dim), True),
            ModelTensor(prefix + "attention.wo", h * h, True),
            ModelTensor(prefix + "ffn_norm", h, False),
            ModelTensor(prefix + "feed_forward.w13", 2 * h * self.ffn_hidden, True),
            ModelTensor(prefix + "feed_forward.w2", h * self.ffn_hidden, True),
        )

    def layer_tensors(self, layer: int) -> tuple[ModelTensor, ...]:
        """DeepSpeed layer `layer`: 0 embedding, 1..L transformer layers, L+1 LM head, L+2 final norm."""
        if layer == 0:
            return (ModelTensor("embedding", self.hidden * self.vocab, True),)
        if layer == self.layers + 1:
            return (ModelTensor("lm_head", self.hidden * self.vocab, True),)
        if layer == self.layers + 2:
            return (ModelTensor("final_norm", self.hidden, False),)
        return self.transformer_layer(layer)

    def parameter_count(self) -> int:
        """N of docs/facts.md: 2 V h + L (h + h (h + 2 d_kv) + h^2 + h + 3 h ffn) + h."""
        return sum(t.numel for layer in range(self.layers + 3) for t in self.layer_tensors(layer))


@dataclass(frozen=True)
class Parallelism:
    """TP x PP x DP grid (rank = dp*TP*PP + pp*TP + tp), ZeRO stage, and optionally only the first ranks."""

    tp: int
    pp: int
    dp: int
    zero_stage: int = 1
    subset_processes: int | None = None

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "dp"):
            _check_int(f"parallelism.{key}", getattr(self, key))
        _check_int("parallelism.zero_stage", self.zero_stage, 0, 3)
        if self.subset_processes is not None:
            _check_int("parallelism.subset_processes", self.subset_processes, 1, self.world_size)

    @property
    def world_size(self) -> int:
        """Ranks of the full job."""
        return self.tp * self.pp * self.dp

    @property
    def processes(self) -> int:
        """Ranks that run: the subset's first ranks, else the whole world."""
        return self.subset_processes or self.world_size

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of `rank`."""
        return rank // (self.tp * self.pp), rank // self.tp % self.pp, rank % self.tp

    def as_dict(self) -> dict[str, int]:
        """Plain values for CheckpointPlan.parallelism."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "zero_stage": self.zero_stage,
            "world_size": self.world_size,
            "processes": self.processes,
        }


def stage_layers(layers: int, pp: int, stage: int) -> list[int]:
    """Layer indices of pipeline stage `stage`: an even split, the first `layers % pp` get one more."""
    base, extra = divmod(layers, pp)
    first = 1 + stage * base + min(stage, extra)
    indices = list(range(first, first + base + (1 if stage < extra else 0)))
    if stage == 0:
        indices.insert(0, 0)
    if stage == pp - 1:
        indices += [layers + 1, layers + 2]
    return indices


def deepspeed_plan(
    arch: Architecture,
    par: Parallelism,
    *,
    model_dtype: str = "float16",
    optimizer_dtype: str = "float32",
    name: str = "deepspeed",
    description: str = "",
) -> CheckpointPlan:
    """One checkpoint of a Megatron-DeepSpeed job as DLIO lays it out (docs/facts.md): model tensors split exactly to
    the element over TP (and DP under ZeRO-3), optimizer partitions of N // writers elements each."""
    _check_dtype("dtypes.model", model_dtype)
    _check_dtype("dtypes.optimizer", optimizer_dtype)
    n = arch.parameter_count()
    ranks = []
    for rank in range(par.processes):
        optimizer = _optimizer_files(arch, par, rank, n, optimizer_dtype)
        ranks.append(RankPlan(rank, (*_model_files(arch, par, rank, model_dtype), *optimizer)))
    return CheckpointPlan(name, tuple(ranks), description=description, parallelism=par.as_dict())


def _layer_shard(arch: Architecture, par: Parallelism, layer: int, tp: int, dp: int, dtype: str) -> list[TensorSpec]:
    """This rank's share of one layer: split tensors over TP, and every tensor over DP under ZeRO-3."""
    specs = []
    for tensor in arch.layer_tensors(layer):
        numel = shard(tensor.numel, par.tp, tp) if tensor.tp_split else tensor.numel
        if par.zero_stage == 3:
            numel = shard(numel, par.dp, dp)
        specs.append(TensorSpec(tensor.name, numel, dtype))
    return specs


def _model_files(arch: Architecture, par: Parallelism, rank: int, dtype: str) -> list[FilePlan]:
    """Model-state files of `rank`: its DP shard under ZeRO-3, else written by the first DP replica only."""
    dp, pp, tp = par.coordinates(rank)
    mp = pp * par.tp + tp
    layers = stage_layers(arch.layers, par.pp, pp)
    if par.zero_stage < 3 and dp > 0:
        return []
    if par.zero_stage < 3 and par.pp > 1:
        return [
            FilePlan(
                f"{DEEPSPEED_DIR}/layer_{layer:02d}-model_{tp:02d}_model_states.pt",
                tuple(_layer_shard(arch, par, layer, tp, dp, dtype)),
            )
            for layer in layers
        ]
    tensors = tuple(spec for layer in layers for spec in _layer_shard(arch, par, layer, tp, dp, dtype))
    if par.zero_stage == 3:
        return [FilePlan(f"{DEEPSPEED_DIR}/zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt", tensors)]
    return [FilePlan(f"{DEEPSPEED_DIR}/model_{mp:02d}_model_states.pt", tensors)]


def _optimizer_files(arch: Architecture, par: Parallelism, rank: int, n: int, dtype: str) -> list[FilePlan]:
    """The optimizer file of `rank`: 3 x (its share of N + 5h); ZeRO-0 shares over TP*PP, written by dp 0. Every
    writer's share is N // writers, floored as DLIO floors it (the flat optimizer partitions are equal)."""
    dp, pp, tp = par.coordinates(rank)
    mp = pp * par.tp + tp
    if par.zero_stage == 0 and dp > 0:
        return []
    share = n // (par.tp * par.pp) if par.zero_stage == 0 else n // par.world_size
    numel = OPTIMIZER_STATES * (share + OPTIMIZER_EXTRA_PER_HIDDEN * arch.hidden)
    path = f"{DEEPSPEED_DIR}/zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt"
    return [FilePlan(path, (TensorSpec("optimizer.state", numel, dtype),))]


def dlio_v2_layer_files(layers: int, par: Parallelism) -> int:
    """Layer files per writing rank in DLIO v2.0.0: layers rounded up to lcm(TP, PP), plus TP when TP > 1."""
    step = math.lcm(par.tp, par.pp)
    rounded = -(-layers // step) * step
    return rounded + (par.tp if par.tp > 1 else 0)


def dlio_v2_plan(
    arch: Architecture,
    par: Parallelism,
    parameters: int,
    *,
    model_dtype: str = "int8",
    optimizer_dtype: str = "int8",
    name: str = "dlio-v2",
    description: str = "",
) -> CheckpointPlan:
    """DLIO v2.0.0's layout (docs/facts.md): an optimizer file per rank, layer files where r % PP == 0."""
    _check_int("model.parameters", parameters)
    _check_dtype("dtypes.model", model_dtype)
    _check_dtype("dtypes.optimizer", optimizer_dtype)
    layer_files = range(dlio_v2_layer_files(arch.layers, par))
    ranks = []
    for rank in range(par.processes):
        layers = [] if rank % par.pp else [_dlio_v2_layer(arch, par.tp, i, rank, model_dtype) for i in layer_files]
        optimizer = _dlio_v2_optimizer(shard(parameters, par.world_size, rank), rank, optimizer_dtype)
        ranks.append(RankPlan(rank, (*layers, optimizer)))
    parallelism = {k: v for k, v in par.as_dict().items() if k != "zero_stage"}
    return CheckpointPlan(name, tuple(ranks), description=description, parallelism=parallelism)


def _dlio_v2_layer(arch: Architecture, tp: int, layer: int, rank: int, dtype: str) -> FilePlan:
    """One DLIO v2.0.0 layer file: all six layer tensors divided (floor, as DLIO does) by TP."""
    tensors = tuple(TensorSpec(t.name, t.numel // tp, dtype) for t in arch.transformer_layer(layer))
    return FilePlan(f"layer-{layer}-1-1-{rank}.pt", tensors)


def _dlio_v2_optimizer(group: int, rank: int, dtype: str) -> FilePlan:
    """One DLIO v2.0.0 optimizer file: the rank's optimization group twice, then the combined tensor."""
    parts = ("group0.a", "group0.b", "combined")
    return FilePlan(f"optimizer-1-1-{rank}.pt", tuple(TensorSpec(f"optimizer.{p}", group, dtype) for p in parts))


@dataclass(frozen=True)
class Workload:
    """A validated workload file: architecture, parallelism, layout and dtypes."""

    name: str
    description: str
    layout: str
    model: Architecture
    parallelism: Parallelism
    model_dtype: str
    optimizer_dtype: str
    parameters: int | None = None
    format: str | None = None  # the checkpoint format the workload is written in (plan.formats), where it names one

    def __post_init__(self) -> None:
        _check_layout(self.layout)
        if self.format is not None and self.format not in FORMATS:
            raise WorkloadError(f"format: must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if not isinstance(self.description, str) or not self.description.strip():
            raise WorkloadError(f"description: must be a non-empty string, got {self.description!r}")
        _check_dtype("dtypes.model", self.model_dtype)
        _check_dtype("dtypes.optimizer", self.optimizer_dtype)
        if self.layout == "dlio-v2":
            _check_int("model.parameters", self.parameters)
        elif self.parameters is not None:
            raise WorkloadError("model.parameters: only for layout dlio-v2; deepspeed derives N from the model")
        files = self.parallelism.processes * (self.model.layers + 4)  # at most a file per layer and rank, and more
        if files > MAX_PLAN_FILES:
            raise WorkloadError(
                f"model.layers and parallelism: {self.model.layers:,} layers over {self.parallelism.processes:,} "
                f"ranks make a plan of up to {files:,} files, more than {MAX_PLAN_FILES:,}; give fewer of either"
            )

    def parameter_count(self) -> int:
        """Model parameters: N of docs/facts.md, or the dlio-v2 file's `parameters`."""
        return self.parameters if self.parameters is not None else self.model.parameter_count()

    def plan(self) -> CheckpointPlan:
        """The full-scale checkpoint plan (shrink it with CheckpointPlan.scaled)."""
        common = {
            "model_dtype": self.model_dtype,
            "optimizer_dtype": self.optimizer_dtype,
            "name": self.name,
            "description": self.description,
        }
        if self.layout == "dlio-v2":
            return dlio_v2_plan(self.model, self.parallelism, self.parameter_count(), **common)
        return deepspeed_plan(self.model, self.parallelism, **common)


_DEFAULT_DTYPES = {"deepspeed": ("float16", "float32"), "dlio-v2": ("int8", "int8")}


def available_workloads() -> list[str]:
    """Names of the shipped workload files."""
    return list(named_files(WORKLOAD_DIR))


def load_workload(name_or_path: str) -> Workload:
    """Load and validate a workload by name (fixtures/workloads) or path; any problem raises WorkloadError."""
    try:
        path = resolve(name_or_path, WORKLOAD_DIR, "workload")
    except (LookupError, FileNotFoundError) as err:
        raise WorkloadError(str(err)) from None
    shown = _shown(path)
    try:
        doc = load_toml(read_text_file(path, MAX_FILE_BYTES))
    except tomllib.TOMLDecodeError as err:
        raise WorkloadError(f"{shown}: not valid TOML ({err}); fix the syntax") from None
    except ValueError as err:
        raise WorkloadError(f"{shown}: {err}") from None
    try:
        return _parse(path.stem, doc)
    except WorkloadError as err:
        raise WorkloadError(f"{shown}: {err}") from None


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _positive() -> dict[str, Any]:
    return {"type": "integer", "minimum": 1}


def _table(properties: dict[str, Any], required: tuple[str, ...], name: str, fix: str = "") -> dict[str, Any]:
    """A TOML table with these keys, `required` among them, and no other."""
    fixes = {"required": f"add it (the files in {WORKLOAD_DIR} show the format)"}
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        "expected": f"a table ([{name}])",
        "fix": fixes | ({"additionalProperties": fix} if fix else {}),
    }


_DTYPE = {"enum": list(DTYPE_BYTES)}


_DTYPE = {"enum": list(DTYPE_BYTES)}


def _schema(layout: str) -> dict[str, Any]:
    """The structure of a workload file of `layout` (a count may be written 405e9 in a dlio-v2 file's parameters)."""
    dlio = layout == "dlio-v2"
    model = {key: _positive() for key in ARCH_KEYS}
    if dlio:
        model["parameters"] = {"type": "number", "minimum": 1, "multipleOf": 1, "expected": "an integer >= 1"}
    parallelism = {key: _positive() for key in ("tp", "pp", "dp")} | {"subset_processes": _positive()}
    if not dlio:
        parallelism["zero_stage"] = {"type": "integer", "minimum": 0, "maximum": 3}
    only_dlio = "" if dlio else "parameters is for layout dlio-v2; deepspeed derives N from the model"
    return {
        "type": "object",
        "properties": {
            "description": {"type": "string", "pattern": r"\S", "expected": "a non-empty string"},
            "layout": {"enum": list(LAYOUTS)},
            "format": {"enum": list(FORMATS)},
            "model": _table(model, tuple(model), "model", only_dlio),
            "parallelism": _table(parallelism, ("tp", "pp", "dp") + (() if dlio else ("zero_stage",)), "parallelism"),
            "dtypes": _table({"model": _DTYPE, "optimizer": _DTYPE}, (), "dtypes"),
        },
        "required": ["description", "layout", "model", "parallelism"],
        "additionalProperties": False,
        "fix": {"required": f"add it (the files in {WORKLOAD_DIR} show the format)"},
    }


@functools.cache
def _checker(layout: str) -> Validator:
    """The checker of a workload file of `layout`, made the first time one is read."""
    return checker(_schema(layout))


def _parse(name: str, doc: dict[str, Any]) -> Workload:
    """A Workload from a parsed TOML document, its structure checked before any value is used."""
    wrong = problem(_checker(layout if (layout := str(doc.get("layout"))) in LAYOUTS else "deepspeed"), doc)
    if wrong:
        raise WorkloadError(wrong)
    layout, model, dtypes = doc["layout"], doc["model"], doc.get("dtypes", {})
    defaults = _DEFAULT_DTYPES[layout]
    return Workload(
        name=name,
        description=doc["description"],
        layout=layout,
        model=Architecture(**{key: model[key] for key in ARCH_KEYS}),
        parallelism=Parallelism(**doc["parallelism"]),
        model_dtype=dtypes.get("model", defaults[0]),
        optimizer_dtype=dtypes.get("optimizer", defaults[1]),
        parameters=_whole(model["parameters"]) if layout == "dlio-v2" else None,
        format=doc.get("format"),
    )


def _whole(value: Any) -> Any:
    """A float with an integral value (405e9) as int; anything else unchanged for validation to judge."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
