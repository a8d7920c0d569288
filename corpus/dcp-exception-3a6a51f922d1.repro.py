#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=24cba4b5d3ca2075 sources=4cc18416ea30ea14 seconds=891.9
# Reproduces shardfuzz corpus entry dcp-exception-3a6a51f922d1.json: exception:dcp:builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict
# Known torch bug: the classic FSDP1 DCP recipe with an optimizer without state:
# optim_state_dict_to_load refuses the dict without 'state'; upstream: none found.
# Observed: rank 0 raised builtins.ValueError: `optim_state_dict` must have the keys "state"to be
# a valid optimizer state dict
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.ValueError in torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict and
# torchrun exits 1; else every rank prints PASS and it exits 0.

from __future__ import annotations
import torch
import enum
import os
from torch import nn

class DcpItem(str, enum.Enum):
    OPTIMIZER = 'optimizer'

class TreeBlock(nn.Module):

    def __init__(self, children, scale):
        super().__init__()
        for i, child in enumerate(children):
            self.add_module(str(i), child)
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(4)) if scale else None

def attempt(rank, world_size):
    path = os.path.join('/tmp/shardfuzz-dcp-5990', '9d803fd3a9b4-0')
    build_model_out = TreeBlock([TreeBlock([], True)], False)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP__
    wrap_out = FSDP__(build_model_out, device_id=torch.device('cpu'))
    params = list(wrap_out.parameters())
    src_opt = torch.optim.SGD(params)
    out = {}
    osd_ = FSDP__.optim_state_dict(wrap_out, src_opt)
    out[DcpItem.OPTIMIZER] = osd_
    order = range(1)
    state = {(DcpItem.OPTIMIZER,)[i].value: out[DcpItem.OPTIMIZER] for i in order if (DcpItem.OPTIMIZER,)[i] in out}
    import torch.distributed.checkpoint as dcp
    dcp.save(state, checkpoint_id=path)
    build_model_out_ = TreeBlock([TreeBlock([], True)], False)
    wrap_out_ = FSDP__(build_model_out_, device_id=torch.device('cpu'))
    params_ = list(wrap_out_.parameters())
    tgt_opt = torch.optim.SGD(params_)
    from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
    loaded = load_sharded_optimizer_state_dict(model_state_dict=wrap_out_.state_dict(), optimizer_key='optimizer', storage_reader=dcp.FileSystemReader(path))
    osd = loaded['optimizer']
    tgt_opt.load_state_dict(FSDP__.optim_state_dict_to_load(wrap_out_, tgt_opt, osd))

if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch.distributed as dist
    dist.init_process_group("gloo")
    attempt(dist.get_rank(), dist.get_world_size())
    print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
