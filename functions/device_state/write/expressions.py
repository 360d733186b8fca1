"""One request's expressions: an ``Expression`` allocates every attribute-name and value
placeholder the request uses, and holds them for ``ExpressionAttributeNames`` and
``ExpressionAttributeValues``; the liveness condition of a state item; the number helper.

Every attribute name goes through ``Expression.name`` (or ``path``) and every value through
``Expression.value`` (or ``number``), so no expression text names an attribute itself and
no placeholder is spelled anywhere else.

A state item is *live* when it has a version, is not a tombstone and has not expired.
A tombstone (a deleted device) keeps its version and journal and carries ``deletedAt``
and ``expiresAt``; a settle stub (see ``Planner.settle_mark``) has no version at all.
"""

from __future__ import annotations

import copy
import json

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder

from ..item import schema
from ..model.values import to_attribute

# The builder's placeholders: #a0, #a1, ... for names and :a0, :a1, ... for values. A
# caller's boto3 condition keeps boto3's own (#n0.., :v0..: ConditionExpressionBuilder),
# so the two never collide.
NAME_PREFIX = "#a"
VALUE_PREFIX = ":a"


def number(value) -> dict:
    """A DynamoDB number attribute value."""
    return {"N": str(value)}


class Expression:
    """The placeholders of one request. ``name`` gives one attribute the same placeholder
    however often it is named; ``value`` gives equal values the same placeholder."""

    def __init__(self):
        self.names: dict[str, str] = {}
        self.values: dict[str, dict] = {}
        self._name_of: dict[str, str] = {}
        self._value_of: dict[str, str] = {}
        self._conditions = ConditionExpressionBuilder()  # its counters run on across conditions

    def name(self, attribute: str) -> str:
        placeholder = self._name_of.get(attribute)
        if placeholder is None:
            placeholder = self._name_of[attribute] = f"{NAME_PREFIX}{len(self._name_of)}"
            self.names[placeholder] = attribute
        return placeholder

    def path(self, *attributes: str) -> str:
        """The document path of nested map members ``attributes`` (outermost first)."""
        return ".".join(self.name(attribute) for attribute in attributes)

    def value(self, attribute_value: dict) -> str:
        """The placeholder of a DynamoDB attribute value (``{"S": ...}``, ``{"N": ...}``, ...)."""
        key = json.dumps(attribute_value, sort_keys=True, default=repr)
        placeholder = self._value_of.get(key)
        if placeholder is None:
            placeholder = self._value_of[key] = f"{VALUE_PREFIX}{len(self._value_of)}"
            self.values[placeholder] = attribute_value
        return placeholder

    def number(self, value) -> str:
        return self.value(number(value))

    def condition(self, condition: ConditionBase) -> str:
        """A caller's boto3 condition as expression text, its placeholders merged in."""
        # The builder already parenthesises AND/OR/NOT (DynamoDB refuses redundant ones).
        built = self._conditions.build_expression(condition)
        self.names.update(built.attribute_name_placeholders)
        self.values.update({key: to_attribute(value) for key, value in built.attribute_value_placeholders.items()})
        return built.condition_expression

    def copy(self) -> "Expression":
        return copy.deepcopy(self)

    def attributes(self) -> dict:
        """``ExpressionAttributeNames`` and ``ExpressionAttributeValues`` for the request
        (each left out when empty: DynamoDB refuses an empty one)."""
        attributes = {}
        if self.names:
            attributes["ExpressionAttributeNames"] = dict(self.names)
        if self.values:
            attributes["ExpressionAttributeValues"] = dict(self.values)
        return attributes


def not_expired(expr: Expression, now: float) -> str:
    expires = expr.name(schema.TTL_ATTRIBUTE)
    return f"(attribute_not_exists({expires}) OR {expires} > {expr.number(now)})"


def live(expr: Expression, now: float) -> str:
    """The condition that the state item is live at ``now`` (epoch seconds)."""
    return (f"(attribute_exists({expr.name(schema.VERSION)}) AND attribute_not_exists({expr.name(schema.DELETED_AT)})"
            f" AND {not_expired(expr, now)})")


def not_live(expr: Expression, now: float) -> str:
    """The condition that the state item is absent, a tombstone, expired, or a settle stub."""
    return (f"(attribute_not_exists({expr.name(schema.VERSION)}) OR attribute_exists({expr.name(schema.DELETED_AT)})"
            f" OR {expr.name(schema.TTL_ATTRIBUTE)} <= {expr.number(now)})")
