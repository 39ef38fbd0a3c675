"""Expert parallelism over torch.distributed: each process holds a contiguous share of every MoE
layer's experts, and token rows travel to their expert's owner and back by all-to-all.

Set up once per process, before the model is built: `init_expert_parallel()` (the default group:
gloo between CPU processes here; NCCL between GPUs takes the same calls). Every process runs the
same engine on the same requests (attention and everything but the experts is replicated), so all
of them step in lockstep. Inside an MoE layer, process r dispatches the (token, expert) assignments
of its own slice of the step's tokens:

  1. sort its assignments by expert (so by owner); all_to_all the counts, then the expert ids and
     the hidden rows;
  2. run the rows it received through its experts, grouped by expert (one matmul pair each);
  3. all_to_all the results back (the reverse split), weight them, add them to their tokens;
  4. all_gather the slices so every process has the whole step's output again.

The result is token-identical to one process: each expert sees exactly the same rows, and each
token sums the same k weighted rows (in the same order)."""
from __future__ import annotations

import torch
import torch.distributed as dist

_group: dist.ProcessGroup | None = None


def init_expert_parallel(group: dist.ProcessGroup | None = None) -> None:
    """Experts are split over `group` (default: the whole world of an initialized process group)."""
    global _group
    if not dist.is_initialized():
        raise RuntimeError("expert parallelism needs torch.distributed.init_process_group() first")
    _group = group or dist.group.WORLD


def shutdown_expert_parallel() -> None:
    global _group
    _group = None


def is_enabled() -> bool:
    return _group is not None and dist.get_world_size(_group) > 1


def world() -> tuple[int, int]:
    """(rank, size) in the expert-parallel group; (0, 1) without one."""
    if not is_enabled():
        return 0, 1
    return dist.get_rank(_group), dist.get_world_size(_group)


def _per_rank(num_experts: int, size: int) -> int:
    return -(-num_experts // size)


def local_experts(num_experts: int) -> range:
    rank, size = world()
    per = _per_rank(num_experts, size)
    return range(min(num_experts, rank * per), min(num_experts, (rank + 1) * per))


def _token_slice(num_tokens: int, rank: int, size: int) -> tuple[int, int]:
    per = -(-num_tokens // size)
    return min(num_tokens, rank * per), min(num_tokens, (rank + 1) * per)


def dispatch_combine(experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     counts: torch.Tensor) -> torch.Tensor:
    """The EP version of Experts.forward (see the module doc). `counts`: tokens per expert over the
    whole step (every process routed the same tokens)."""
    rank, size = world()
    num_tokens, k = ids.shape
    t0, t1 = _token_slice(num_tokens, rank, size)
    per = _per_rank(experts.num_experts, size)
    # 1. this process's assignments, sorted by expert (hence by owner)
    flat = ids[t0:t1].reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = t0 + order // k
    send_ids = flat[order]
    send_counts = torch.bincount(send_ids // per, minlength=size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=_group)
    send_split, recv_split = send_counts.tolist(), recv_counts.tolist()
    recv_ids = send_ids.new_empty(sum(recv_split))
    dist.all_to_all_single(recv_ids, send_ids, recv_split, send_split, group=_group)
    recv_rows = x.new_empty(sum(recv_split), x.shape[1])
    dist.all_to_all_single(recv_rows, x[token].contiguous(), recv_split, send_split, group=_group)
    # 2. the received rows through this process's experts, grouped by expert across senders
    local = experts.local
    regroup = torch.argsort(recv_ids, stable=True)
    local_counts = torch.bincount(recv_ids - local.start, minlength=len(local)).tolist()
    done = torch.empty_like(recv_rows)
    done[regroup] = experts.run_grouped(recv_rows[regroup], local_counts, local.start)
    # 3. back to the senders, weighted, onto their tokens
    back = x.new_empty(len(send_ids), x.shape[1])
    dist.all_to_all_single(back, done, send_split, recv_split, group=_group)
    back.mul_(weights[t0:t1].reshape(-1)[order, None].to(back.dtype))
    mine = torch.zeros(t1 - t0, x.shape[1], dtype=x.dtype).index_add_(0, token - t0, back)
    # 4. every process gets the whole step's output
    rows = -(-num_tokens // size)
    padded = torch.zeros(rows, x.shape[1], dtype=x.dtype)
    padded[:t1 - t0] = mine
    gathered = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(gathered, padded, group=_group)
    return torch.cat(gathered)[:num_tokens]
