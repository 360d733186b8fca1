"""Merge Patch (RFC 7396) and JSON Patch (RFC 6902) with the increment extension."""

from decimal import Decimal

import pytest

from functions.device_state import InvalidPatch, JsonPatch, MergePatch, PatchNotApplicable, PatchTestFailed
from functions.device_state.write.compiled import compile_patch
from functions.device_state.model.values import loads

D = Decimal


# RFC 7396 Appendix A, with objects as targets (state is always an object).
@pytest.mark.parametrize(
    "target, patch, result",
    [
        ('{"a":"b"}', '{"a":"c"}', '{"a":"c"}'),
        ('{"a":"b"}', '{"b":"c"}', '{"a":"b","b":"c"}'),
        ('{"a":"b"}', '{"a":null}', '{}'),
        ('{"a":"b","b":"c"}', '{"a":null}', '{"b":"c"}'),
        ('{"a":["b"]}', '{"a":"c"}', '{"a":"c"}'),
        ('{"a":"c"}', '{"a":["b"]}', '{"a":["b"]}'),
        ('{"a":{"b":"c"}}', '{"a":{"b":"d","c":null}}', '{"a":{"b":"d"}}'),
        ('{"a":[{"b":"c"}]}', '{"a":[1]}', '{"a":[1]}'),
        ('{"e":null}', '{"a":1}', '{"e":null,"a":1}'),
        ('{}', '{"a":{"bb":{"ccc":null}}}', '{"a":{"bb":{}}}'),
    ],
)
def test_merge_patch_rfc7396_examples(target, patch, result):
    assert MergePatch(loads(patch))(loads(target)) == loads(result)


def test_merge_patch_does_not_share_structure_with_the_patch():
    patch = MergePatch({"a": {"b": [1]}})
    first = patch({})
    first["a"]["b"].append(2)
    assert patch({}) == {"a": {"b": [1]}}


@pytest.mark.parametrize("bad", [[1], "x", None, D(1)])
def test_merge_patch_must_be_an_object(bad):
    with pytest.raises(InvalidPatch):
        MergePatch(bad)


def test_json_patch_all_six_operations():
    state = {"a": D(1), "list": [D(1), D(2)], "obj": {"x": "y"}}
    patch = JsonPatch([
        {"op": "test", "path": "/a", "value": D(1)},
        {"op": "add", "path": "/b", "value": "new"},
        {"op": "add", "path": "/list/-", "value": D(3)},
        {"op": "remove", "path": "/list/0"},
        {"op": "replace", "path": "/a", "value": D("1.5")},
        {"op": "move", "from": "/obj/x", "path": "/moved"},
        {"op": "copy", "from": "/moved", "path": "/copied"},
    ])
    assert patch(state) == {
        "a": D("1.5"), "b": "new", "list": [D(2), D(3)], "obj": {}, "moved": "y", "copied": "y",
    }


def test_test_compares_json_types_strictly():
    with pytest.raises(PatchTestFailed):
        JsonPatch([{"op": "test", "path": "/on", "value": D(1)}])({"on": True})
    JsonPatch([{"op": "test", "path": "/n", "value": D("1.0")}])({"n": D(1)})  # numbers by value


@pytest.mark.parametrize(
    "operation, state, result",
    [
        ({"op": "increment", "path": "/n", "value": D(10)}, {"n": D(5)}, {"n": D(15)}),
        ({"op": "increment", "path": "/n", "value": D(-3)}, {"n": D(5)}, {"n": D(2)}),
        ({"op": "increment", "path": "/n", "value": D(4)}, {}, {"n": D(4)}),
        ({"op": "increment", "path": "/n", "value": D(10), "max": D(100)}, {"n": D(95)}, {"n": D(100)}),
        ({"op": "increment", "path": "/n", "value": D(-10), "min": D(0)}, {"n": D(5)}, {"n": D(0)}),
        ({"op": "increment", "path": "/n", "value": D("0.2")}, {"n": D("0.1")}, {"n": D("0.3")}),
        ({"op": "increment", "path": "/a/1", "value": D(1)}, {"a": [D(1), D(1)]}, {"a": [D(1), D(2)]}),
        ({"op": "increment", "path": "/a/-", "value": D(1)}, {"a": []}, {"a": [D(1)]}),
        ({"op": "increment", "path": "/o/n", "value": D(1)}, {"o": {}}, {"o": {"n": D(1)}}),
    ],
)
def test_increment(operation, state, result):
    assert JsonPatch([operation])(state) == result


