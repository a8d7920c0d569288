"""What a rank keeps between cases: its identity, its device, and the meshes it has made."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch

FULL_GC_EVERY = 50


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

    def end_case(self) -> None:
        """Leave nothing of the case behind that could change the next one.

        Composed modules hold reference cycles (hooks <-> states), so a case's model is freed by
        the cycle collector. A full collection costs ~75 ms with torch loaded, more than a small
        case; the young generations (where a case's objects are) cost microseconds. So: young
        generations after every case, a full collection every FULL_GC_EVERY cases.
        """
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._cases += 1
        gc.collect(1 if self._cases % FULL_GC_EVERY else 2)
