"""Engines on a Ray cluster (extra `tokenmill[ray]`): each engine replica is a Ray actor that runs
`tokenmill serve` on the node Ray placed it on and reports its URL; Ray restarts it if it dies.
The router (`tokenmill cluster --launcher ray`) and the fleet (a pool with `launcher: ray`) address
it by that URL exactly as they address a local engine. See engine_actor.py and launcher.py."""
