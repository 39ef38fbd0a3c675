"""Quality evaluations (perplexity, agreement) that run through the engine."""
