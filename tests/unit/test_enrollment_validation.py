"""An enrollment is refused before anything is stored when devices could not use it: an
``idPattern`` whose matching can run away (a repetition inside a repeated group, an alternation
inside one, a backreference), judged on the parsed pattern; ``initial`` documents a device's
create would refuse (a desired leaf whose pointer is past ``MAX_POINTER_BYTES``)."""

from __future__ import annotations

import json
import pathlib
import re
import time

import pytest

from functions.device_state import (DeviceStateManager, Enrollment, EnrollmentNotFound, InvalidEnrollment,
                                    check_id_pattern)
from functions.device_state.errors import InvalidValue
from functions.device_state.model.sections import MAX_POINTER_BYTES
from tests.api.conftest import api, dynamodb_local_endpoint_for  # noqa: F401 - the in-process handler

ROOT = pathlib.Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------ idPattern

RUNAWAY = {
    "(([a-z0-9]+)-?)+": "repetition", "((a+))+": "repetition", "(a+)+": "repetition", "(a*)*": "repetition",
    "(a?a?)+": "repetition",  # only ?s inside, and as slow: 24 characters take minutes
    "(?:[a-z]{2,3})+": "repetition", "((?=a+)a)+": "repetition", "(?>a+)+": "repetition",
    "(a+)++": "repetition", "(a+?)+?": "repetition", "(x(y(a+)))*": "repetition",
    "((a|aa))+": "alternation", "(a|aa)*": "alternation", "(?:ab|ab)+": "alternation",
    "(a.|.a){2,}": "alternation",
    "(?P<x>a)(?P=x)": "backreference", r"(x)\1": "backreference", "(a)(?(1)b|c)": "backreference",
}


@pytest.mark.parametrize("pattern", sorted(RUNAWAY))
def test_a_pattern_whose_matching_can_run_away_is_refused_saying_what_is_not_allowed(pattern):
    with pytest.raises(InvalidEnrollment, match=RUNAWAY[pattern]):
        check_id_pattern(pattern)


def patterns_in_docs_and_tests() -> set[str]:
    """Every idPattern the docs and the tests give (a JSON member, a CLI option), and those
    written as arguments, listed."""
    member = re.compile(r'"idPattern":\s*"((?:[^"\\]|\\.)*)"')
    option = re.compile(r'"--id-pattern",\s*"([^"]+)"|--id-pattern \'([^\']+)\'')
    found = {"lamp-.*", ".*", "cli-[a-z]+", "lamp-[0-9]+", "late-0a1b2c-[0-9]+", "enrolled-0a1b2c-[0-9]+",
             "^sensor-[a-z0-9]{4,16}$"}
    files = [*ROOT.glob("docs/**/*.md"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("clients/python/**/*.py"),
             *ROOT.glob("bench/*.py"), ROOT / "README.md"]
    for path in files:
        if path.exists() and path.resolve() != pathlib.Path(__file__).resolve():
            text = path.read_text(encoding="utf-8")
            found.update(json.loads(f'"{value}"') for value in member.findall(text))
            found.update(first or second for first, second in option.findall(text))
    return found


def test_every_pattern_the_docs_and_tests_use_is_accepted():
    found = patterns_in_docs_and_tests()
    assert {"plug-[0-9]+", "meter-[0-9]{4}", "p-.*", "[A-Za-z0-9._:-]+", "lamp-[0-9]{4}"} <= found, found
    for pattern in sorted(found):
        assert check_id_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", ["(a|b)+", "(ab|cd)", "(a+)?", "x(ab){3}", "([a-f0-9]{2}:)?[a-f0-9]+",
                                     "(?:lamp|plug)-[0-9]+", "a++", "(?i)LAMP-[0-9]+"])
def test_repetition_alternation_and_groups_that_cannot_run_away_are_accepted(pattern):
    """An alternation of single characters the parser has folded into a set; an alternation,
    a repetition or a ``?`` outside any repetition; a group repeated a fixed number of times."""
    assert check_id_pattern(pattern) == pattern


def test_the_danger_is_real_a_refused_pattern_backtracks_where_the_same_language_does_not():
    """``((a|aa))+`` and ``a+`` match the same ids; on 24 characters that do not match, the first
    tries every way of splitting them (tens of thousands), the second one."""
    refused, accepted, id_ = re.compile("((a|aa))+"), re.compile("a+"), "a" * 23 + "!"
    with pytest.raises(InvalidEnrollment):
        check_id_pattern(refused.pattern)
    check_id_pattern(accepted.pattern)

    def seconds(pattern) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            assert pattern.fullmatch(id_) is None
            best = min(best, time.perf_counter() - started)
        return best

    assert seconds(refused) > 50 * max(seconds(accepted), 1e-6)


