"""Powertools' REST resolver, without the rest of its event handler package.

``aws_lambda_powertools.event_handler``'s ``__init__`` imports every resolver Powertools
has (AppSync with asyncio, Bedrock agents, VPC Lattice, Lambda function URLs, ...); the
service uses only API Gateway's, from ``event_handler.api_gateway``, and the rest cost
about half of Powertools' import time at each cold start (measured: a bare import of the
package against its ``api_gateway`` module alone). So the package is registered lazily:
its submodules import as usual, and the first use of a name from the package itself
(``from aws_lambda_powertools.event_handler import X``, by anyone) runs its real
``__init__`` then, into the same module."""

from __future__ import annotations

import importlib.util
import sys

_PACKAGE = "aws_lambda_powertools.event_handler"


def _register_lazily() -> None:
    spec = importlib.util.find_spec(_PACKAGE)
    package = importlib.util.module_from_spec(spec)

    def attribute(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"{_PACKAGE}.{name}") is not None:  # a submodule: just that
            return importlib.import_module(f"{_PACKAGE}.{name}")
        del package.__getattr__  # a name of the package itself: run its real __init__ now
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = attribute
    sys.modules[_PACKAGE] = package


if _PACKAGE not in sys.modules:
    _register_lazily()

from aws_lambda_powertools.event_handler.api_gateway import APIGatewayRestResolver, Response, Router  # noqa: E402

__all__ = ["APIGatewayRestResolver", "Response", "Router"]
