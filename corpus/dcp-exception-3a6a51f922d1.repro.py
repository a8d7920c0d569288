#!/usr/bin/env python3
# shardfuzz reduced reproducer: entry=24cba4b5d3ca2075 sources=4cc18416ea30ea14 seconds=891.9
# Reproduces shardfuzz corpus entry dcp-exception-3a6a51f922d1.json: exception:dcp:builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict
# Known torch bug: the classic FSDP1 DCP recipe with an optimizer without state:
# optim_state_dict_to_load refuses the dict without 'state'; upstream: none found.
# Observed: rank 0 raised builtins.ValueError: `optim_state_dict` must have the keys "state"to be
# a valid optimizer state dict
# Run: torchrun --nproc-per-node 2 THIS_FILE.py: while the failure is there a rank raises
# builtins.ValueError in torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict, prints
# its traceback and REPRODUCED and exits 1; once it is gone rank 0 prints PASS and every rank
# exits 0 (expected: no rank raises); a rank exits 2 where the script cannot run (not under
# torchrun, another world size) or the case fails another way (it prints FAIL). torchrun's own
# status is 1 whenever a rank's is not 0.

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

def torch_frame(path: str, function: str) -> str | None:
    at = path.rfind('/torch/')
    inner = path[at + 1:]
    if at < 0 or '/fuzz/' in path or '-packages/' in inner or (function in ('<listcomp>', '<dictcomp>', '<setcomp>')):
        return None
    return f'{inner}:{function}'


if __name__ == "__main__":
    import os
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import sys
    import time
    if os.environ.get("WORLD_SIZE") != "2":
        print("run it with: torchrun --nproc-per-node 2 " + sys.argv[0], file=sys.stderr)
        sys.exit(2)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    import re
    import traceback
    try:
        attempt(rank, world_size)
    except BaseException as e:  # torch's CheckpointException is a BaseException
        text = traceback.format_exc()
        sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
        frames = [f for f in (torch_frame(p, f) for p, f in re.findall(r'File "([^"]+)", line \d+,? in (\S+)', text)) if f]
        found = f"{type(e).__module__}.{type(e).__qualname__}@{(frames or ['torch/?:?'])[-1]}"
        if found in ['builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict']:
            print(f"REPRODUCED exception:dcp:builtins.ValueError@torch/distributed/fsdp/_optim_utils.py:_flatten_optim_state_dict: rank {rank} raised {found}", flush=True)
            os._exit(1)
        print(f"FAIL (not the entry's failure): rank {rank} raised {found}", flush=True)
        os._exit(2)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.add("repro-passed", 1)
    until = time.monotonic() + 60
    while store.add("repro-passed", 0) < world_size:
        if time.monotonic() > until:
            print(f"FAIL (not the entry's failure): rank {rank} finished, another rank did not", flush=True)
            os._exit(2)
        time.sleep(0.05)
    if rank == 0:
        print('PASS: no rank raised', flush=True)
    os._exit(0)  # a rank must not wait for the others at exit
