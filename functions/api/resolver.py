"""Powertools' API Gateway resolver (``APIGatewayRestResolver``, which reads the payload
format 1.0 event the HTTP API sends), without the rest of its event handler package.

``aws_lambda_powertools.event_handler``'s ``__init__`` imports every resolver Powertools
has (AppSync with asyncio, Bedrock agents, VPC Lattice, Lambda function URLs, ...), and
``utilities.data_classes``' imports every event class (SQS, SNS, S3, Kinesis, ...); the
service uses only API Gateway's resolver and the few event classes it names, and the rest
cost a good share of each cold start (measured with ``python -X importtime``). So these
packages are registered lazily: their submodules import as usual; a name the package's
``__init__`` takes ``from .submodule import name`` imports just that submodule; any other
name of the package itself runs its real ``__init__`` then, into the same module."""

from __future__ import annotations

import ast
import importlib.util
import sys

_PACKAGES = ("aws_lambda_powertools.event_handler", "aws_lambda_powertools.utilities.data_classes")


def _register_lazily(name: str) -> None:
    spec = importlib.util.find_spec(name)
    package = importlib.util.module_from_spec(spec)
    sources: dict[str, str] = {}  # a name the package's __init__ imports -> its submodule
    for node in ast.parse(spec.loader.get_source(name)).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            sources.update({alias.asname or alias.name: node.module for alias in node.names})

    def attribute(attribute_name: str):
        if attribute_name.startswith("__"):
            raise AttributeError(attribute_name)
        if attribute_name in sources:
            value = getattr(importlib.import_module(f"{name}.{sources[attribute_name]}"), attribute_name)
            setattr(package, attribute_name, value)
            return value
        if importlib.util.find_spec(f"{name}.{attribute_name}") is not None:  # a submodule: just that
            return importlib.import_module(f"{name}.{attribute_name}")
        del package.__getattr__  # any other name of the package itself: run its real __init__ now
        spec.loader.exec_module(package)
        return getattr(package, attribute_name)

    package.__getattr__ = attribute
    sys.modules[name] = package


for _package in _PACKAGES:
    if _package not in sys.modules:
        _register_lazily(_package)

from aws_lambda_powertools.event_handler.api_gateway import APIGatewayRestResolver, Response, Router  # noqa: E402

__all__ = ["APIGatewayRestResolver", "Response", "Router"]
