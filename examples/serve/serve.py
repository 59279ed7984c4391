"""Serves the quickstart's trained linear model (y = w x + b) over HTTP, with Python's standard
library only. A replica of a tau service gets:
  PORT               the port to listen on (each replica its own)
  TAU_SERVE_MODEL    the trained run's newest complete checkpoint (tau serve deploy --from RUN),
                     read-only when the server runs as root
Endpoints:
  GET  /healthz              200 once the model is loaded (the service's readiness probe)
  GET  /predict?x=1.5        {"x": 1.5, "y": ...}
  POST /predict {"x": [..]}  {"x": [...], "y": [...]}
  GET  /model                which checkpoint this replica serves
"""
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def load_model():
    path = os.environ.get("TAU_SERVE_MODEL")
    if not path:
        print("TAU_SERVE_MODEL is not set: deploy with --from RUN (a quickstart run)",
              file=sys.stderr)
        sys.exit(2)
    with open(path) as f:
        state = json.load(f)
    return path, float(state["w"]), float(state["b"]), int(state.get("step", 0))


MODEL_PATH, W, B, STEP = load_model()


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, the answer's end is the connection's.
    protocol_version = "HTTP/1.0"

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/healthz":
            return self.reply(200, {"ok": True})
        if url.path == "/model":
            return self.reply(200, {"checkpoint": MODEL_PATH, "step": STEP, "w": W, "b": B,
                                    "replica": os.environ.get("TAU_RUN_NAME", "")})
        if url.path == "/predict":
            try:
                x = float(parse_qs(url.query)["x"][0])
            except (KeyError, ValueError):
                return self.reply(400, {"error": "give x as a number: /predict?x=1.5"})
            return self.reply(200, {"x": x, "y": W * x + B})
        return self.reply(404, {"error": f"no route {url.path}"})

    def do_POST(self):
        if urlparse(self.path).path != "/predict":
            return self.reply(404, {"error": "POST /predict only"})
        length = int(self.headers.get("Content-Length") or 0)
        try:
            xs = [float(x) for x in json.loads(self.rfile.read(length))["x"]]
        except (ValueError, KeyError, TypeError):
            return self.reply(400, {"error": 'the body must be {"x": [numbers]}'})
        return self.reply(200, {"x": xs, "y": [W * x + B for x in xs]})

    def log_message(self, fmt, *args):  # one line per request in the replica's log
        if self.path == "/healthz":
            return  # the probes, twice a second
        sys.stdout.write("%s\n" % (fmt % args))
        sys.stdout.flush()


def main():
    port = int(os.environ.get("PORT", "8080"))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"serving {MODEL_PATH} (step {STEP}: w={W:.4f} b={B:.4f}) on port {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
