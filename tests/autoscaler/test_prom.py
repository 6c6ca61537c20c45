"""The Prometheus shell turns each way of failing into a typed error whose message says what happened."""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autoscaler.prom import BadQuery, NoData, Prometheus, PrometheusUnavailable
from gpuaas.cluster.process import free_port


class Answers(BaseHTTPRequestHandler):
    """A stand-in Prometheus: the query string picks the answer."""

    def do_GET(self):  # noqa: N802
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
    with pytest.raises(PrometheusUnavailable, match="cannot reach Prometheus at .*: connection refused"):
        Prometheus(f"http://127.0.0.1:{free_port()}", timeout_s=1).query("up")
    with socket.socket() as listener:  # accepts connections, never answers: a hung server
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        hung = Prometheus(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
        with pytest.raises(PrometheusUnavailable, match="did not answer within 0.5s"):
            hung.query("up")
