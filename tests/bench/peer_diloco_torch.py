"""One rank of a torch DiLoCo peer, run by bench_peers in the torch venv (no akocore here).

    ip netns exec NS python peer_diloco_torch.py RANK WORLD STEPS H THREADS OUT.json \
        IFNAME MY_ADDR RENDEZVOUS DATA.npz MODE

Trains what akorun trains for digits-mlp (DATA.npz, written by bench_peers from akocore:
the same split, initial parameters and per-rank batches), with akorun's DiLoCo settings:
inner SGD lr 0.05, batch 32; outer SGD lr 0.7, momentum 0.9, Nesterov; a sync every H
inner steps.

MODE plain: DiLoCo in torch.distributed: a gloo all_reduce of the flat pseudo-gradient
  (RENDEZVOUS is rank 0's ADDR:PORT), then the outer step.
MODE torchft: torchft's DiLoCo (torchft.local_sgd.DiLoCo, a Manager with ProcessGroupGloo,
  one replica group per rank, a synchronous quorum of WORLD, identical init so no init
  sync); RENDEZVOUS is the lighthouse's URL.

Rank 0 evaluates test accuracy at every H-th inner step before the sync (what akorun's
evaluation at round k*H sees) with the clock paused. OUT.json: every inner step's seconds,
the seconds of each sync (inside the H-th step), and the evaluations (s, step, accuracy).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from datetime import timedelta


def main() -> None:
    (rank, world, steps, every, threads, out, ifname, my_addr, rendezvous, data_path,
     mode) = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
              int(sys.argv[5]), sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9],
              sys.argv[10], sys.argv[11])
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(threads)

    class MLP(nn.Module):
        def __init__(self, sizes: list[int]) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers[:-1]:
                x = F.relu(layer(x))
            return self.layers[-1](x)

    d = np.load(data_path)
    n_layers = len([k for k in d.files if k.startswith("w")])
    sizes = [d["w0"].shape[0]] + [d[f"w{i}"].shape[1] for i in range(n_layers)]
    model = MLP(sizes)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            layer.weight.copy_(torch.from_numpy(d[f"w{i}"].T.copy()))
            layer.bias.copy_(torch.from_numpy(d[f"b{i}"]))
    bx = torch.from_numpy(d[f"bx{rank}"])
    by = torch.from_numpy(d[f"by{rank}"].astype(np.int64))
    xt = torch.from_numpy(d["x_test"])
    yt = torch.from_numpy(d["y_test"].astype(np.int64))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    manager = None
    if mode == "torchft":
        from torch.distributed import TCPStore
        from torchft.local_sgd import DiLoCo
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        store = TCPStore(my_addr, 47510, is_master=True, wait_for_workers=False)  # noqa: F841
        manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=300)), min_replica_size=world,
            use_async_quorum=False,
            load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
            state_dict=lambda: {"model": model.state_dict()},
            replica_id=f"peer{rank}", store_addr=my_addr, store_port=47510, rank=0,
            world_size=1, lighthouse_addr=rendezvous, port=47520, hostname=my_addr,
            init_sync=False, timeout=timedelta(seconds=300),
            quorum_timeout=timedelta(seconds=300), connect_timeout=timedelta(seconds=60))
        ctx: contextlib.AbstractContextManager = DiLoCo(manager, [model], inner, outer,
                                                        sync_every=every)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{rendezvous}", rank=rank,
                                world_size=world)
        anchor = [p.detach().clone() for p in model.parameters()]
        ctx = contextlib.nullcontext()

    step_s: list[float] = []
    sync_s: list[float] = []
    evaluations: list[list[float]] = []
    paused = 0.0
    start = time.perf_counter()
    state = {"step": 0}

    def evaluate(*_args: object) -> None:
        """Rank 0 at a sync step: the local model after its H-th inner update (paused)."""
        nonlocal paused
        if rank == 0 and (state["step"] + 1) % every == 0:
            e0 = time.perf_counter()
            with torch.no_grad():
                accuracy = float((model(xt).argmax(1) == yt).float().mean())
            evaluations.append([e0 - start - paused, state["step"] + 1, accuracy])
            paused += time.perf_counter() - e0

    hook = inner.register_step_post_hook(evaluate)  # before DiLoCo's own: runs first
    with ctx:
        for step in range(steps):
            state["step"] = step
            i = step % len(bx)
            t0 = time.perf_counter()
            p0 = paused
            loss = F.cross_entropy(model(bx[i]), by[i])
            inner.zero_grad(set_to_none=True)
            loss.backward()
            is_sync = (step + 1) % every == 0
            s0 = time.perf_counter()
            inner.step()  # torchft: DiLoCo's post hook syncs inside the H-th step
            if is_sync and mode == "plain":
                with torch.no_grad():
                    flat = torch.cat([(a - p.detach()).reshape(-1)
                                      for a, p in zip(anchor, model.parameters(), strict=True)])
                    dist.all_reduce(flat)
                    flat /= world
                    offset = 0
                    for a, p in zip(anchor, model.parameters(), strict=True):
                        n = p.numel()
                        p.copy_(a)
                        p.grad = flat[offset:offset + n].view_as(p).clone()
                        offset += n
                outer.step()
                outer.zero_grad(set_to_none=True)
                with torch.no_grad():
                    for a, p in zip(anchor, model.parameters(), strict=True):
                        a.copy_(p)
            t1 = time.perf_counter()
            step_s.append(t1 - t0 - (paused - p0))
            if is_sync:
                sync_s.append(t1 - s0 - (paused - p0))
    hook.remove()
    record = {"rank": rank, "mode": mode, "every": every, "steps": steps,
              "train_s": time.perf_counter() - start - paused, "step_s": step_s,
              "sync_s": sync_s, "evaluations": evaluations}
    with open(out, "w") as f:
        json.dump(record, f)
    if manager is not None:
        manager.shutdown(wait=False)
    os._exit(0)


if __name__ == "__main__":
    main()
