"""What a rank keeps between cases: its identity, its device, and the meshes it has made."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch

FULL_GC_EVERY = 50


class CollectivesOutOfStep(RuntimeError):
    """After a case, the ranks had not issued the same collectives (see RankContext.end_case)."""


@dataclass
class RankContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    #: Meshes by shape. A mesh creates process groups, and process groups are never freed
    #: while the default group lives, so a campaign that made one per case would leak; shapes
    #: are few, so each is made once.
    _meshes: dict[tuple[tuple[int, ...], tuple[str, ...]], Any] = field(default_factory=dict)

    def mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        key = (shape, names)
        if key not in self._meshes:
            self._meshes[key] = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        return self._meshes[key]

    _cases: int = 0
    #: Groups made outside meshes (e.g. the async saves' own group) that the step check covers.
    extra_groups: list[Any] = field(default_factory=list)
    #: Groups of every rank by name (:meth:`group`), made once for the same reason as meshes.
    _groups: dict[str, Any] = field(default_factory=dict)

    def group(self, name: str) -> Any:
        """A process group of every rank, made on first use under ``name`` (``replicate``'s
        explicit ``process_group``); the step check covers it."""
        import torch.distributed as dist

        if name not in self._groups:
            self._groups[name] = dist.new_group(list(range(self.world_size)))
            self.extra_groups.append(self._groups[name])
        return self._groups[name]

    def _check_in_step(self) -> None:
        """Every rank ends the case having issued as many collectives as the others, on every
        group this process has made.

        gloo pairs collectives by order, not by kind: a rank that ran one collective more than
        the others (a broadcast's root, say, which completes without a receiver) leaves its
        message queued, and the next case on the pool would read it as its own and fail for
        no fault of its own, by an abort in gloo or wrong values. Here each rank all-gathers
        this case's number on each group: out of step, the gather sees other numbers (raised
        as CollectivesOutOfStep), or never completes (a hang), and either way the case that
        caused it is the one that fails. CPU tensors, so gloo carries the check under NCCL too.
        """
        import torch.distributed as dist

        groups: list[Any] = [None]
        for mesh in self._meshes.values():
            groups.extend(mesh.get_all_groups())
        groups.extend(self.extra_groups)
        seen: set[int] = set()
        mine = torch.tensor([self._cases, self.rank], dtype=torch.int64)
        for group in groups:
            key = id(group if group is not None else dist.group.WORLD)
            if key in seen or not _has_cpu_backend(group):
                continue
            seen.add(key)
            size = dist.get_world_size(group)
            parts = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
            dist.all_gather(parts, mine, group=group)
            out = torch.cat(parts)
            cases = out[0::2].tolist()
            if any(c != self._cases for c in cases):
                raise CollectivesOutOfStep(
                    f"after the case, the ranks' collectives were out of step on group of ranks "
                    f"{dist.get_process_group_ranks(group or dist.group.WORLD)}: this rank "
                    f"(rank {self.rank}, case number {self._cases}) gathered case numbers {cases} from "
                    f"ranks {out[1::2].tolist()}; some rank ran a collective that the others did not"
                )

    def end_case(self) -> None:
        """Leave nothing of the case behind that could change the next one.

        Composed modules hold reference cycles (hooks <-> states), so a case's model is freed by
        the cycle collector. A full collection costs ~75 ms with torch loaded, more than a small
        case; the young generations (where a case's objects are) cost microseconds. So: young
        generations after every case, a full collection every FULL_GC_EVERY cases.
        """
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._check_in_step()
        self._cases += 1
        gc.collect(1 if self._cases % FULL_GC_EVERY else 2)


def _has_cpu_backend(group: Any) -> bool:
    import torch.distributed as dist

    pg: Any = group if group is not None else dist.group.WORLD
    try:
        pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return False
    return True
