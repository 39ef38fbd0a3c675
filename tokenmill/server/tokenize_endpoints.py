"""POST /tokenize and POST /detokenize, as vLLM serves them."""
from __future__ import annotations

from tokenmill.server.chat import template_messages
from tokenmill.server.errors import APIError
from tokenmill.server.protocol import DetokenizeRequest, TokenizeRequest
from tokenmill.server.serving import OpenAIServing
from tokenmill.server.tokenization import PromptError


class OpenAIServingTokenization(OpenAIServing):
    async def tokenize(self, req: TokenizeRequest) -> dict:
        self._check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", param="prompt")
        if req.prompt is not None:
            tokens = (await self.tokenizer.run(
                lambda tok, text: tok.encode(text, add_special_tokens=req.add_special_tokens), req.prompt))
        else:
            try:
                tokens = await self.tokenizer.chat_prompt(template_messages(req.messages), req.add_generation_prompt,
                                                          dict(req.chat_template_kwargs or {}), req.tools)
            except PromptError as e:
                raise APIError(400, str(e), param="messages") from None
        body = {"count": len(tokens), "max_model_len": self.engine.max_model_len, "tokens": tokens}
        if req.return_token_strs:
            body["token_strs"] = await self.tokenizer.token_strs(tokens)
        return body

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        self._check_model(req.model)
        vocab = self.engine.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"tokens must be integers in [0, {vocab}); got {bad[:3]}", param="tokens")
        return {"prompt": await self.tokenizer.decode(req.tokens)}
