"""Expression pieces every request shares: fixed attribute-name placeholders, the
liveness condition of a state item, and merging a caller's boto3 condition in.

A state item is *live* when it has a version, is not a tombstone and has not expired.
A tombstone (a deleted device) keeps its version and journal and carries ``deletedAt``
and ``expiresAt``; a settle stub (see ``writes.settle_request``) has no version at all.
"""

from __future__ import annotations

import re

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder

from . import table
from .values import to_attribute

# Fixed placeholders; boto3's ConditionExpressionBuilder names a caller's condition
# #n0.. and :v0.., and compiled patches use #p0.. and :c0.., so none collide.
NAMES = {
    "#pk": table.PARTITION_KEY,
    "#sk": table.SORT_KEY,
    "#state": table.STATE,
    "#version": table.VERSION,
    "#createdAt": table.CREATED_AT,
    "#updatedAt": table.UPDATED_AT,
    "#deletedAt": table.DELETED_AT,
    "#expiresAt": table.TTL_ATTRIBUTE,
    "#trimmed": table.JOURNAL_TRIMMED,
    "#trimmedStamps": table.JOURNAL_TRIMMED_STAMPS,
    "#leaseToken": table.LEASE_TOKEN,
    "#leaseKey": table.LEASE_KEY,
    "#leaseUntil": table.LEASE_UNTIL,
    "#lastWrite": table.LAST_WRITE,
    "#desired": table.DESIRED,
    "#reported": table.REPORTED,
    "#metaDesired": table.META_DESIRED,
    "#metaReported": table.META_REPORTED,
    "#changedDesired": table.CHANGED_DESIRED,
    "#changedReported": table.CHANGED_REPORTED,
    "#itemBytes": table.ITEM_BYTES,
}

NOT_EXPIRED = "(attribute_not_exists(#expiresAt) OR #expiresAt > :nowEpoch)"
LIVE = f"(attribute_exists(#version) AND attribute_not_exists(#deletedAt) AND {NOT_EXPIRED})"
NOT_LIVE = "(attribute_not_exists(#version) OR attribute_exists(#deletedAt) OR #expiresAt <= :nowEpoch)"


_PLACEHOLDER = re.compile(r"#[A-Za-z0-9_]+")


def names_in(expression: str, extra: dict | None = None) -> dict:
    """The fixed placeholders ``expression`` uses, with their attribute names."""
    used = set(_PLACEHOLDER.findall(expression))  # whole placeholders: #trimmed is not in #trimmedStamps
    names = {placeholder: name for placeholder, name in NAMES.items() if placeholder in used}
    return {**names, **(extra or {})}


def number(value) -> dict:
    return {"N": str(value)}


def and_condition(expression: str, names: dict, values: dict, condition: ConditionBase | None) -> str:
    """``expression`` ANDed with a caller's boto3 condition, its placeholders merged in."""
    if condition is None:
        return expression
    # The builder already parenthesises AND/OR/NOT (DynamoDB refuses redundant ones).
    built = ConditionExpressionBuilder().build_expression(condition)
    names.update(built.attribute_name_placeholders)
    values.update({key: to_attribute(value) for key, value in built.attribute_value_placeholders.items()})
    return f"{expression} AND {built.condition_expression}"
