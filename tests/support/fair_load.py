"""Load for the prefill-fairness checks (``scripts/bench_fairness.py``,
``tests/test_fair_prefill_node.py``): timed requests to a node's OpenAI chat API, each
client named by its own ``User-Agent`` (``exo_p2p.api.generation.client_key``).

Every request is bounded in time (``timeout``) and every stream stops when asked.
"""

from __future__ import annotations

import json
import threading
import time

import httpx

WORD_TOKENS = 2.9
"""Prompt tokens per ``filler`` word with the synthetic model's tokenizer (measured; the
callers check the real count from the usage they get back)."""


def filler(tokens: int, salt: str) -> str:
    """A user message of about ``tokens`` prompt tokens, different for each ``salt`` (no
    shared prefix for the prompt cache to reuse)."""
    return f"{salt}: " + " ".join(f"w{(i * 7 + len(salt)) % 97}" for i in range(int(tokens / WORD_TOKENS)))


def timed_request(url: str, model: str, text: str, agent: str, timeout: float = 600.0) -> tuple[float, int]:
    """One non-streamed chat request of one completion token: (seconds until its answer,
    i.e. its time to first token, prompt tokens). Raises ``AssertionError`` on a non-200."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"user-agent": agent}, timeout=timeout)
    took = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    return took, int(r.json()["usage"]["prompt_tokens"])


class DecodeStream:
    """A client decoding all along: streamed chat requests one after the other (a new one
    when one ends) until ``stop``; ``times`` holds when each content token arrived."""

    def __init__(self, url: str, model: str, agent: str, max_tokens: int = 4000) -> None:
        self.url, self.model, self.agent, self.max_tokens = url, model, agent, max_tokens
        self.times: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"decode-{agent}", daemon=True)

    def start(self) -> DecodeStream:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def rate(self, start: float, end: float) -> float:
        """Tokens per second that arrived in ``[start, end)`` (perf_counter seconds)."""
        n = sum(1 for t in self.times if start <= t < end)
        return n / (end - start) if end > start else 0.0

    def _run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": f"{self.agent}: go on and on"}],
                "max_tokens": self.max_tokens, "temperature": 0, "stream": True}
        for _ in range(1000):  # a bound; each round ends at max_tokens, an end of turn or stop
            if self._stop.is_set():
                return
            try:
                with httpx.stream("POST", self.url + "/v1/chat/completions", json=body,
                                  headers={"user-agent": self.agent}, timeout=httpx.Timeout(300, connect=10)) as r:
                    for line in r.iter_lines():
                        if self._stop.is_set():
                            return
                        if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                            self.times.append(time.perf_counter())
            except httpx.HTTPError as e:
                self.errors.append(repr(e))
                time.sleep(0.5)


class Background:
    """One request in a thread (a long prompt prefilling beside the rest): ``took`` and
    ``prompt_tokens`` once it is answered, ``error`` if it failed."""

    def __init__(self, url: str, model: str, text: str, agent: str) -> None:
        self.took: float | None = None
        self.prompt_tokens = 0
        self.error: str | None = None
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(url, model, text, agent), daemon=True)
        self._thread.start()

    def _run(self, url: str, model: str, text: str, agent: str) -> None:
        try:
            self.took, self.prompt_tokens = timed_request(url, model, text, agent)
        except (AssertionError, httpx.HTTPError) as e:
            self.error = repr(e)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
