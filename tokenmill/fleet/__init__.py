"""A fleet: several pools of engines (a model, an engine configuration, a hardware profile with a
price and pinned cores, replicas) behind one OpenAI endpoint, routed by SLO class, billed in a
cost ledger, shown on a dashboard. See `config.py` (the file), `policy.py` (routing),
`router.py` + `runtime.py` (live state), `proxy.py` + `app.py` (HTTP), `ledger.py`."""
