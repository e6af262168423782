"""How long a checkpoint took: each rank's share on the common clock, each node's view, the host's use meanwhile."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from ckptqual.host.cpu import HostSampler, HostUse, Mark
from ckptqual.host.waits import Waits
from ckptqual.plan.model import RankPlan


@dataclass(frozen=True)
class RankTiming:
    """One rank's share of a checkpoint, on the common clock, relative to the common start."""

    rank: int
    done_s: float
    bytes: int
    files: int
    payload_cpu_s: float
    cpu_s: float  # user+system CPU seconds of the rank's process over its timed part (all its threads)
    node: int = 0  # the node it ran on (runs.cluster); its done_s runs from the common start of that node's ranks
    own_s: float = 0.0  # from its own start to its end: what its phases add up to
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per stage (mkdir, write, fsync, commit)


@dataclass(frozen=True)
class NodeTiming:
    """One node's view of a checkpoint run over several nodes (runs.cluster): its host's use over its ranks' timed
    region and, for a read, the node whose files its ranks read."""

    node: int
    hostname: str
    host: HostUse
    read_from: int | None = None


@dataclass(frozen=True)
class CheckpointTiming:
    """When the ranks of one checkpoint finished; the slowest decides the checkpoint time. `host`: what the host's
    CPUs and the drive did meanwhile, the ranks' CPU seconds included."""

    ranks: tuple[RankTiming, ...]
    host: HostUse
    nodes: tuple[NodeTiming, ...] = ()  # where the ranks ran on several nodes; empty on one host

    @property
    def seconds(self) -> float:
        return max(r.done_s for r in self.ranks)

    @property
    def first_done_s(self) -> float:
        return min(r.done_s for r in self.ranks)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.ranks)

    @property
    def generated_GBps(self) -> float:
        """How fast the ranks could make payload together on their hosts' cores, had they done nothing else (each
        node makes its ranks' share on its own cores at once)."""
        cores = {node.node: node.host.cores for node in self.nodes} or {0: len(os.sched_getaffinity(0))}
        wall = max(
            sum(r.payload_cpu_s for r in ranks) / min(cores[node], len(ranks))
            for node, ranks in self._by_node().items()
        )
        return self.bytes / wall / 1e9 if wall > 0 else float("inf")

    def phase_spread(self) -> dict[str, dict[str, float]]:
        """Per phase (write, fsync, commit, ...), the median, p99 and max of the ranks' seconds in it."""
        names = dict.fromkeys(name for r in self.ranks for name in r.phases)
        return {name: spread([r.phases.get(name, 0.0) for r in self.ranks]) for name in names}

    def _by_node(self) -> dict[int, list[RankTiming]]:
        by_node: dict[int, list[RankTiming]] = {}
        for rank in self.ranks:
            by_node.setdefault(rank.node, []).append(rank)
        return by_node

    def node_figures(self) -> list[dict[str, Any]]:
        """Per node (none on one host): its ranks, bytes, slowest rank and time on its own clock, its host's use and,
        for a read, whose files it read."""
        figures, by_node = [], self._by_node()
        for timing in self.nodes:
            ranks = by_node[timing.node]
            slowest = max(ranks, key=lambda r: r.done_s)
            nbytes = sum(r.bytes for r in ranks)
            figures.append(
                {
                    "node": timing.node,
                    "hostname": timing.hostname,
                    "ranks": [r.rank for r in ranks],
                    "bytes": nbytes,
                    "seconds": slowest.done_s,
                    "slowest_rank": slowest.rank,
                    "GBps": nbytes / slowest.done_s / 1e9 if slowest.done_s > 0 else None,
                    "host": timing.host.to_dict(),
                    "cpu_s_per_GB": timing.host.cpu_s_per_GB(nbytes),
                    "read_files_of_node": timing.read_from,
                }
            )
        return figures


def rank_timings(
    replies: list[dict[str, Any]], plans: tuple[RankPlan | None, ...], nodes: list[int] | None = None
) -> tuple[RankTiming, ...]:
    """Each rank's share from its reply; `nodes[rank]`: the node it ran on. Each node's ranks are timed on that node's
    clock from their common start (clocks of different nodes are not compared)."""
    nodes = nodes or [0] * len(replies)
    starts: dict[int, float] = {}
    for node, reply in zip(nodes, replies, strict=True):
        starts[node] = min(starts.get(node, reply["start"]), reply["start"])
    return tuple(
        RankTiming(
            rank,
            r["end"] - starts[node],
            r["bytes"],
            len(plan.files) if plan else 0,
            r["payload_cpu_s"],
            r["cpu_s"],
            node,
            r["end"] - r["start"],
            dict(r.get("phases", {})),
        )
        for rank, (r, plan, node) in enumerate(zip(replies, plans, nodes, strict=True))
    )


def spread(values: list[float]) -> dict[str, float]:
    """The median, 99th percentile (nearest rank) and max of `values` (at least one)."""
    ordered = sorted(values)
    p99 = ordered[max(0, -(-99 * len(ordered) // 100) - 1)]
    return {"median": statistics.median(ordered), "p99": p99, "max": ordered[-1]}


def host_use(sampler: HostSampler, replies: list[dict[str, Any]]) -> HostUse:
    """The host's use over the ranks' common timed region: from the first rank's start to the last rank's end."""
    first: Mark = min((r["marks"][0] for r in replies), key=lambda mark: mark.wall)
    last: Mark = max((r["marks"][1] for r in replies), key=lambda mark: mark.wall)
    use = sampler.use(first, last, sum(r["cpu_s"] for r in replies))
    return use.waited(Waits.from_dict(r["waits"]) for r in replies if "waits" in r)
