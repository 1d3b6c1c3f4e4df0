"""Scripted stand-ins for the rollout engine, tokenizer and a tool task (no model needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class FakeTok:
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i > 2)


@dataclass
class _Req:
    rid: str
    turns: list[str]  # text the "model" writes in each turn
    out: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn: int = 0
    pos: int = 0
    running: bool = True


class FakeEngine:
    """Writes one scripted character per step for each running request."""

    def __init__(self, scripts: dict[str, list[str]], stops: tuple[str, ...],
                 tok: object = None) -> None:
        self.tok = tok if tok is not None else FakeTok()
        self.scripts = scripts
        self.stops = stops
        self.reqs: dict[str, _Req] = {}
        self.steps = 0
        self.log: list[tuple[int, str, str]] = []
        self.released: list[str] = []

    def add_request(self, req) -> None:  # noqa: ANN001
        self.reqs[req.request_id] = _Req(req.request_id, list(self.scripts[req.request_id]))

    def step(self):  # noqa: ANN201
        self.steps += 1
        finished = []
        for r in self.reqs.values():
            if not r.running:
                continue
            text = r.turns[r.turn]
            if r.pos < len(text):
                r.out.append(self.tok.encode(text[r.pos], add_special_tokens=False)[0])
                r.mask.append(1)
                r.pos += 1
                self.log.append((self.steps, r.rid, text[r.pos - 1]))
                written = text[: r.pos]
                stop = next((s for s in self.stops if written.endswith(s)), None)
                if stop is not None:
                    r.running = False
                    finished.append(self._out(r, "stop", stop))
            else:
                r.out.append(self.tok.eos_token_id)
                r.mask.append(1)
                r.running = False
                finished.append(self._out(r, "eos", None))
        return finished

    def _out(self, r: _Req, reason: str, stop: str | None):  # noqa: ANN202
        state = SimpleNamespace(output_ids=list(r.out), output_mask=list(r.mask))
        return SimpleNamespace(request_id=r.rid, state=state, finish_reason=reason,
                               matched_stop=stop)

    def continue_request(self, rid: str, append_ids: list[int]) -> None:
        r = self.reqs[rid]
        r.out += append_ids
        r.mask += [0] * len(append_ids)
        r.turn += 1
        r.pos = 0
        r.running = True

    def release(self, rid: str) -> None:
        self.released.append(rid)


class FakeTask:
    multi_turn = True
    max_turns = 3
    stop = ("</c>",)

    def __init__(self, latency_s: float = 0.0) -> None:
        self.calls: list[str] = []
        self.latency_s = latency_s

    def call_tool(self, call_text: str, state: dict):  # noqa: ANN201
        self.calls.append(call_text)
        return SimpleNamespace(text="<r>5</r>", ok=True, latency_s=self.latency_s)
