"""dynamodb_client() can be pointed anywhere from the environment, as docs/library.md tells a
script to: DYNAMODB_ENDPOINT, then AWS_REGION before AWS_DEFAULT_REGION; arguments win."""

import pytest

from functions.device_state import dynamodb_client


@pytest.fixture(autouse=True)
def fresh_clients(monkeypatch):
    for name in ("DYNAMODB_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    dynamodb_client.cache_clear()
    yield
    dynamodb_client.cache_clear()


def test_the_endpoint_comes_from_dynamodb_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8123")
    assert dynamodb_client().meta.endpoint_url == "http://127.0.0.1:8123"


def test_aws_region_comes_before_aws_default_region(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert dynamodb_client().meta.region_name == "eu-west-1"


def test_aws_default_region_when_aws_region_is_unset(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert dynamodb_client().meta.region_name == "ap-south-1"


def test_arguments_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8123")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    client = dynamodb_client("http://127.0.0.1:9000", "us-west-2")
    assert (client.meta.endpoint_url, client.meta.region_name) == ("http://127.0.0.1:9000", "us-west-2")


def test_one_client_per_endpoint_and_region(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8123")
    first = dynamodb_client()
    assert dynamodb_client() is first
    monkeypatch.setenv("DYNAMODB_ENDPOINT", "http://127.0.0.1:8124")
    assert dynamodb_client() is not first
