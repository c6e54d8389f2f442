"""End-to-end test of `edgefit serve` with the official `openai` Python client, on 127.0.0.1.

Usage: python3 engine/tests/serve_e2e/e2e.py [--edgefit target/debug/edgefit] [--venv target/serve-e2e-venv]

The script makes its own venv with the pinned client (the first run installs it from PyPI), re-runs itself
inside it, starts the server on a fixture with an API key on a free loopback port, and checks: the model list,
chat and completion responses (whole and streamed, with usage), that their tokens equal `edgefit generate`'s for
the same prompt (greedy, and sampled with the same seed), the errors the client raises for a bad key and an
unsupported field, and that SIGTERM shuts the server down with exit code 0. It prints `N passed, 0 failed`.
"""

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

OPENAI = "openai==3.51.0"
ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "engine/tests/fixtures/qwen3-f32"
KEY = "e2e-key"

args = argparse.ArgumentParser()
args.add_argument("--edgefit", default=str(ROOT / "target/debug/edgefit"))
args.add_argument("--venv", default=str(ROOT / "target/serve-e2e-venv"))
a = args.parse_args()

venv = pathlib.Path(a.venv)
vpy = venv / "bin/python"
if pathlib.Path(sys.prefix).resolve() != venv.resolve():
    if not vpy.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(vpy), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", OPENAI], check=True)
    os.execv(str(vpy), [str(vpy), __file__, *sys.argv[1:]])

import openai  # noqa: E402

COMMON = ["--model", str(FIXTURE), "--exact", "--profile", "avx512-2core", "--max-model-len", "256"]
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def generate(prompt, *extra):
    out = subprocess.run([a.edgefit, "generate", *COMMON, "--prompt", prompt, "--json", *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


server = subprocess.Popen([a.edgefit, "serve", *COMMON, "--port", "0", "--api-key", KEY,
                           "--served-model-name", "fixture", "--max-num-seqs", "4"],
                          stderr=subprocess.PIPE, text=True)
port = None
deadline = time.time() + 60
while time.time() < deadline:
    line = server.stderr.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m.group(1))
        break
    if server.poll() is not None:
        break
if port is None:
    print("the server did not start")
    server.kill()
    sys.exit(1)

try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    models = [m.id for m in client.models.list()]
    check("models.list", models == ["fixture"], models)

    # Completions, greedy: the same text and token count as `edgefit generate`.
    g = generate("hello edge", "--max-new-tokens", "16", "--temperature", "0")
    r = client.completions.create(model="fixture", prompt="hello edge", max_tokens=16, temperature=0)
    check("completion text equals generate (greedy)", r.choices[0].text == g["text"], (r.choices[0].text, g["text"]))
    check("completion usage", r.usage.completion_tokens == len(g["tokens"]) and r.usage.total_tokens ==
          r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
    check("finish_reason", r.choices[0].finish_reason == g["finish_reason"], (r.choices[0].finish_reason, g))

    # Sampled with a seed: the same stream of random numbers, so the same tokens.
    g = generate("hello edge", "--max-new-tokens", "16", "--temperature", "0.9", "--seed", "1234")
    r = client.completions.create(model="fixture", prompt="hello edge", max_tokens=16, temperature=0.9, seed=1234)
    check("completion text equals generate (seed 1234)", r.choices[0].text == g["text"], (r.choices[0].text, g["text"]))

    # Chat: the fixture's ChatML template, as `edgefit generate --chat` renders it.
    g = generate("what is an edge box?", "--chat", "--max-new-tokens", "12", "--temperature", "0")
    c = client.chat.completions.create(model="fixture", messages=[{"role": "user", "content": "what is an edge box?"}],
                                       max_tokens=12, temperature=0)
    check("chat content equals generate --chat", c.choices[0].message.content == g["text"],
          (c.choices[0].message.content, g["text"]))
    check("chat role and usage", c.choices[0].message.role == "assistant" and c.usage.completion_tokens == len(g["tokens"]))

    # Streaming chat with usage.
    s = client.chat.completions.create(model="fixture", messages=[{"role": "user", "content": "what is an edge box?"}],
                                       max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    for ch in s:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    check("chat stream equals whole", text == c.choices[0].message.content, (text, c.choices[0].message.content))
    check("chat stream usage", usage is not None and usage.completion_tokens == c.usage.completion_tokens, usage)
    check("chat stream finish_reason", finish == c.choices[0].finish_reason, finish)

    # Streaming completion.
    s = client.completions.create(model="fixture", prompt="hello edge", max_tokens=16, temperature=0, stream=True)
    text = "".join(ch.choices[0].text for ch in s if ch.choices)
    g = generate("hello edge", "--max-new-tokens", "16", "--temperature", "0")
    check("completion stream equals generate", text == g["text"], (text, g["text"]))

    # Errors the client raises.
    try:
        client.completions.create(model="fixture", prompt="x", max_tokens=2, extra_body={"frobnicate": 1})
        check("unsupported field is a 400", False)
    except openai.BadRequestError as e:
        check("unsupported field is a 400", "frobnicate" in str(e), e)
    try:
        client.completions.create(model="fixture", prompt="x", max_tokens=300)
        check("past max_model_len is a 400", False)
    except openai.BadRequestError as e:
        check("past max_model_len is a 400", "max_model_len 256" in str(e), e)
    try:
        openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
        check("wrong key is a 401", False)
    except openai.AuthenticationError:
        check("wrong key is a 401", True)
finally:
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        code = None
    check("SIGTERM: exit code 0", code == 0, code)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
