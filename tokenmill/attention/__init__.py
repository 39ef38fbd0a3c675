from tokenmill.attention.backend import AttentionBackend, BatchLayout


def get_attention_backend(name: str) -> AttentionBackend:
    """auto: our C++ decode kernel if it builds on this machine ("cpu"), else pure PyTorch ("torch")."""
    if name in ("auto", "cpu"):
        from tokenmill.kernels import cpu_ops
        if name == "cpu" or cpu_ops.load():
            from tokenmill.attention.cpu_paged import CpuPagedBackend
            return CpuPagedBackend()
        name = "torch"
    if name == "torch":
        from tokenmill.attention.torch_paged import TorchPagedBackend
        return TorchPagedBackend()
    if name == "reference":
        from tokenmill.attention.reference import ReferenceBackend
        return ReferenceBackend()
    raise ValueError(f"attention_backend must be one of auto, cpu, torch, reference; got {name!r}")


__all__ = ["AttentionBackend", "BatchLayout", "get_attention_backend"]


def enable_batch_invariance(attention_backend: str, dtype: str) -> None:
    """Batch-invariant mode for this process (EngineConfig.batch_invariant): our kernels sum every
    row in one order whatever the batch, and short chunks attend as decode rows. Needs our C++
    kernels and their attention backend (SDPA and oneDNN are not batch-invariant)."""
    from tokenmill.kernels import cpu_ops
    if attention_backend not in ("auto", "cpu") or not cpu_ops.load():
        raise ValueError("batch_invariant needs our C++ kernels and attention_backend 'auto' or 'cpu'; got "
                         f"attention_backend={attention_backend!r}, kernels {'built' if cpu_ops.load() else 'unavailable'}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"batch_invariant needs dtype float32 or bfloat16 (our kernels); got dtype={dtype!r}")
    cpu_ops.set_batch_invariant(True)
