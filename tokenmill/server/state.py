"""ServerState: what the routes need, and where the server is in its life (loading, ready, draining)."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmill.engine.async_engine import AsyncLLMEngine
from tokenmill.engine.ended_usage import RecentMap
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
    max_request_header_bytes: int = 16 << 10
    public_metrics: bool = False  # /metrics without the API key
    log_prompts: bool = False
    max_engine_restarts: int = 0  # times a dead engine loop is replaced by a fresh engine
    engine_factory: Callable[[], AsyncLLMEngine] | None = None  # builds that fresh engine
    restarting: bool = False
    num_engine_restarts: int = 0
    engine: AsyncLLMEngine | None = None
    tokenizer: PromptTokenizer | None = None
    completion: OpenAIServingCompletion | None = None
    chat: OpenAIServingChat | None = None
    tokenization: OpenAIServingTokenization | None = None
    stat_logger: PrometheusStatLogger | None = None
    load_error: BaseException | None = None
    draining: bool = False
    on_fatal: Callable[[], None] | None = None  # run_server: stop the process
    loader: threading.Thread | None = None  # the thread building the engine (build_app's lifespan)
    started_at: int = field(default_factory=lambda: int(time.time()))
    request_ids: RecentMap[str, list[str]] = field(default_factory=RecentMap)  # X-Request-Id -> engine ids

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
        self.completion = OpenAIServingCompletion(engine, names, self.tokenizer, self.request_ids)
        self.chat = OpenAIServingChat(engine, names, self.tokenizer, self.request_ids)
        self.tokenization = OpenAIServingTokenization(engine, names, self.tokenizer)
        self.completion.log_prompts = self.chat.log_prompts = self.log_prompts
        self.engine = engine
        loop = asyncio.get_running_loop()
        engine.on_dead = lambda: _call_soon(loop, self._engine_died, engine)
        if self.draining:
            engine.start_draining()
        logger.info("model %s ready (max_model_len=%d, KV cache %d tokens)", names[0], engine.max_model_len,
                    engine.kv_capacity_tokens)

    # -- the supervisor: a dead engine loop is replaced (at most max_engine_restarts times) --------
    def _engine_died(self, engine: AsyncLLMEngine) -> None:
        if engine is not self.engine or self.draining or self.restarting:
            return
        if self.engine_factory is None or self.num_engine_restarts >= self.max_engine_restarts:
            logger.error("the engine loop died and will not be restarted (%d restarts of %d used): /health "
                         "answers 503 until the process is restarted", self.num_engine_restarts,
                         self.max_engine_restarts)
            return
        self.num_engine_restarts += 1
        self.restarting = True
        logger.error("the engine loop died; building a fresh engine (restart %d of %d)", self.num_engine_restarts,
                     self.max_engine_restarts)
        loop, factory = asyncio.get_running_loop(), self.engine_factory

        def rebuild() -> None:
            try:
                fresh = factory()
            except BaseException as e:
                logger.error("the engine could not be rebuilt: %s", e)
                _call_soon(loop, self._restart_failed, e)
                return
            _call_soon(loop, self._restarted, fresh)

        threading.Thread(target=rebuild, name="tokenmill-engine-restart", daemon=True).start()

    def _restarted(self, engine: AsyncLLMEngine) -> None:
        self.restarting = False
        if self.tokenizer is not None:
            self.tokenizer.shutdown()
        self.attach(engine)

    def _restart_failed(self, error: BaseException) -> None:
        self.restarting = False
        self.load_error = error
        if self.on_fatal is not None:
            self.on_fatal()

    def close(self) -> None:
        """Lifespan end: stop the engine loop and the tokenizer threads (blocking)."""
        self.draining = True
        if self.engine is not None:
            self.engine.shutdown()
        if self.tokenizer is not None:
            self.tokenizer.shutdown()

    def health(self) -> tuple[int, dict]:
        if self.load_error is not None:
            return 503, {"status": "error", "message": f"model failed to load: {_kind(self.load_error)}"}
        if self.restarting:
            return 503, {"status": "restarting", "message": f"engine loop died: {_kind(self.engine.dead_error)}; "
                                                            "restarting it"}
        if self.engine is None:
            return 503, {"status": "loading"}
        if self.engine.dead_error is not None:
            return 503, {"status": "error", "message": f"engine loop died: {_kind(self.engine.dead_error)}"}
        if self.draining or not self.engine.is_healthy:
            return 503, {"status": "shutting_down"}
        return 200, {"status": "ok"}

    def unavailable(self) -> APIError | None:
        """Why /v1 cannot serve now, or None."""
        if self.draining:
            return APIError(503, "the server is shutting down", "service_unavailable", None, "shutting_down")
        if self.load_error is not None:
            return APIError(503, f"the model failed to load: {_kind(self.load_error)}", "service_unavailable", None,
                            "load_failed")
        if self.restarting:
            return APIError(503, "the engine is restarting after a failure; retry shortly", "service_unavailable",
                            None, "engine_restarting", {"Retry-After": "1"})
        if self.engine is None:
            return APIError(503, "the model is loading; retry shortly", "service_unavailable", None, "loading",
                            {"Retry-After": "1"})
        if self.engine.dead_error is not None:
            return APIError(503, f"the engine loop has died: {_kind(self.engine.dead_error)}", "service_unavailable",
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


def _kind(e: BaseException) -> str:
    """What a client may learn of a server-side failure: the exception's type, never its message
    (it may hold file paths or request text); the server log has the whole of it."""
    return f"{type(e).__name__} (details in the server log)"


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the server already stopped
        pass
