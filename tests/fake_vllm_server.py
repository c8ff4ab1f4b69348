"""A stand-in for `python -m vllm.entrypoints.openai.api_server` (standard library only), speaking
the part of its HTTP that `VLLMServerSampler` uses, for the lifecycle tests of
tests/test_vllm_server_lifecycle.py. Started with temper's arguments (--model, --port, ...) and
`--fake-mode`:

ok: serves; token k of sample j of a request is (sum(prompt) + seed + j + k + version) % 256, with
    logprob -1 - version, where version counts the successful reloads; a reload reads the
    safetensors header of weights_path/model.safetensors and fails (500) when a tensor is named
    `broken`. GET /last_reload says what the last reload read.
exit: prints a line and exits 3 before listening.  unhealthy: /health answers 503 forever.
ignore-term: serves and ignores SIGTERM.  no-dev: serves without /collective_rpc (404).
retokenise: echoes other prompt ids than it was sent.
--fake-dtype float32: /server_info reports that dtype (temper then checks every sync by default).
"""

import argparse
import json
import signal
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--port", type=int)
parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
parser.add_argument("--fake-mode", default="ok")
parser.add_argument("--fake-dtype")  # the model_config.dtype /server_info reports (none by default)
args, _ = parser.parse_known_args()
state = {"version": 0, "last_reload": None}

if args.fake_mode == "exit":
    print("fake server: refusing to start (boom)", flush=True)
    sys.exit(3)
if args.fake_mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def safetensors_names(path: Path) -> list[str]:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sorted(k for k in header if k != "__metadata__")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):  # quiet
        pass

    def reply(self, code, obj):
        raw = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        if self.path == "/health":
            self.reply(503 if args.fake_mode == "unhealthy" else 200, {})
        elif self.path == "/v1/models":
            self.reply(200, {"data": [{"id": args.model, "root": args.model, "max_model_len": 256}]})
        elif self.path.startswith("/server_info"):
            sched = {"max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": 8}
            model = {"dtype": f"torch.{args.fake_dtype}"} if args.fake_dtype else {}
            self.reply(200, {"vllm_config": {"scheduler_config": sched, "model_config": model}})
        elif self.path == "/last_reload":
            self.reply(200, {"version": state["version"], "last_reload": state["last_reload"]})
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/v1/completions":
            prompt, v = body["prompt"], state["version"]
            choices = [
                {
                    "index": j,
                    "text": "x",
                    "token_ids": [
                        (sum(prompt) + body["seed"] + j + k + v) % 256 for k in range(body["max_tokens"])
                    ],
                    "logprobs": {"token_logprobs": [-1.0 - v] * body["max_tokens"]},
                    "finish_reason": "length",
                    "stop_reason": None,
                    "prompt_token_ids": prompt[1:] if args.fake_mode == "retokenise" else prompt,
                }
                for j in reversed(range(body["n"]))
            ]
            self.reply(200, {"choices": choices})
        elif self.path == "/collective_rpc" and args.fake_mode != "no-dev":
            names = safetensors_names(Path(body["kwargs"]["weights_path"]) / "model.safetensors")
            state["last_reload"] = {"path": body["kwargs"]["weights_path"], "names": names}
            if "broken" in names:
                self.reply(500, {"error": {"message": "Worker failed with error 'size mismatch'"}})
            else:
                state["version"] += 1
                self.reply(200, {"results": [None]})
        elif self.path == "/reset_prefix_cache" and args.fake_mode != "no-dev":
            self.reply(200, {"success": True})
        else:
            self.reply(404, {"detail": "Not Found"})


ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
