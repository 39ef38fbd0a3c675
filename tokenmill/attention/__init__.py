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
