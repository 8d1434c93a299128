"""Web pages on other sites: a cross-site form or a DNS-rebinding page runs no generation.

A page may send another site a POST whose body is plain text or a form without asking the
browser first, never one declared JSON; a rebinding page reaches the server through a name
the attacker controls, which the ``Host`` header then carries.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import ALLOWED_HOSTS
from tests.server.harness import assert_error_shape

GENERATED = ("verispec_generations_total", (("outcome", "finished"),))


def body(server, route: str = "/v1/completions") -> bytes:
    """A valid body for ``route``: sent as JSON, it would be served."""
    if route == "/v1/chat/completions":
        return json.dumps(
            {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ).encode()
    return json.dumps({"model": server.model, "prompt": "hello", "max_tokens": 2}).encode()


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data"],
)
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_generation_bodies_must_be_declared_json(server, route, content_type):
    headers = {"Origin": "http://evil.example"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = httpx.post(server.url + route, content=body(server, route), headers=headers, timeout=60)
    error = assert_error_shape(response, 415)
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_json_with_a_charset_is_json(server, route):
    headers = {"Content-Type": "Application/JSON; charset=utf-8"}
    response = httpx.post(server.url + route, content=body(server, route), headers=headers, timeout=60)
    assert response.status_code == 200, response.text


def test_the_rebinding_attack_of_issue_20_is_refused(server):
    """Plain text from another origin, addressed to the attacker's name: nothing runs."""
    before = server.metrics().get(GENERATED, 0.0)
    headers = {
        "Content-Type": "text/plain",
        "Origin": "http://evil.example",
        "Host": f"attacker.example:{server.port}",
    }
    response = httpx.post(server.url + "/v1/completions", content=body(server), headers=headers, timeout=60)
    error = assert_error_shape(response, 403)
    assert error["code"] == "host_not_allowed" and "--allowed-hosts attacker.example" in error["message"]
    assert server.metrics().get(GENERATED, 0.0) == before


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/models", "/metrics", "/health"])
def test_a_host_that_is_not_this_server_is_refused_on_every_route(server, route):
    headers = {"Host": f"attacker.example:{server.port}", "Content-Type": "application/json"}
    method = "POST" if route == "/v1/completions" else "GET"
    response = httpx.request(method, server.url + route, content=body(server), headers=headers, timeout=60)
    assert assert_error_shape(response, 403)["type"] == "permission_error"


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "app.localhost:{port}", "[::1]:{port}", "10.0.0.7"]
)
def test_local_names_and_addresses_are_served(server, host):
    headers = {"Host": host.format(port=server.port)}
    response = httpx.get(server.url + "/v1/models", headers=headers, timeout=60)
    assert response.status_code == 200, response.text


def test_allowed_hosts_adds_names(limited):
    for name in (*ALLOWED_HOSTS, ALLOWED_HOSTS[1].upper()):
        headers = {"Host": f"{name}:{limited.port}", "Content-Type": "application/json"}
        response = httpx.post(limited.url + "/v1/completions", content=body(limited), headers=headers, timeout=60)
        assert response.status_code == 200, (name, response.text)
    refused = httpx.get(limited.url + "/v1/models", headers={"Host": "attacker.example"}, timeout=60)
    assert_error_shape(refused, 403)
