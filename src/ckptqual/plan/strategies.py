"""Hypothesis strategies for checkpoint plans with odd shard layouts, for this suite's tests and for users' own.

`deepspeed_layouts()` draws real Megatron-DeepSpeed plans (workloads.deepspeed_plan) from odd and prime
parallel degrees, layer counts that do not divide by the pipeline degree, ZeRO 0 to 3, every dtype and small
architectures whose tensors end at sizes no block device likes. `free_layouts()` draws arbitrary valid plans:
empty and single-element tensors, odd byte counts, ranks that write nothing, many tiny files beside one huge
one. `layouts()` is either. Every strategy is bounded (`max_total_bytes`, `max_file_bytes`, `max_files`), and
draws are ordered so that shrinking goes to fewer ranks, files and tensors, smaller sizes and dtype int8:
the failing layout a person reads is small. `describe_plan` prints one compactly; `note_plan` records it, with
the plan file (planfile.dump_plan) that reproduces it, in Hypothesis' failure report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ckptqual.plan.model import DTYPE_BYTES, CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.planfile import dump_plan
from ckptqual.plan.workloads import Architecture, Parallelism, WorkloadError, deepspeed_plan

# int8 first: a drawn dtype shrinks towards it (one byte per element: byte counts read as element counts).
DTYPES: tuple[str, ...] = (
    "int8",
    "float16",
    "bfloat16",
    "float32",
    *(name for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)),
)
DEFAULT_MAX_TOTAL_BYTES = 4 << 20
SUBDIRECTORIES = ("", "sub", "global_step1", "sub/deeper/still")
_TINY_FILE_ELEMENTS = 8  # the "many small files" of a skewed free layout hold at most this many elements


def dtypes(allowed: Sequence[str] | None = None) -> st.SearchStrategy[str]:
    """A dtype name of plan.DTYPE_BYTES that this torch has; shrinks towards the first (int8 by default)."""
    names = tuple(allowed) if allowed is not None else DTYPES
    unknown = [name for name in names if name not in DTYPE_BYTES or not hasattr(torch, name)]
    if not names or unknown:
        raise InvalidArgument(f"dtypes: need names from {', '.join(DTYPES)}, got {list(names)!r}")
    return st.sampled_from(names)


def _largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The largest x in [lo, hi] with ok(x), for ok monotone (true then false) and ok(lo) true."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _check_bounds(max_total_bytes: int, max_file_bytes: int | None, max_files: int) -> int:
    """Validates the common size bounds; returns the effective max_file_bytes."""
    for name, value, minimum in (("max_total_bytes", max_total_bytes, 0), ("max_files", max_files, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InvalidArgument(f"{name}: must be an integer >= {minimum}, got {value!r}")
    if max_file_bytes is None:
        return max_total_bytes
    if not isinstance(max_file_bytes, int) or isinstance(max_file_bytes, bool) or max_file_bytes < 0:
        raise InvalidArgument(f"max_file_bytes: must be an integer >= 0 or None, got {max_file_bytes!r}")
    return min(max_file_bytes, max_total_bytes)


# ----------------------------------------------------------------------------------------------- deepspeed


@dataclass(frozen=True)
class DeepSpeedLayout:
    """A drawn DeepSpeed job and its plan, so that a property can compare the plan with the model it splits."""

    architecture: Architecture
    parallelism: Parallelism
    model_dtype: str
    optimizer_dtype: str
    plan: CheckpointPlan = field(repr=False)  # the fields above rebuild it; its repr would run to megabytes


@dataclass(frozen=True)
class _Limits:
    total_bytes: int
    file_bytes: int
    files: int


def _deepspeed_files(par: Parallelism, layers: int) -> int:
    """Files of a DeepSpeed checkpoint: optimizer files plus model files (one per layer and TP rank if PP > 1)."""
    optimizer = par.tp * par.pp if par.zero_stage == 0 else par.world_size
    if par.zero_stage == 3:
        return optimizer + par.world_size
    return optimizer + (par.tp if par.pp == 1 else par.tp * (layers + 3))


def _deepspeed_bytes(arch: Architecture, par: Parallelism, model_bytes: int, optimizer_bytes: int) -> int:
    """Exact plan bytes: model N + (TP-1)(2L+1)h (norms replicated over TP), optimizer 3 (N // writers) + 15h per
    writer."""
    n, h = arch.parameter_count(), arch.hidden
    writers = par.tp * par.pp if par.zero_stage == 0 else par.world_size
    model = n + (par.tp - 1) * (2 * arch.layers + 1) * h
    return model * model_bytes + (3 * (n // writers) + 15 * h) * writers * optimizer_bytes


def _deepspeed_fits(
    limits: _Limits, arch_values: dict[str, int], par_values: dict[str, int], mdt: str, odt: str
) -> bool:
    """Whether the job fits the limits (an invalid architecture does not)."""
    try:
        arch = Architecture(**arch_values)
        par = Parallelism(**par_values)
    except WorkloadError:
        return False
    if _deepspeed_files(par, arch.layers) > limits.files:
        return False
    if _deepspeed_bytes(arch, par, DTYPE_BYTES[mdt], DTYPE_BYTES[odt]) > limits.total_bytes:
        return False
    if limits.file_bytes >= limits.total_bytes:
        return True
    return deepspeed_plan(arch, par, model_dtype=mdt, optimizer_dtype=odt).largest_file_bytes <= limits.file_bytes


_MIN_ARCH = {"layers": 1, "hidden": 1, "ffn_hidden": 1, "heads": 1, "kv_heads": 1, "vocab": 1}


def deepspeed_setups(
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_file_bytes: int | None = None,
    max_files: int = 64,
    max_world_size: int = 16,
    max_layers: int = 12,
    max_heads: int = 8,
    zero_stages: Sequence[int] = (0, 1, 2, 3),
    model_dtypes: Sequence[str] | None = None,
    optimizer_dtypes: Sequence[str] | None = None,
) -> st.SearchStrategy[DeepSpeedLayout]:
    """A DeepSpeed job (architecture, TP x PP x DP, ZeRO stage, dtypes) within the bounds, with its plan.

    Draw order (and so shrink order): ZeRO stage, model and optimizer dtypes, TP, PP, DP, heads, KV heads,
    hidden, layers, ffn, vocab; each bounded by what still fits with the rest at their minimum.
    """
    limits = _Limits(max_total_bytes, _check_bounds(max_total_bytes, max_file_bytes, max_files), max_files)
    for name, value in (("max_world_size", max_world_size), ("max_layers", max_layers), ("max_heads", max_heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgument(f"{name}: must be an integer >= 1, got {value!r}")
    stages = tuple(zero_stages)
    if not stages or any(stage not in (0, 1, 2, 3) for stage in stages):
        raise InvalidArgument(f"zero_stages: must be stages from 0 to 3, got {list(stages)!r}")
    widest = [max(allowed or DTYPES, key=DTYPE_BYTES.__getitem__) for allowed in (model_dtypes, optimizer_dtypes)]
    if not _deepspeed_fits(limits, _MIN_ARCH, {"tp": 1, "pp": 1, "dp": 1, "zero_stage": stages[0]}, *widest):
        raise InvalidArgument(
            f"max_total_bytes={max_total_bytes}, max_file_bytes={max_file_bytes}, max_files={max_files}: "
            "too small for even a one-rank, one-layer model of hidden size 1"
        )
    bounds = _DeepSpeedBounds(limits, stages, max_world_size, max_layers, max_heads)
    return st.composite(lambda draw: _DeepSpeedDraw(draw, bounds).setup(model_dtypes, optimizer_dtypes))()


@dataclass(frozen=True)
class _DeepSpeedBounds:
    limits: _Limits
    stages: tuple[int, ...]
    max_world_size: int
    max_layers: int
    max_heads: int


class _DeepSpeedDraw:
    """One draw of a DeepSpeed job, step by step, each choice bounded by what still fits."""

    def __init__(self, draw: st.DrawFn, bounds: _DeepSpeedBounds) -> None:
        self.draw, self.bounds = draw, bounds
        self.arch = dict(_MIN_ARCH)

    def fits(self) -> bool:
        return _deepspeed_fits(self.bounds.limits, self.arch, self.par, self.mdt, self.odt)

    def bounded(self, values: dict[str, int], key: str, hi: int, unit: int = 1, often: int = 0) -> None:
        """Draws values[key] = unit * k, k up to the largest that fits with all later choices at their minimum.

        With `often`, k is at most `often` half of the time (so a first degree does not take the whole world)."""

        def ok(k: int) -> bool:
            values[key] = unit * k
            return self.fits()

        top = _largest(1, max(1, hi), ok)
        k = st.integers(1, top)
        values[key] = unit * self.draw(st.one_of(st.integers(1, min(often, top)), k) if often else k)

    def setup(self, model_dtypes: Sequence[str] | None, optimizer_dtypes: Sequence[str] | None) -> DeepSpeedLayout:
        zero = self.draw(st.sampled_from(self.bounds.stages))
        self.mdt, self.odt = self.draw(dtypes(model_dtypes)), self.draw(dtypes(optimizer_dtypes))
        self.par = {"tp": 1, "pp": 1, "dp": 1, "zero_stage": zero}
        self.parallel_degrees()
        self.heads()
        limit = self.bounds.limits.total_bytes
        self.bounded(self.arch, "hidden", limit, unit=self.arch["heads"] // self.arch["kv_heads"])
        self.bounded(self.arch, "layers", self.bounds.max_layers)
        self.bounded(self.arch, "ffn_hidden", limit)
        self.bounded(self.arch, "vocab", limit)
        return self.layout()

    def parallel_degrees(self) -> None:
        world, par = self.bounds.max_world_size, self.par
        self.bounded(par, "tp", world, often=8)
        self.bounded(par, "pp", world // par["tp"], often=8)
        self.bounded(par, "dp", world // (par["tp"] * par["pp"]), often=8)

    def heads(self) -> None:
        """Heads, then KV heads among its divisors that fit (hidden is drawn as a multiple of heads / kv_heads)."""
        self.arch["heads"] = heads = self.draw(st.integers(1, self.bounds.max_heads))
        kv_choices = []
        for kv in (d for d in range(1, heads + 1) if heads % d == 0):
            self.arch.update(kv_heads=kv, hidden=heads // kv)
            if self.fits():
                kv_choices.append(kv)
        self.arch["kv_heads"] = self.draw(st.sampled_from(kv_choices))

    def layout(self) -> DeepSpeedLayout:
        architecture, parallelism, a = Architecture(**self.arch), Parallelism(**self.par), self.arch
        description = (
            f"L={a['layers']} h={a['hidden']} ffn={a['ffn_hidden']} heads={a['heads']} kv={a['kv_heads']} "
            f"V={a['vocab']}; model {self.mdt}, optimizer {self.odt}"
        )
        plan = deepspeed_plan(
            architecture, parallelism, model_dtype=self.mdt, optimizer_dtype=self.odt, description=description
        )
        return DeepSpeedLayout(architecture, parallelism, self.mdt, self.odt, plan)


def deepspeed_layouts(**bounds: object) -> st.SearchStrategy[CheckpointPlan]:
    """The plan of a `deepspeed_setups(**bounds)` job: workloads.deepspeed_plan at odd degrees and sizes."""
    return deepspeed_setups(**bounds).map(lambda setup: setup.plan)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------- free


def _numel(cap: int) -> st.SearchStrategy[int]:
    """An element count up to `cap`: tiny, small or anything, shrinking to tiny and then to 0."""
    return st.one_of(st.integers(0, min(cap, 3)), st.integers(0, min(cap, 5000)), st.integers(0, cap))


def free_layouts(
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_file_bytes: int | None = None,
    max_files: int = 64,
    max_ranks: int = 16,
    max_files_per_rank: int = 8,
    max_tensors_per_file: int = 6,
    allowed_dtypes: Sequence[str] | None = None,
) -> st.SearchStrategy[CheckpointPlan]:
    """Arbitrary valid plans: 1..max_ranks ranks of 0..max_files_per_rank files of 0..max_tensors_per_file tensors.

    Sizes are drawn against what is left of the total and file budgets, so bounds always hold. Besides, the
    last rank often writes one huge file and rank 0 many tiny ones (`tiny/`): both are chosen first but shrink
    to nothing, and the tiny files' sizes are drawn last, so a failure that does not need them sheds them.
    Paths are unique over the checkpoint by construction (`<subdirectory>/rank{r}_file{f}.pt`).
    """
    file_bytes = _check_bounds(max_total_bytes, max_file_bytes, max_files)
    for name, value, minimum in (
        ("max_ranks", max_ranks, 1),
        ("max_files_per_rank", max_files_per_rank, 0),
        ("max_tensors_per_file", max_tensors_per_file, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise InvalidArgument(f"{name}: must be an integer >= {minimum}, got {value!r}")
    first_dtype = next(iter(allowed_dtypes)) if allowed_dtypes else DTYPES[0]
    bounds = _FreeBounds(
        max_total_bytes,
        file_bytes,
        max_files,
        max_ranks,
        max_files_per_rank,
        max_tensors_per_file,
        dtypes(allowed_dtypes),
        first_dtype,
        min(_TINY_FILE_ELEMENTS * DTYPE_BYTES[first_dtype], file_bytes),
    )
    return st.composite(lambda draw: _FreeDraw(draw, bounds).plan())()


@dataclass(frozen=True)
class _FreeBounds:
    total_bytes: int
    file_bytes: int
    files: int
    ranks: int
    files_per_rank: int
    tensors_per_file: int
    dtype: st.SearchStrategy[str]
    first_dtype: str
    tiny_bytes: int


class _FreeDraw:
    """One draw of a free layout, step by step against what is left of the budgets."""

    def __init__(self, draw: st.DrawFn, bounds: _FreeBounds) -> None:
        self.draw, self.bounds = draw, bounds
        self.budget, self.files_left = bounds.total_bytes, bounds.files

    def plan(self) -> CheckpointPlan:
        n_ranks = self.draw(st.integers(1, self.bounds.ranks))
        huge = self.huge_tensor()
        n_tiny = self.tiny_count()
        ranks = [self.rank_files(r) for r in range(n_ranks)]
        ranks[0] += self.tiny_files(n_tiny)
        if huge is not None:  # named like any other file: shrunk to one byte it reads as one
            ranks[-1].append(FilePlan(f"rank{n_ranks - 1}_file{len(ranks[-1])}.pt", (huge,)))
        plan_ranks = tuple(RankPlan(r, tuple(files)) for r, files in enumerate(ranks))
        return CheckpointPlan("free", plan_ranks, description=f"{n_tiny} tiny files on rank 0" if n_tiny else "")

    def huge_tensor(self) -> TensorSpec | None:
        """None, any size, or at least half the budget; shrinks through the first branches to none."""
        most = min(self.bounds.file_bytes, self.budget)
        sizes = st.one_of(st.just(0), st.integers(0, most), st.integers(most // 2, most))
        huge_bytes = self.draw(sizes) if self.files_left else 0
        if not huge_bytes:
            return None
        dtype = self.draw(self.bounds.dtype)
        if not huge_bytes // DTYPE_BYTES[dtype]:
            return None
        huge = TensorSpec("t0", huge_bytes // DTYPE_BYTES[dtype], dtype)
        self.budget, self.files_left = self.budget - huge.nbytes, self.files_left - 1
        return huge

    def tiny_count(self) -> int:
        """How many tiny files (their bytes reserved now, their sizes drawn at the very end)."""
        tiny = self.bounds.tiny_bytes
        cap = min(self.files_left, self.budget // tiny if tiny else self.files_left)
        n_tiny = self.draw(st.one_of(st.just(0), st.integers(0, cap)))
        self.budget, self.files_left = self.budget - n_tiny * tiny, self.files_left - n_tiny
        return n_tiny

    def rank_files(self, rank: int) -> list[FilePlan]:
        count = self.draw(st.integers(0, min(self.files_left, self.bounds.files_per_rank)))
        files = [self.file(rank, f) for f in range(count)]
        self.files_left -= len(files)
        return files

    def file(self, rank: int, index: int) -> FilePlan:
        subdirectory = self.draw(st.sampled_from(SUBDIRECTORIES))
        left = min(self.budget, self.bounds.file_bytes)
        tensors = []
        for t in range(self.draw(st.integers(0, self.bounds.tensors_per_file))):
            dtype = self.draw(self.bounds.dtype)
            tensors.append(TensorSpec(f"t{t}", self.draw(_numel(left // DTYPE_BYTES[dtype])), dtype))
            left -= tensors[-1].nbytes
            self.budget -= tensors[-1].nbytes
        return FilePlan(f"{subdirectory}/rank{rank}_file{index}.pt".lstrip("/"), tuple(tensors))

    def tiny_files(self, count: int) -> list[FilePlan]:
        dtype = self.bounds.first_dtype
        return [
            FilePlan(
                f"tiny/rank0_file{i}.pt",
                (TensorSpec("t0", self.draw(st.integers(0, self.bounds.tiny_bytes // DTYPE_BYTES[dtype])), dtype),),
            )
            for i in range(count)
        ]


def layouts(
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_file_bytes: int | None = None,
    max_files: int = 64,
    max_ranks: int = 16,
) -> st.SearchStrategy[CheckpointPlan]:
    """A free layout or a DeepSpeed one (free first: a failure shrinks towards the simpler kind if it can)."""
    bounds = {"max_total_bytes": max_total_bytes, "max_file_bytes": max_file_bytes, "max_files": max_files}
    return st.one_of(
        free_layouts(max_ranks=max_ranks, **bounds),  # type: ignore[arg-type]
        deepspeed_layouts(max_world_size=max_ranks, **bounds),
    )


# ------------------------------------------------------------------------------------------------- output


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _tensor_text(tensor: TensorSpec) -> str:
    return f"{tensor.name} {tensor.dtype}[{tensor.numel}]"


def describe_plan(plan: CheckpointPlan, *, max_ranks: int = 16, max_files: int = 6, max_tensors: int = 4) -> str:
    """A short, readable picture of `plan`: a header, then per rank its files and their first tensors.

    Runs of ranks that write nothing share a line; longer lists end with '+N more'.
    """
    tensors = sum(len(f.tensors) for r in plan.ranks for f in r.files)
    head = f"{plan.workload}"
    if plan.description:
        description = plan.description if len(plan.description) <= 100 else plan.description[:97] + "..."
        head += f" ({description})"
    if plan.parallelism:
        head += " " + " ".join(f"{k}={v}" for k, v in plan.parallelism.items())
    if plan.scale != 1:
        head += f" scale={plan.scale:g}"
    lines = [
        f"{head}: {_count(len(plan.ranks), 'rank')}, {_count(plan.file_count, 'file')}, "
        f"{_count(tensors, 'tensor')}, {plan.total_bytes:,} B",
    ]
    shown = 0
    index = 0
    while index < len(plan.ranks):
        if shown == max_ranks:
            lines.append(f"  ... +{len(plan.ranks) - index} more ranks")
            break
        rank = plan.ranks[index]
        if not rank.files:
            end = index
            while end + 1 < len(plan.ranks) and not plan.ranks[end + 1].files:
                end += 1
            label = f"rank {rank.rank}" if end == index else f"ranks {rank.rank}-{plan.ranks[end].rank}"
            lines.append(f"  {label}: nothing")
            index, shown = end + 1, shown + 1
            continue
        lines.append(f"  rank {rank.rank}: {_count(len(rank.files), 'file')}, {rank.nbytes:,} B")
        for spec in rank.files[:max_files]:
            listed = ", ".join(_tensor_text(t) for t in spec.tensors[:max_tensors])
            if len(spec.tensors) > max_tensors:
                listed += f", +{len(spec.tensors) - max_tensors} more"
            lines.append(f"    {spec.path} ({spec.nbytes:,} B): [{listed}]")
        if len(rank.files) > max_files:
            rest = rank.files[max_files:]
            lines.append(f"    ... +{_count(len(rest), 'more file')} ({sum(f.nbytes for f in rest):,} B)")
        index, shown = index + 1, shown + 1
    return "\n".join(lines)


def note_plan(plan: CheckpointPlan) -> None:
    """Records `plan` for Hypothesis' failure report: the short picture and the plan file that reproduces it."""
    note(f"layout:\n{describe_plan(plan)}")
    note(f"plan file (save it and pass it to planfile.load_plan to reproduce):\n{dump_plan(plan)}")
