"""One JSON reply for the tests' HTTP doubles (ok_server, no_tokens_server, the sleep-mode and
judge doubles): status, Content-Type, Content-Length, body."""

import json


def send_json(handler, code: int, body) -> None:
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
