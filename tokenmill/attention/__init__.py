from tokenmill.attention.backend import AttentionBackend, BatchLayout


def get_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        from tokenmill.attention.torch_paged import TorchPagedBackend
        return TorchPagedBackend()
    if name == "reference":
        from tokenmill.attention.reference import ReferenceBackend
        return ReferenceBackend()
    raise ValueError(f"attention_backend must be one of torch, reference; got {name!r}")


__all__ = ["AttentionBackend", "BatchLayout", "get_attention_backend"]
