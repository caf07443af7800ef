"""Capture's WAL frames: the hand-built header is ``dataclasses.asdict`` without the bodies
and without the fields at their defaults, and reads back as the same capture."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from mitm_addon.capture import Capture, dumps


def _capture() -> Capture:
    return Capture(
        call_id="call-1",
        run_id="run-1",
        transport="sse",
        method="POST",
        scheme="https",
        host="api.openai.com",
        path="/v1/chat/completions",
        started_at=1.5,
        request_headers={"content-type": "application/json"},
        request_body=b'{"model":"m"}',
        status_code=200,
        response_headers={"content-type": "text/event-stream"},
        response_body=b"data: [DONE]\n\n",
        pid=42,
        parent_pids=[1, 7],
        process_name="node",
    )


def test_frame_header_is_asdict_without_the_bodies_and_the_defaults() -> None:
    capture = _capture()
    header, blob = capture.to_frame()
    required = {f.name for f in _required()}
    defaults = asdict(Capture(**{name: getattr(capture, name) for name in required}))
    expected = {
        k: v
        for k, v in asdict(capture).items()
        if k not in Capture._BLOBS and (k in required or v != defaults[k])
    }
    assert header == {**expected, "request_len": len(capture.request_body)}
    assert blob == capture.request_body + capture.response_body


def _required() -> list:
    return [f for f in fields(Capture) if f.default is f.default_factory]  # both MISSING


def test_a_falsy_value_that_is_not_the_default_is_kept() -> None:
    capture = _capture()
    capture.stream_events, capture.completion_ids = 0, []  # defaults: None
    header, _ = capture.to_frame()
    assert header["stream_events"] == 0 and header["completion_ids"] == []
    assert Capture.from_frame(*capture.to_frame()) == capture


def test_header_with_a_lone_surrogate_is_encoded_with_ascii_escapes() -> None:
    capture = _capture()
    capture.error = "bad bytes: \udcff"
    header, _ = capture.to_frame()
    assert json.loads(dumps(header))["error"] == capture.error


def test_frame_header_does_not_change_when_the_capture_does() -> None:
    capture = _capture()
    header, _ = capture.to_frame()
    capture.request_headers["x-later"] = "1"
    capture.parent_pids.append(99)
    assert "x-later" not in header["request_headers"] and header["parent_pids"] == [1, 7]


def test_frame_round_trips_and_begin_header_leaves_out_headers_and_bodies() -> None:
    capture = _capture()
    assert Capture.from_frame(*capture.to_frame()) == capture
    begin = capture.begin_header()
    assert "request_headers" not in begin and "response_headers" not in begin
    assert begin["request_len"] == 0 and begin["call_id"] == "call-1"
