"""A scripted OpenAI-compatible chat server for one Hermes agent turn, on 127.0.0.1.

It plays the model: it asks Hermes to call ``skill_view`` for the skill, then for one of its
reference files, then answers. Every request is logged as one JSON line (what the system prompt
listed, what the tool results held), so a test can check what Hermes really did.

usage: python scripted_llm.py PORT LOG_PATH SKILL_NAME REFERENCE_FILE
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG_PATH, SKILL, REFERENCE = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
LIFETIME_S = 300  # shuts itself down even if the test dies


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _tool_call(call_id: str, arguments: dict) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "skill_view", "arguments": json.dumps(arguments)}}
        ],
    }


def reply(messages: list[dict]) -> dict:
    system = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    tool_results = [_text(m.get("content")) for m in messages if m.get("role") == "tool"]
    with open(LOG_PATH, "a", encoding="utf-8") as log:
        log.write(json.dumps({"system_prompt": system, "tool_results": tool_results}) + "\n")
    if len(tool_results) == 0:
        return _tool_call("call_skill", {"name": SKILL})
    if len(tool_results) == 1:
        return _tool_call("call_reference", {"name": SKILL, "file_path": REFERENCE})
    return {"role": "assistant", "content": "SCRIPTED-TURN-DONE"}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _json(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            return self._json(
                200, {"object": "list", "data": [{"id": "scripted", "object": "model", "context_length": 131072}]}
            )
        self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._json(404, {"error": {"message": "unsupported"}})
        message = reply(request.get("messages", []))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        base = {"id": "c1", "created": int(time.time()), "model": "scripted"}
        if not request.get("stream"):
            return self._json(
                200,
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                },
            )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        delta = {"role": "assistant"}
        if message.get("content"):
            delta["content"] = message["content"]
        if message.get("tool_calls"):
            delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]
        for choice in (
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": finish},
        ):
            chunk = {**base, "object": "chat.completion.chunk", "choices": [choice]}
            if choice["finish_reason"]:
                chunk["usage"] = usage
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
shutdown_timer = threading.Timer(LIFETIME_S, server.shutdown)
shutdown_timer.daemon = True
shutdown_timer.start()
print("ready", flush=True)
server.serve_forever()
