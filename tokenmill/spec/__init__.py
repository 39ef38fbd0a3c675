"""Speculative decoding: proposers (draft tokens) and the verification of drafts."""
