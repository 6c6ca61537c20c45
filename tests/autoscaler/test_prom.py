"""The Prometheus shell turns each way of failing into a typed error whose message says what happened."""
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.prom import BadQuery, NoData, Prometheus, PrometheusUnavailable, escape_label_value, regex_alternation
from gpuaas.cluster.process import free_port


class Answers(BaseHTTPRequestHandler):
    """A stand-in Prometheus: the query string picks the answer."""

    def do_GET(self):  # http.server's name for the GET handler
        q = self.path
        if "bad" in q:
            code, body = 400, {"status": "error", "errorType": "bad_data", "error": "1:5: parse error: unexpected"}
        elif "boom" in q:
            code, body = 503, {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}
        elif "empty" in q:
            code, body = 200, {"status": "success", "data": {"resultType": "vector", "result": []}}
        elif "nan" in q:
            code, body = 200, {"status": "success", "data": {"resultType": "vector",
                                                              "result": [{"metric": {}, "value": [1, "NaN"]}]}}
        elif "scalar" in q:
            code, body = 200, {"status": "success", "data": {"resultType": "scalar", "result": [1, "2.5"]}}
        else:
            code, body = 200, {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"pod": "a"}, "value": [1, "3"]}, {"metric": {"pod": "b"}, "value": [1, "4"]}]}}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fake():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield Prometheus(f"http://127.0.0.1:{srv.server_address[1]}", timeout_s=2)
    srv.shutdown()


def test_vector_and_scalar(fake):
    assert [(s.labels["pod"], s.value) for s in fake.query("up")] == [("a", 3.0), ("b", 4.0)]
    assert fake.scalar("scalar(1)") == 2.5


@pytest.mark.parametrize("query, error, words", [
    ("bad(", BadQuery, "bad_data: 1:5: parse error"),
    ("boom", PrometheusUnavailable, "unavailable: TSDB not ready"),
    ("empty", NoData, "returned an empty vector"),
    ("nan", NoData, "returned nan"),
    ("up", NoData, "returned 2 series, expected one"),
])
def test_answers_that_are_errors(fake, query, error, words):
    with pytest.raises(error) as err:
        fake.scalar(query)
    assert words in str(err.value)


def test_refused_and_hung():
    with pytest.raises(PrometheusUnavailable, match=r"cannot reach Prometheus at .*: connection refused"):
        Prometheus(f"http://127.0.0.1:{free_port()}", timeout_s=1).query("up")
    with socket.socket() as listener:  # accepts connections, never answers: a hung server
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        hung = Prometheus(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
        with pytest.raises(PrometheusUnavailable, match=re.escape("did not answer within 0.5s")):
            hung.query("up")


# ---- label values in PromQL: escaped as string contents, so a value cannot end its string -------------------------

@pytest.mark.parametrize("value, inside", [
    pytest.param("inference", "inference", id="a plain name stays as it is"),
    pytest.param('x",namespace!="', 'x\\",namespace!=\\"', id="a quote does not end the string"),
    pytest.param("a\\", "a\\\\", id="a trailing backslash does not escape the closing quote"),
    pytest.param("a\nb\r\tc", "a\\nb\\r\\tc", id="newline, carriage return, tab"),
    pytest.param("naïve/ü", "naïve/ü", id="other characters as they are (PromQL strings are UTF-8)"),
])
def test_escape_label_value(value, inside):
    assert escape_label_value(value) == inside


def _unquote_go(inside: str) -> str:
    """What PromQL reads from `"<inside>"` (Go interpreted string literal rules for the escapes used here)."""
    out, i = [], 0
    while i < len(inside):
        c = inside[i]
        assert c != '"' and c != "\n", f"{inside!r} ends its string early"
        if c == "\\":
            out.append({"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}[inside[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_every_escaped_value_reads_back_as_itself(value):
    assert _unquote_go(escape_label_value(value)) == value


@pytest.mark.parametrize("values, regex", [
    pytest.param(["llm-0", "llm-1"], "llm-0|llm-1", id="names as they are"),
    pytest.param(["llm.v2-0"], "llm\\.v2-0", id="a dot matches only a dot"),
    pytest.param([], "[^\\x00-\\x{10FFFF}]", id="no pods: a regex that matches nothing, not the empty value"),
])
def test_regex_alternation(values, regex):
    assert regex_alternation(values) == regex
