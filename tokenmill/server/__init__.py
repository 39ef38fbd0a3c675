"""OpenAI-compatible HTTP server: `build_app` (FastAPI) and `run_server` (`tokenmill serve`)."""
