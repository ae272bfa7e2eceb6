"""Checking a ``--json`` document against its JSON Schema in ``kvcache/schemas``."""

from __future__ import annotations

import importlib.resources
import json
from typing import Any

import jsonschema

from kvcache.cli.output import SCHEMA_VERSION


def schema_of(command: str) -> dict[str, Any]:
    """The schema of ``kvcache COMMAND --json`` (``list`` also for ``status`` without a name)."""
    text = importlib.resources.files("kvcache").joinpath("schemas", f"{command}.json").read_text()
    return json.loads(text)  # type: ignore[no-any-return]


def check(command: str, document: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``document`` is what the schema says
    (every schema forbids keys it does not name)."""
    assert document["schema"] == SCHEMA_VERSION
    jsonschema.Draft202012Validator(schema_of(command)).validate(document)
