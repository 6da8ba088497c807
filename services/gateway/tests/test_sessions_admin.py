"""Attribution (every token source, 401s in each provider's shape, counted), admin routes, pause/drain, and
the record-or-503 rule."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from contracts import SamplingPolicy

from .conftest import CONTROL

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANTH = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
GOOG = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def test_every_token_source_is_accepted(gw) -> None:
    tok = gw.session()["token"]
    u = gw.url
    assert (
        httpx.post(f"{u}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {tok}"}).status_code == 200
    )
    assert httpx.post(f"{u}/v1/messages", json=ANTH, headers={"x-api-key": tok}).status_code == 200
    assert (
        httpx.post(f"{u}/v1beta/models/g:generateContent", json=GOOG, headers={"x-goog-api-key": tok}).status_code
        == 200
    )
    assert httpx.post(f"{u}/v1beta/models/g:generateContent?key={tok}", json=GOOG).status_code == 200
    assert httpx.post(f"{u}/s/{tok}/v1/chat/completions", json=CHAT).status_code == 200
    assert httpx.post(f"{u}/s/{tok}/v1/messages", json=ANTH).status_code == 200
    assert [r.call_index for r in gw.sink.events] == list(range(6))


@pytest.mark.parametrize(
    ("path", "body", "check"),
    [
        ("/v1/chat/completions", CHAT, lambda b: b["error"]["code"] == "invalid_api_key"),
        ("/v1/responses", {"model": "m", "input": "hi"}, lambda b: b["error"]["type"] == "invalid_request_error"),
        ("/v1/messages", ANTH, lambda b: b["type"] == "error" and b["error"]["type"] == "authentication_error"),
        ("/v1beta/models/g:generateContent", GOOG, lambda b: b["error"]["status"] == "UNAUTHENTICATED"),
    ],
)
def test_forged_token_is_a_provider_shaped_401(gw, path, body, check) -> None:
    gw.session()
    r = httpx.post(
        gw.url + path, json=body, headers={"authorization": "Bearer floe-forged", "x-api-key": "floe-forged"}
    )
    assert r.status_code == 401 and check(r.json())
    assert gw.sink.events == []
    assert 'floe_gateway_rejected_credentials_total{reason="unknown"} 1.0' in httpx.get(gw.url + "/metrics").text


def test_missing_closed_and_expired_tokens(gw) -> None:
    creds = gw.session("closing")
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 401
    h = {"authorization": f"Bearer {CONTROL}"}
    assert httpx.get(f"{gw.url}/admin/sessions/closing", headers=h).json()["calls_ok"] == 0
    assert httpx.delete(f"{gw.url}/admin/sessions/closing", headers=h).status_code == 200
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {creds['token']}"})
    assert r.status_code == 401 and "closed" in r.json()["error"]["message"]
    exp = httpx.post(gw.url + "/admin/sessions", headers=h, json={"session_id": "exp", "ttl_s": 0.01}).json()
    time.sleep(0.05)
    r = httpx.post(gw.url + "/v1/messages", json=ANTH, headers={"x-api-key": exp["token"]})
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    metrics = httpx.get(gw.url + "/metrics").text
    for reason in ("missing", "closed", "expired"):
        assert f'floe_gateway_rejected_credentials_total{{reason="{reason}"}} 1.0' in metrics


def test_admin_needs_control_token(gw) -> None:
    assert httpx.post(gw.url + "/admin/sessions", json={"session_id": "x"}).status_code == 403
    r = httpx.post(gw.url + "/admin/pause", headers={"authorization": "Bearer nope"})
    assert r.status_code == 403


def test_credentials_carry_env_for_every_provider(gw) -> None:
    creds = gw.session("envs")
    env = creds["env"]
    for key in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "GEMINI_API_KEY",
        "GOOGLE_GEMINI_BASE_URL",
    ):
        assert env[key]
    assert env["OPENAI_API_KEY"] == creds["token"] and creds["token"].startswith("floe-")
    assert creds["prefix_base_urls"]["openai"].endswith(f"/s/{creds['token']}/v1")


def test_sampling_policy_overrides_and_is_recorded(gw) -> None:
    tok = gw.session("pol", sampling=SamplingPolicy(temperature=0.5, top_p=0.9, max_tokens=7))["token"]
    body = {**CHAT, "temperature": 1.3, "max_tokens": 100}
    httpx.post(
        gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tok}"}
    ).raise_for_status()
    [rec] = gw.sink.events
    assert rec.sampling["temperature"] == 0.5 and rec.sampling["top_p"] == 0.9 and rec.sampling["max_tokens"] == 7
    assert rec.request["sampling"]["temperature"] == 1.3  # the harness's own value is kept in the record
    assert "temperature:1.3->0.5" in rec.gateway_changes and "max_tokens:100->7" in rec.gateway_changes
    sent = [b for p, b in gw.engine.requests if p == "/v1/chat/completions"][-1]
    assert sent["temperature"] == 0.5 and sent["max_tokens"] == 7


def test_pause_drains_then_rejects_then_resumes(gw) -> None:
    tok = gw.session()["token"]
    h = {"authorization": f"Bearer {CONTROL}"}
    r = httpx.post(gw.url + "/admin/pause", headers=h, json={"timeout_s": 5})
    assert r.json()["paused"] is True and r.json()["drained"] is True
    for path, body, hdr in [
        ("/v1/chat/completions", CHAT, {"authorization": f"Bearer {tok}"}),
        ("/v1/messages", ANTH, {"x-api-key": tok}),
        ("/v1beta/models/g:generateContent", GOOG, {"x-goog-api-key": tok}),
    ]:
        res = httpx.post(gw.url + path, json=body, headers=hdr)
        assert res.status_code == 503 and res.headers["retry-after"] == "2"
    assert (
        httpx.post(gw.url + "/v1/messages", json=ANTH, headers={"x-api-key": tok}).json()["error"]["type"]
        == "overloaded_error"
    )
    httpx.post(gw.url + "/admin/resume", headers=h).raise_for_status()
    assert (
        httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {tok}"}).status_code
        == 200
    )


def test_pause_waits_for_an_inflight_stream(gw) -> None:
    tok = gw.session()["token"]
    h = {"authorization": f"Bearer {CONTROL}"}
    started = threading.Event()
    result: dict = {}

    def slow_client() -> None:
        body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "SLOW"}], "max_tokens": 300}
        with httpx.stream(
            "POST", gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tok}"}
        ) as r:
            for i, _line in enumerate(r.iter_lines()):
                if i == 2:
                    started.set()
            result["done"] = time.monotonic()

    t = threading.Thread(target=slow_client)
    t.start()
    assert started.wait(10)
    r = httpx.post(gw.url + "/admin/pause", headers=h, json={"timeout_s": 10})
    paused_at = time.monotonic()
    t.join(10)
    assert r.json()["drained"] is True and r.json()["inflight"] == 0
    assert paused_at >= result["done"] - 0.05
    assert len(gw.sink.events) == 1  # the drained call was recorded
    httpx.post(gw.url + "/admin/resume", headers=h)


def test_record_failure_means_503_not_an_unrecorded_answer(gw) -> None:
    tok = gw.session()["token"]
    gw.sink.fail = True
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {tok}"})
    assert r.status_code == 503 and "retry-after" in r.headers
    assert "choices" not in r.json()
    # streaming: content may have flowed, but no terminal event: an in-stream error instead of [DONE]
    with httpx.stream("POST", gw.url + "/v1/messages", json={**ANTH, "stream": True}, headers={"x-api-key": tok}) as s:
        text = "".join(s.iter_text())
    assert "event: error" in text and "overloaded_error" in text and "message_stop" not in text
    with httpx.stream(
        "POST",
        gw.url + "/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={"authorization": f"Bearer {tok}"},
    ) as s:
        text = "".join(s.iter_text())
    assert '"error"' in text and "[DONE]" not in text and '"finish_reason":"stop"' not in text
    gw.sink.fail = False
    assert "floe_gateway_record_failures_total 3.0" in httpx.get(gw.url + "/metrics").text


def test_a_call_asked_again_after_its_record_failed_supersedes_the_attempts_that_may_have_landed(gw) -> None:
    tok = gw.session()["token"]
    h = {"authorization": f"Bearer {tok}"}
    gw.sink.fail = gw.sink.stored = True  # the broker stores the records but the acks never come in time
    for _ in range(2):
        assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=h).status_code == 503
    gw.sink.fail = False
    for _ in range(2):
        assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=h).status_code == 200
    stale_a, stale_b, asked_again, next_call = gw.sink.events
    assert stale_a.call_index == stale_b.call_index == asked_again.call_index == 0 and next_call.call_index == 1
    assert stale_a.supersedes_call_ids == [] and stale_b.supersedes_call_ids == [stale_a.call_id]
    assert asked_again.supersedes_call_ids == [stale_a.call_id, stale_b.call_id]
    assert next_call.supersedes_call_ids == []  # acked: nothing left to supersede


def test_client_leaving_mid_stream_is_not_recorded(gw) -> None:
    tok = gw.session()["token"]
    body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "SLOW"}]}
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {tok}"}
    ) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i == 3:
                break  # the harness goes away after a few tokens
    deadline = time.monotonic() + 5
    metrics = ""
    while time.monotonic() < deadline:
        metrics = httpx.get(gw.url + "/metrics").text
        if "floe_gateway_client_disconnects_total 1.0" in metrics:
            break
        time.sleep(0.05)
    assert "floe_gateway_client_disconnects_total 1.0" in metrics
    assert 'floe_gateway_unrecorded_calls_total{reason="client_disconnected"} 1.0' in metrics  # why: no record
    assert "floe_gateway_inflight_calls 0.0" in metrics
    assert gw.sink.events == []  # the harness never received the turn: no training sample from it
