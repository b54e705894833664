"""A client that hangs up gets no more work done for it: the worker moves on at once."""

from __future__ import annotations

import httpx
import pytest

SLOW = {"prompt": "hello", "max_tokens": 40, "temperature": 0}  # 40 x 0.25 s if not cancelled


@pytest.mark.parametrize("stream", [False, True])
def test_hang_up_cancels_the_job(serve, tiny_model, stream: bool) -> None:
    server = serve(
        "--model",
        str(tiny_model),
        "--inject-fault",
        "decode:slow=0.25:every",
        "--log-level",
        "debug",
    )
    server.wait()
    url = server.url + "/v1/completions"
    if stream:
        with httpx.stream("POST", url, json={**SLOW, "stream": True}) as response:
            next(response.iter_lines())  # the first token arrived; now hang up
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=SLOW, timeout=1.0)
    quick = httpx.post(url, json={**SLOW, "max_tokens": 2}, timeout=30)
    assert quick.status_code == 200
    assert "finish_reason='cancelled'" in server.output()
