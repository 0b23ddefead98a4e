"""The serving tree's messages (serve.py), in one module that imports neither torch nor CUDA, so the
API process never loads the driver and the format is tested without a GPU
(tests/examples/test_serving_protocol.py).

Client -> API, and API -> engine: one JSON line, {"tokens": [ints]}: 1 to MAX_TOKENS integers,
each in [0, VOCAB). The API checks a request before it reaches the engine; a bad one is answered
{"error": "what is wrong"} and the tree serves on.
Engine -> API -> client: one JSON line, {"tokens": [STEPS ints], "sum": float, "worker": 0|1}, or
{"error": ...}. "tokens" and "sum" depend only on the request and the weights; "worker" says who
served it and is not part of the answer (same_answer).
"""
import json

VOCAB = 512        # token ids
MAX_TOKENS = 64    # per request: with STEPS, what a worker's KV blocks must hold
MAX_LINE = 1 << 16  # bytes in one request line


class BadRequest(ValueError):
    """A request the tree does not serve; str() is the answer's "error"."""


def parse_request(line):
    """A client's line (str or bytes) -> its list of tokens, or BadRequest saying what is wrong."""
    if len(line) > MAX_LINE:
        raise BadRequest(f"a request line is at most {MAX_LINE} bytes")
    try:
        req = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"not JSON: {e}") from None
    if not isinstance(req, dict):
        raise BadRequest('a request is a JSON object {"tokens": [...]}')
    tokens = req.get("tokens")
    if (not isinstance(tokens, list) or not 0 < len(tokens) <= MAX_TOKENS
            or not all(type(t) is int and 0 <= t < VOCAB for t in tokens)):
        raise BadRequest(f'"tokens" must be a list of 1 to {MAX_TOKENS} integers in [0, {VOCAB})')
    return tokens


def request_line(tokens):
    return json.dumps({"tokens": list(tokens)}) + "\n"


def answer_line(answer):
    return json.dumps(answer) + "\n"


def error_answer(why):
    return {"error": str(why)}


def read_answer(line):
    """The line an answer came on -> the answer; ConnectionError for no line (the connection was
    closed: a dump cut it), ValueError for one that is not an answer."""
    if not line:
        raise ConnectionError("no answer (the connection was closed)")
    answer = json.loads(line)
    if not isinstance(answer, dict) or not ("error" in answer or {"tokens", "sum"} <= answer.keys()):
        raise ValueError(f"not an answer: {line[:200]!r}")
    return answer


def same_answer(a, b):
    """Whether two answers to one request agree (whichever worker gave them)."""
    key = ("tokens", "sum", "error")
    return {k: a.get(k) for k in key} == {k: b.get(k) for k in key}
