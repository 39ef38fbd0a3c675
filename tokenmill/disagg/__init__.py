"""Prefill/decode disaggregation: the KV connector (two halves), the shared-memory connector, the
router's policy and the router."""