@pytest.mark.parametrize(
    "operation, state",
    [
        ({"op": "increment", "path": "/s", "value": D(1)}, {"s": "text"}),
        ({"op": "increment", "path": "/b", "value": D(1)}, {"b": True}),
        ({"op": "increment", "path": "/missing/n", "value": D(1)}, {}),
        ({"op": "increment", "path": "/a/5", "value": D(1)}, {"a": []}),
        ({"op": "increment", "path": "", "value": D(1)}, {}),
        ({"op": "remove", "path": "/missing"}, {}),
        ({"op": "replace", "path": "/missing", "value": 1}, {}),
        ({"op": "add", "path": "/a/b/c", "value": 1}, {}),
        ({"op": "move", "from": "/missing", "path": "/x"}, {}),
        ({"op": "add", "path": "/a/9", "value": 1}, {"a": []}),
        ({"op": "replace", "path": "", "value": [1]}, {}),
        ({"op": "add", "path": "/s/0", "value": 1}, {"s": "text"}),
    ],
)
def test_well_formed_patches_that_cannot_apply(operation, state):
    with pytest.raises(PatchNotApplicable):
        JsonPatch([operation])(state)


@pytest.mark.parametrize(
    "document",
    [
        {"op": "add", "path": "/a", "value": 1},  # not an array
        [{"op": "nope", "path": "/a"}],
        [{"path": "/a"}],
        [{"op": "add", "path": "a", "value": 1}],
        [{"op": "add", "path": 5, "value": 1}],
        [{"op": "add", "path": "/a"}],
        [{"op": "move", "path": "/a"}],
        [{"op": "copy", "path": "/a", "from": 3}],
        [{"op": "increment", "path": "/a"}],
        [{"op": "increment", "path": "/a", "value": "1"}],
        [{"op": "increment", "path": "/a", "value": True}],
        [{"op": "increment", "path": "/a", "value": D(1), "min": D(5), "max": D(1)}],
        [{"op": "increment", "path": "/a", "value": D("NaN")}],
        ["add"],
    ],
)
def test_malformed_patch_documents(document):
    with pytest.raises(InvalidPatch):
        JsonPatch(document)


# ------------------------------------------------ issue 13: exact or refused


def test_increment_is_exact_beyond_28_digits_and_clamps_exactly():
    from functions.device_state import InvalidValue

    big = Decimal("12345678901234567890123456789012345")
    assert JsonPatch([{"op": "increment", "path": "/n", "value": Decimal(1)}])({"n": big}) == {"n": Decimal("12345678901234567890123456789012346")}
    top = Decimal("1234567890123456789012345678901")
    assert JsonPatch([{"op": "increment", "path": "/n", "value": 1, "max": top}])({"n": top}) == {"n": top}
    assert JsonPatch([{"op": "increment", "path": "/n", "value": Decimal("1E-10"), "max": 5}])(
        {"n": Decimal("1E+30")}) == {"n": 5}
    for current in (Decimal("1E+30"), Decimal("1E-999")):  # the second is no stored value: still a 4xx
        with pytest.raises(InvalidValue) as caught:
            JsonPatch([{"op": "increment", "path": "/n", "value": Decimal("1E-10")}])({"n": current})
        assert caught.value.limit == "precision"


def test_a_clamp_guard_that_needs_more_than_38_digits_is_not_compiled():
    top = Decimal("1234567890123456789012345678901234567")
    assert compile_patch(JsonPatch([{"op": "increment", "path": "/n", "value": Decimal("0.01"), "max": top}])) is None
    assert compile_patch(JsonPatch([{"op": "increment", "path": "/n", "value": 1, "max": top}])) is not None


def test_the_patches_name_their_leaves_and_compile_and_a_plain_function_does_neither():
    from functions.device_state.model.updates import Touching

    for patch in (MergePatch({"a": 1}), JsonPatch([{"op": "add", "path": "/a", "value": 1}])):
        assert isinstance(patch, Touching) and compile_patch(patch) is not None
    plain = lambda state: {**state, "a": 1}  # noqa: E731
    assert not isinstance(plain, Touching) and compile_patch(plain) is None


def test_an_update_function_of_its_own_may_compile_itself():
    from functions.device_state.model.updates import Compilable

    class Own:
        def __call__(self, state):
            return {**state, "a": 1}

        def compile(self, section="state", nested=False):
            return ("compiled", section, nested)

    assert isinstance(Own(), Compilable)
    assert compile_patch(Own(), "reported") == ("compiled", "reported", True)