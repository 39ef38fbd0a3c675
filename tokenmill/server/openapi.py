"""The OpenAPI document: the routes parse their bodies themselves (for OpenAI-style errors), so the
request-body schemas are declared here from the pydantic models, for clients and schema fuzzers."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"


def json_body(model: type[BaseModel]) -> dict:
    """`openapi_extra` for a route whose JSON body is `model`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": _REF.format(model=model.__name__)}}}}}


def install_openapi(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """app.openapi() with `models` (and what they reference) under components/schemas."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                js = model.model_json_schema(ref_template=_REF)
                schemas.update(js.pop("$defs", {}))
                schemas[model.__name__] = js
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
