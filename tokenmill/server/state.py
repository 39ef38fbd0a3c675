"""ServerState: what the routes need, and where the server is in its life (loading, ready, draining)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmill.engine.async_engine import AsyncLLMEngine
from tokenmill.metrics.log_stats import LoggingStatLogger
from tokenmill.metrics.prometheus import PrometheusStatLogger
from tokenmill.server.chat import OpenAIServingChat
from tokenmill.server.completions import OpenAIServingCompletion
from tokenmill.server.errors import APIError
from tokenmill.server.tokenization import PromptTokenizer
from tokenmill.server.tokenize_endpoints import OpenAIServingTokenization

logger = logging.getLogger("tokenmill.server")


@dataclass
class ServerState:
    served_model_names: list[str] | None
    api_key: str | None
    max_waiting_requests: int
    price_per_hour: float
    max_request_body_bytes: int
    chat_template: str | None
    shutdown_timeout: float
    log_stats: bool = True  # a LoggingStatLogger line every few seconds while busy
    engine: AsyncLLMEngine | None = None
    tokenizer: PromptTokenizer | None = None
    completion: OpenAIServingCompletion | None = None
    chat: OpenAIServingChat | None = None
    tokenization: OpenAIServingTokenization | None = None
    stat_logger: PrometheusStatLogger | None = None
    load_error: BaseException | None = None
    draining: bool = False
    on_fatal: Callable[[], None] | None = None  # run_server: stop the process
    started_at: int = field(default_factory=lambda: int(time.time()))

    # -- engine ---------------------------------------------------------------------------------
    def attach(self, engine: AsyncLLMEngine) -> None:
        """Register metrics and go live (called on the event loop once the engine exists)."""
        names = self.served_model_names or [engine.model_name]
        self.served_model_names = names
        if self.stat_logger is None:
            self.stat_logger = PrometheusStatLogger(names[0], self.price_per_hour)
        if self.stat_logger not in engine.engine.stat_loggers:
            engine.engine.stat_loggers.append(self.stat_logger)
            if self.log_stats:
                engine.engine.stat_loggers.append(LoggingStatLogger())
        engine.start()
        # only the name is read here: the engine thread owns the engine's tokenizer object
        self.tokenizer = PromptTokenizer(engine.tokenizer.name_or_path, self.chat_template)
        self.tokenizer.warm_up()
        self.completion = OpenAIServingCompletion(engine, names, self.tokenizer)
        self.chat = OpenAIServingChat(engine, names, self.tokenizer)
        self.tokenization = OpenAIServingTokenization(engine, names, self.tokenizer)
        self.engine = engine
        if self.draining:
            engine.start_draining()
        logger.info("model %s ready (max_model_len=%d, KV cache %d tokens)", names[0], engine.max_model_len,
                    engine.kv_capacity_tokens)

    def close(self) -> None:
        """Lifespan end: stop the engine loop and the tokenizer threads (blocking)."""
        self.draining = True
        if self.engine is not None:
            self.engine.shutdown()
        if self.tokenizer is not None:
            self.tokenizer.shutdown()

    def health(self) -> tuple[int, dict]:
        if self.load_error is not None:
            return 503, {"status": "error", "message": f"model failed to load: {self.load_error}"}
        if self.engine is None:
            return 503, {"status": "loading"}
        if self.engine.dead_error is not None:
            return 503, {"status": "error", "message": f"engine loop died: {self.engine.dead_error!r}"}
        if self.draining or not self.engine.is_healthy:
            return 503, {"status": "shutting_down"}
        return 200, {"status": "ok"}

    def unavailable(self) -> APIError | None:
        """Why /v1 cannot serve now, or None."""
        if self.draining:
            return APIError(503, "the server is shutting down", "service_unavailable", None, "shutting_down")
        if self.load_error is not None:
            return APIError(503, f"the model failed to load: {self.load_error}", "service_unavailable", None,
                            "load_failed")
        if self.engine is None:
            return APIError(503, "the model is loading; retry shortly", "service_unavailable", None, "loading",
                            {"Retry-After": "1"})
        if self.engine.dead_error is not None:
            return APIError(503, f"the engine loop has died: {self.engine.dead_error!r}", "service_unavailable",
                            None, "engine_dead")
        return None

    def begin_drain(self) -> None:
        """SIGTERM: refuse new requests; abort what is still running after shutdown_timeout."""
        if self.draining:
            return
        self.draining = True
        logger.info("shutting down: no new requests; in-flight ones have %.1f s to finish", self.shutdown_timeout)
        if self.engine is not None:
            self.engine.start_draining()
            engine = self.engine
            asyncio.get_running_loop().call_later(self.shutdown_timeout, engine.abort_all,
                                                  "the server is shutting down; the request was aborted")