# -------------------------------------------------------------------------- initial


def past_the_pointer_limit() -> dict:
    """A document with one leaf, its JSON Pointer 4,100 bytes (four names of 1,024, each with its '/')."""
    document = {"d" * 1024: 1}
    for name in "cba":
        document = {name * 1024: document}
    return document


def enrollment(initial: dict, enrollment_id: str = "factory") -> Enrollment:
    return Enrollment(enrollment_id, "lamp-[0-9]+", 3, initial, b"sealed")


def test_an_initial_desired_leaf_past_the_pointer_limit_is_refused_as_a_create_is_and_nothing_is_stored(
        manager: DeviceStateManager):
    deep = past_the_pointer_limit()
    with pytest.raises(InvalidValue) as by_create:
        manager.create("lamp-1", {}, sections={"desired": deep})
    with pytest.raises(InvalidValue) as by_enrollment:
        manager.create_enrollment(enrollment({"state": {"site": "berlin"}, "desired": deep}))
    assert by_enrollment.value.limit == by_create.value.limit == "leaf-pointer"
    assert str(MAX_POINTER_BYTES) in str(by_enrollment.value)
    with pytest.raises(EnrollmentNotFound):
        manager.enrollment("factory")
    with pytest.raises(InvalidValue) as reported:  # what provisioning would pass on as reported too
        manager.create_enrollment(enrollment({"reported": deep}, "other"))
    assert reported.value.limit == "leaf-pointer"
    with pytest.raises(InvalidValue) as unstorable:
        manager.create_enrollment(enrollment({"desired": {"": 1}}, "other"))
    assert unstorable.value.limit == "member-name"
    assert manager.enrollments() == ([], None)


def test_initial_documents_a_device_could_be_created_with_are_accepted(manager: DeviceStateManager):
    """At the limit, and a long pointer in state, which keeps no per-leaf metadata (a device's
    create takes it too)."""
    at_the_limit = {"a" * 1024: {"b" * 1024: {"c" * 1024: {"d" * (MAX_POINTER_BYTES - 3 * 1025 - 1): 1}}}}
    long_in_state = past_the_pointer_limit()
    manager.create("lamp-1", long_in_state, sections={"desired": at_the_limit})
    created = manager.create_enrollment(enrollment({"state": long_in_state, "desired": at_the_limit}))
    assert manager.enrollment(created.enrollment_id).initial["desired"] == at_the_limit


def test_post_enrollments_answers_as_post_devices_does_for_the_same_desired_and_stores_nothing(
        api):  # noqa: F811 - the fixture imported above
    deep = past_the_pointer_limit()
    device = api("POST", "/devices", {"deviceId": "lamp-1", "state": {}, "desired": deep})
    refused = api("POST", "/enrollments", {"enrollmentId": "factory", "idPattern": "lamp-[0-9]+",
                                           "maxDevices": 3, "initial": {"desired": deep}})
    assert device.status == refused.status == 400, refused.text
    assert refused.json["type"] == device.json["type"], refused.text
    assert refused.json["limit"] == device.json["limit"] == "leaf-pointer", refused.text
    assert api("GET", "/enrollments").json["items"] == []
    assert api("GET", "/enrollments/factory").status == 404
    for pattern in ("(([a-z0-9]+)-?)+", "a{99999999999999999999}"):  # the second past re's bound: it raised
        runaway = api("POST", "/enrollments", {"idPattern": pattern, "maxDevices": 3})
        assert runaway.status == 400 and runaway.json["type"].endswith("invalid-enrollment"), runaway.text


@pytest.mark.parametrize("pattern", ["a*a*a*a*b", "a*a*a*a*a*a*b", "[a-z]+-[0-9]+-[a-z]+-[0-9]+",
                                     "a?" * 4 + "a" * 4, "a?" * 40 + "a" * 40, "a{0,1}" * 4 + "a" * 4,
                                     "(?:ab|a)" * 4 + "c", "(x|yz)-[0-9]+-(a|bc)-[0-9]*"])
def test_more_than_three_repetitions_in_a_row_are_refused(pattern):
    """Repetitions one after another match in time growing as the id's length to the power of their
    number (a*a*a*a*a*a*b took 26 s on 128 characters): at most three. A ``?`` and an alternation
    choose too: a?a?...aa... of 27 each took 11 s on the id of 27 a's, twice as long as 26."""
    with pytest.raises(InvalidEnrollment, match="repetitions"):
        check_id_pattern(pattern)
