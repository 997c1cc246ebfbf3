#!/usr/bin/env python3
"""moe serve against real clients: the `openai` package, raw sockets, Prometheus' parser.

  serve_openai.py MOE_BINARY WORKDIR

Trains a tiny model (20 steps of configs/default.cfg) into WORKDIR, then, each server on a
free loopback port:
  1. --deterministic, an API key: a greedy completion and its stream equal `moe generate
     --deterministic` (same prompt, settings); a seeded sampled one too; 16 concurrent greedy
     requests give exactly the 16 outputs of `moe generate --deterministic` run one at a time;
     /v1/models, /health without the key, 401 with a bad one; stop strings.
  2. the load test: 64 requests at concurrency 16, each with the right usage; the counters of
     /metrics add up to what was sent.
  3. bad input (each a clear OpenAI-style error, the server serving the others afterwards):
     malformed JSON, wrong types, negative and huge max_tokens, an oversize body (413), a
     prompt that can never fit (400), a client that disconnects mid-stream (its slot freed:
     the cancelled counter), a slowloris connection (closed after --timeout).
  4. a full queue (--max-seqs 1 --max-queue 1): 429 with Retry-After, the others complete.
  5. SIGTERM during a stream: the server exits 0 within the bound; with a grace the stream
     finishes, without one it is cut (an error event, then [DONE]).
Exit 77 (skipped) when the openai package is missing (scripts/install_hf5.sh installs it).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

try:
    import openai
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print("skipped: %s (scripts/install_hf5.sh installs openai and prometheus-client)" % e)
    sys.exit(77)

MOE, WORK = sys.argv[1], sys.argv[2]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = "test-key-123"
failures = []


def check(what, cond, detail=""):
    print("  %-60s %s%s" % (what, "ok" if cond else "FAIL", "" if cond else "  " + str(detail)))
    if not cond:
        failures.append(what)


def train():
    run = os.path.join(WORK, "run")
    if not os.path.exists(os.path.join(run, "ckpt", "latest")):
        subprocess.run([MOE, "train", "configs/default.cfg", "--set", "train.steps=60",
                        "--set", "train.warmup_steps=2", "--set", "train.eval_interval=0",
                        "--set", 'log.dir="%s"' % run, "--set", 'data.dir="%s"' % os.path.join(WORK, "data"),
                        "--overwrite"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600)
    return os.path.join(run, "ckpt", "latest")


class Server:
    def __init__(self, ckpt, *args):
        self.p = subprocess.Popen([MOE, "serve", "--ckpt", ckpt, "--port", "0", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if "listening on" not in line:
            self.p.kill()
            raise SystemExit("moe serve did not start: %s %s" % (line, self.p.stderr.read()))
        self.url = line.split("listening on ")[1].strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def client(self, key=KEY):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def stop(self, timeout=30):
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = "timeout"
        err = self.p.stderr.read()
        return rc, err


def http(url, body=None, key=KEY, method=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    if key:
        req.add_header("Authorization", "Bearer " + key)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def generate(ckpt, prompt, n, extra=()):
    out = subprocess.run([MOE, "generate", "--ckpt", ckpt, "--prompt", prompt, "-n", str(n),
                          "--deterministic", *extra], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith(prompt) and text.endswith("\n"), repr(text)
    return text[len(prompt):-1]


def metrics(url):
    status, _, text = http(url + "/metrics")
    assert status == 200
    got = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            got[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return got


def metric(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


PROMPTS = ["int main", "// The ", "static void", "#include <", "for (int i", "return ",
           "The MoE layer", "# moe", "def ", "if (", "typedef struct", "expert", "router",
           "const int", "while (", "/* "]


def part_deterministic(ckpt):
    print("1. --deterministic with an API key")
    s = Server(ckpt, "--deterministic", "--api-key", KEY, "--max-seqs", "16")
    try:
        c = s.client()
        want = generate(ckpt, "int main", 24, ["--temperature", "0"])
        r = c.completions.create(model="x", prompt="int main", max_tokens=24, temperature=0)
        check("greedy completion == moe generate", r.choices[0].text == want, (r.choices[0].text, want))
        check("finish_reason length, usage", r.choices[0].finish_reason == "length" and
              r.usage.prompt_tokens == 8 and r.usage.completion_tokens == 24 and
              r.usage.total_tokens == 32, r)
        parts, finish, usage = [], None, None
        for ch in c.completions.create(model="x", prompt="int main", max_tokens=24, temperature=0,
                                       stream=True, stream_options={"include_usage": True}):
            if ch.choices:
                parts.append(ch.choices[0].text)
                finish = ch.choices[0].finish_reason or finish
            if ch.usage:
                usage = ch.usage
        check("stream == moe generate", "".join(parts) == want, ("".join(parts), want))
        check("stream finish_reason and usage", finish == "length" and usage and
              usage.completion_tokens == 24, (finish, usage))
        want_s = generate(ckpt, "static", 20, ["--temperature", "0.8", "--top-k", "20", "--seed", "7"])
        r = c.completions.create(model="x", prompt="static", max_tokens=20, temperature=0.8,
                                 seed=7, extra_body={"top_k": 20})
        check("seeded sampling == moe generate --seed", r.choices[0].text == want_s, (r.choices[0].text, want_s))
        wants = [generate(ckpt, p, 16, ["--temperature", "0"]) for p in PROMPTS]
        with ThreadPoolExecutor(16) as ex:
            got = list(ex.map(lambda p: c.completions.create(model="x", prompt=p, max_tokens=16,
                                                             temperature=0).choices[0].text, PROMPTS))
        same = sum(g == w for g, w in zip(got, wants))
        check("16 concurrent greedy == 16 sequential moe generate", same == 16, "%d of 16 equal" % same)
        # stop strings: the text ends before the first occurrence
        full = wants[0]
        cut = full[3:5] if len(full) >= 5 else None
        if cut:
            r = c.completions.create(model="x", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[cut])
            check("stop string: text cut before it, finish_reason stop",
                  r.choices[0].text == full[:full.index(cut)] and r.choices[0].finish_reason == "stop",
                  (r.choices[0].text, full, cut))
        lst = c.completions.create(model="x", prompt=PROMPTS[:3], max_tokens=16, temperature=0)
        check("a list of prompts: one choice each, in order",
              [ch.text for ch in sorted(lst.choices, key=lambda x: x.index)] == wants[:3])
        m = c.models.list()
        check("/v1/models lists the model", len(m.data) == 1 and m.data[0].id)
        st, _, body = http(s.url + "/health", key=None)
        check("/health without a key: 200", st == 200 and json.loads(body)["status"] == "ok", (st, body))
        try:
            s.client(key="wrong").completions.create(model="x", prompt="a", max_tokens=2)
            check("a bad key: 401", False)
        except openai.AuthenticationError as e:
            check("a bad key: 401", e.status_code == 401)
        st, _, _ = http(s.url + "/metrics", key=None)
        check("/metrics without the key: 401", st == 401)
    finally:
        rc, err = s.stop()
        check("SIGTERM when idle: exit 0", rc == 0, err[-500:])


def part_load(ckpt):
    print("2. load: 64 requests at concurrency 16")
    s = Server(ckpt, "--max-seqs", "16", "--max-queue", "128")
    try:
        c = s.client(key="none")
        prompts = [PROMPTS[i % 16] + str(i) for i in range(64)]
        def one(p):
            r = c.completions.create(model="x", prompt=p, max_tokens=8, temperature=0.7, seed=1)
            return r.usage.prompt_tokens == len(p.encode()) and r.usage.completion_tokens == 8 \
                and r.choices[0].finish_reason == "length"
        t0 = time.time()
        with ThreadPoolExecutor(16) as ex:
            ok = list(ex.map(one, prompts))
        dt = time.time() - t0
        check("64 completed with the right usage (%.1f s)" % dt, all(ok), ok.count(False))
        m = metrics(s.url)
        check("moe_requests_total == 64", metric(m, "moe_requests_total") == 64, metric(m, "moe_requests_total"))
        check("moe_generated_tokens_total == 64 x 8", metric(m, "moe_generated_tokens_total") == 512,
              metric(m, "moe_generated_tokens_total"))
        check("moe_prompt_tokens_total == the prompts' bytes",
              metric(m, "moe_prompt_tokens_total") == sum(len(p.encode()) for p in prompts),
              metric(m, "moe_prompt_tokens_total"))
        check("finished{length} == 64", metric(m, "moe_requests_finished_total", reason="length") == 64)
        check("TTFT histogram counts 64", metric(m, "moe_request_ttft_seconds_count") == 64)
        check("inter-token histogram counts 64 x 7", metric(m, "moe_request_inter_token_seconds_count") == 448)
        routed = sum(v for (n, l), v in m.items() if n == "moe_expert_routed_tokens_total")
        L = 4
        check("routed tokens == L x top-2 x every token fed",
              routed == L * 2 * (metric(m, "moe_prompt_tokens_total") + 64 * 7), routed)
        check("hot share gauges exported", any(n == "moe_expert_hot_share" for n, _ in m))
        check("queue and active back to 0", metric(m, "moe_queue_length") == 0 and
              metric(m, "moe_active_sequences") == 0 and metric(m, "moe_kv_tokens_used") == 0)
    finally:
        rc, err = s.stop()
        check("exit 0", rc == 0, err[-500:])


def raw_request(port, data, read=True, timeout=10):
    sk = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sk.sendall(data)
    out = b""
    if read:
        try:
            while True:
                b = sk.recv(65536)
                if not b:
                    break
                out += b
        except socket.timeout:
            pass
    return sk, out


def part_bad_input(ckpt):
    print("3. bad input")
    s = Server(ckpt, "--max-seqs", "4", "--max-body", "4096", "--timeout", "2", "--max-pos", "128")
    u = s.url + "/v1/completions"
    try:
        def err(status, body=None, raw=None, code=None, param=None, what=""):
            st, _, text = http(u, body, key=None, raw=raw)
            try:
                e = json.loads(text)["error"]
                ok = st == status and e["message"] and (code is None or e["code"] == code) \
                    and (param is None or e["param"] == param)
            except (ValueError, KeyError, TypeError):
                ok, e = False, text
            check("%s: %d" % (what, status), ok, (st, e))
        err(400, raw=b'{"prompt": "a", ', what="malformed JSON")
        err(400, {"prompt": 5}, param="prompt", what="prompt of the wrong type")
        err(400, {"prompt": "a", "max_tokens": "ten"}, param="max_tokens", what="max_tokens a string")
        err(400, {"prompt": "a", "max_tokens": -3}, param="max_tokens", what="negative max_tokens")
        err(400, {"prompt": "a", "max_tokens": 10**12}, param="max_tokens", what="huge max_tokens")
        err(400, {"prompt": "a", "temperature": 9}, param="temperature", what="temperature out of range")
        err(400, {"prompt": "x" * 100, "max_tokens": 100}, code="context_length_exceeded",
            what="a prompt that can never fit (--max-pos 128)")
        err(413, {"prompt": "x" * 5000}, what="an oversize body (--max-body 4096)")
        st, _, _ = http(s.url + "/nowhere", key=None)
        check("an unknown route: 404", st == 404)
        # a client that disconnects mid-stream: its slot is freed
        req = json.dumps({"prompt": "int main", "max_tokens": 100, "stream": True}).encode()
        sk, _ = raw_request(s.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                            b"application/json\r\nContent-Length: %d\r\n\r\n" % len(req) + req, read=False)
        sk.recv(200)
        sk.close()
        # a slowloris connection: half a request, then silence
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        r = s.client(key="none").completions.create(model="x", prompt="int main", max_tokens=4)
        check("served another request meanwhile", len(r.choices[0].text) > 0 and r.usage.completion_tokens == 4)
        time.sleep(3.5)
        slow.settimeout(2)
        try:
            closed = slow.recv(100) == b""
        except (ConnectionResetError, socket.timeout):
            closed = True
        check("the slowloris connection closed after --timeout 2", closed)
        slow.close()
        deadline = time.time() + 10
        while time.time() < deadline:
            m = metrics(s.url)
            if metric(m, "moe_requests_finished_total", reason="cancelled") >= 1:
                break
            time.sleep(0.2)
        check("the disconnected stream was cancelled, its slot freed",
              metric(m, "moe_requests_finished_total", reason="cancelled") == 1 and
              metric(m, "moe_active_sequences") == 0, m.get(("moe_requests_finished_total", (("reason", "cancelled"),))))
        check("rejections counted", metric(m, "moe_requests_rejected_total", reason="bad_request") >= 6 and
              metric(m, "moe_requests_rejected_total", reason="too_large") == 1 and
              metric(m, "moe_requests_rejected_total", reason="too_long") == 1)
    finally:
        rc, err = s.stop()
        check("exit 0", rc == 0, err[-500:])


def part_queue(ckpt):
    print("4. a full queue: 429")
    s = Server(ckpt, "--max-seqs", "1", "--max-queue", "1")
    try:
        def one(i):
            return http(s.url + "/v1/completions", {"prompt": "int main", "max_tokens": 40}, key=None)
        with ThreadPoolExecutor(8) as ex:
            res = list(ex.map(one, range(8)))
        codes = [r[0] for r in res]
        retry = [r[1].get("Retry-After") for r in res if r[0] == 429]
        check("some 429, the rest 200, nothing else", codes.count(429) >= 1 and
              set(codes) <= {200, 429}, codes)
        check("429 carries Retry-After (seconds)", retry and all(x and x.isdigit() for x in retry), retry)
        check("every 429 body an OpenAI error", all(json.loads(r[2])["error"]["code"] == "rate_limit_exceeded"
                                                  for r in res if r[0] == 429))
        st, _, body = http(s.url + "/v1/completions", {"prompt": "int main", "max_tokens": 4}, key=None)
        check("serves again after", st == 200, (st, body))
    finally:
        rc, err = s.stop()
        check("exit 0", rc == 0, err[-500:])


def part_sigterm(ckpt, grace):
    print("5. SIGTERM during a stream (--shutdown-grace %d)" % grace)
    s = Server(ckpt, "--max-seqs", "2", "--shutdown-grace", str(grace), "--max-pos", "128",
               "--threads", "1")
    c = s.client(key="none")
    events, ended = [], threading.Event()
    def stream():
        try:
            for ch in c.completions.create(model="x", prompt="int main", max_tokens=110, stream=True):
                events.append(ch)
        except Exception as e:  # noqa: BLE001 - the server may cut it: any end is an end
            events.append(e)
        ended.set()
    th = threading.Thread(target=stream)
    th.start()
    while not events and th.is_alive():
        time.sleep(0.01)
    t0 = time.time()
    rc, err = s.stop(timeout=30)
    th.join(30)
    check("exit 0 within grace + 5 s (%.1f s)" % (time.time() - t0), rc == 0 and time.time() - t0 < grace + 5,
          (rc, err[-300:]))
    text = "".join(e.choices[0].text for e in events if not isinstance(e, Exception) and e.choices)
    cut = any(isinstance(e, Exception) for e in events)
    check("the stream ended (%s, %d bytes)" % ("cut with an error event" if cut else "finished", len(text)),
          ended.is_set() and (cut or grace > 0))


def main():
    os.makedirs(WORK, exist_ok=True)
    ckpt = train()
    for part in (part_deterministic, part_load, part_bad_input, part_queue):
        part(ckpt)
    part_sigterm(ckpt, 2)  # in-flight requests finish within the grace
    part_sigterm(ckpt, 0)  # no grace: the stream is cut, with an error event, then [DONE]
    print("FAILED: %d" % len(failures) if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
