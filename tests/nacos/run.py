#!/usr/bin/env python3
"""Runs the published Nacos clients against a real `gangway server` and checks what they see.

    python3 tests/nacos/run.py [--only NAME ...]

Needs (scripts/test.sh installs them): target/debug/gangway (or $GANGWAY_BIN), the venv
tests/nacos/python/.venv with nacos-sdk-python 3.2.0, tests/nacos/node/node_modules with
npm `nacos` 2.6.3, and the built tests/nacos/rust driver (nacos-sdk 0.8.3). Standard library
only. Talks to 127.0.0.1 only. Prints one line per check with what it measured; exits 1 if any
scenario failed.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
GANGWAY = os.environ.get("GANGWAY_BIN", os.path.join(TARGET, "debug", "gangway"))
PYTHON = os.environ.get("NACOS_PYTHON", os.path.join(HERE, "python", ".venv", "bin", "python"))
RUST_DRIVER = os.environ.get(
    "NACOS_RUST_DRIVER",
    os.path.join(ROOT, "target", "nacos-rust", "debug", "gangway-nacos-rust-check"),
)

# Short server timings keep the run fast. The Node client's first beat comes 10 s after it
# starts, so the lease TTL must exceed that.
TTL_MS = 12_000
DELETE_MS = 14_000
KEEPALIVE_INTERVAL_MS = 200  # short, so interval + timeout leaves 0.8 s of the 1 s margin
KEEPALIVE_TIMEOUT_MS = 3_000


class Failed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failed(msg)


def free_pair():
    """An HTTP port P with P+1000 also free (Nacos SDKs derive the gRPC port that way)."""
    for _ in range(200):
        p = random.randint(20000, 40000)
        socks = []
        try:
            for port in (p, p + 1000):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                socks.append(s)
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port pair")


class Server:
    def __init__(self, scratch, extra=(), tls=None):
        self.port = free_pair()
        self.addr = f"127.0.0.1:{self.port}"
        # With `tls` (a Pki's files), requests go over https with the client certificate.
        self.scheme, self.ssl = "http", None
        if tls is not None:
            import ssl

            self.scheme = "https"
            self.ssl = ssl.create_default_context(cafile=tls["ca"])
            self.ssl.load_cert_chain(tls["client_cert"], tls["client_key"])
        self.log = open(os.path.join(scratch, "gangway.log"), "w")
        self.proc = subprocess.Popen(
            [
                GANGWAY, "server",
                "--http", self.addr,
                "--grpc", f"127.0.0.1:{self.port + 1000}",
                "--data-dir", os.path.join(scratch, "data"),
                "--warmup", "0s",
                "--lease-ttl", f"{TTL_MS}ms",
                "--lease-delete-timeout", f"{DELETE_MS}ms",
                "--keepalive-interval", f"{KEEPALIVE_INTERVAL_MS}ms",
                "--keepalive-timeout", f"{KEEPALIVE_TIMEOUT_MS}ms",
                "--log", "info,gangway_server::nacos=debug",
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if self.get("/v1/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("gangway server did not come up")

    def request(self, method, path, params=None, body=None, headers=None):
        url = f"{self.scheme}://{self.addr}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = body.encode() if isinstance(body, str) else body
        req = urllib.request.Request(url, method=method, data=data, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ssl) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def get(self, path, params=None):
        return self.request("GET", path, params)

    def v1_hosts(self, service):
        status, body = self.get("/nacos/v1/ns/instance/list", {"serviceName": service})
        check(status == 200, f"v1 list {service}: {status} {body}")
        return json.loads(body)["hosts"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Child:
    """A client process whose stdout lines are collected with their arrival time."""

    def __init__(self, argv, cwd, env=None, stdin=subprocess.DEVNULL):
        self.lines = []
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait_line(self, pred, timeout=30, since=0):
        """The first line from index `since` on that satisfies `pred`, with its arrival time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines)[since:]:
                if pred(line):
                    return t, line
            if self.proc.poll() is not None and not any(pred(l) for _, l in self.lines[since:]):
                break
            time.sleep(0.02)
        raise Failed(f"no expected line; output so far: {[l for _, l in self.lines][-15:]}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def python_child(server, scratch, *args):
    env = dict(os.environ, NACOS_SCRATCH=scratch)
    return Child([PYTHON, "scenarios.py", *args], os.path.join(HERE, "python"), env)


def node_child(*args):
    return Child(["node", "scenarios.js", *args], os.path.join(HERE, "node"))


def wait_until(pred, timeout, step=0.01):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if pred():
            return time.monotonic() - start
        time.sleep(step)
    return None


def run_to_end(child, timeout, label):
    try:
        child.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        raise Failed(f"{label} did not finish within {timeout}s: {[l for _, l in child.lines][-15:]}")
    time.sleep(0.1)
    out = [l for _, l in child.lines]
    for line in out:
        if line.startswith("ok ") or line.startswith("PASS"):
            print(f"    {line}")
    check(child.proc.returncode == 0, f"{label} exited {child.proc.returncode}: {out[-15:]}")


# --- scenarios -------------------------------------------------------------------------------


def python_basic(server, scratch):
    """Python SDK: register two, list, subscribe + deregistration push, update, persistent, services."""
    run_to_end(python_child(server, scratch, "basic", server.addr, "py-basic"), 120, "python basic")


def python_sigkill(server, scratch):
    """A Python client holding a registration is SIGKILLed: gone from the list within 1 s."""
    c = python_child(server, scratch, "holder", server.addr, "py-kill", "10.5.0.1", "9001")
    try:
        c.wait_line(lambda l: l == "READY")
        check(len(server.v1_hosts("py-kill")) == 1, "holder's instance not listed")
        t0 = time.monotonic()
        c.proc.send_signal(signal.SIGKILL)
        took = wait_until(lambda: not server.v1_hosts("py-kill"), 5)
        check(took is not None, "instance still listed 5 s after SIGKILL")
        print(f"    SIGKILL -> gone from the list in {took * 1000:.0f} ms (limit 1000 ms)")
        check(took < 1.0, f"took {took:.3f} s")
    finally:
        c.kill()


def python_sigstop(server, scratch):
    """A Python client holding a registration is frozen (SIGSTOP): gone within keepalive timeout + 1 s."""
    c = python_child(server, scratch, "holder", server.addr, "py-stop", "10.5.0.2", "9002")
    try:
        c.wait_line(lambda l: l == "READY")
        check(len(server.v1_hosts("py-stop")) == 1, "holder's instance not listed")
        t0 = time.monotonic()
        c.proc.send_signal(signal.SIGSTOP)
        limit = KEEPALIVE_TIMEOUT_MS / 1000 + 1
        took = wait_until(lambda: not server.v1_hosts("py-stop"), limit + 5, 0.05)
        check(took is not None, f"instance still listed {limit + 5} s after SIGSTOP")
        print(
            f"    SIGSTOP -> gone from the list in {took * 1000:.0f} ms "
            f"(keepalive {KEEPALIVE_INTERVAL_MS}/{KEEPALIVE_TIMEOUT_MS} ms; limit {limit * 1000:.0f} ms)"
        )
        check(took <= limit, f"took {took:.3f} s")
    finally:
        c.proc.send_signal(signal.SIGCONT)
        c.kill()


def gangway_cli(server, *args, timeout=60):
    p = subprocess.run(
        [GANGWAY, *args, "--server", server.addr, "--json"],
        capture_output=True, text=True, timeout=timeout,
    )
    return p.returncode, p.stdout, p.stderr, time.time()


def cross_protocol_drain(server, scratch):
    """Python consumer subscribed; `gangway offline --wait` of a native instance waits for its ack."""
    svc = "xdrain"
    a, b, c3 = "10.6.0.1:9101", "10.6.0.2:9102", "10.6.0.3:9103"
    for addr in (a, b, c3):
        ip, port = addr.split(":")
        status, body = server.request(
            "POST", f"/v1/services/{svc}/instances",
            body=json.dumps({"ip": ip, "port": int(port), "ttl_ms": 600000, "delete_timeout_ms": 600000}),
            headers={"Content-Type": "application/json"},
        )
        check(status in (200, 201), f"native register: {status} {body}")
    c = python_child(server, scratch, "consumer", server.addr, svc)
    try:
        def hosts_line(want):
            def pred(line):
                return line.startswith("{") and json.loads(line)["hosts"] == want
            return pred

        c.wait_line(lambda l: l == "READY")
        c.wait_line(hosts_line([a, b, c3]))
        status, body = server.get(f"/v1/services/{svc}/subscribers")
        subs = json.loads(body)["subscribers"]
        nacos_subs = [s for s in subs if s["client_name"].startswith("nacos-grpc")]
        check(len(nacos_subs) == 1, f"subscribers: {subs}")
        sub_id = nacos_subs[0]["id"]
        print(f"    subscriber {sub_id} client_name={nacos_subs[0]['client_name']!r}")

        # Frozen consumer: the drain of A must not complete, and must name it as a laggard.
        c.proc.send_signal(signal.SIGSTOP)
        try:
            code, out, err, _ = gangway_cli(server, "offline", svc, a, "--wait", "--timeout", "1500ms")
        finally:
            c.proc.send_signal(signal.SIGCONT)
        check(code == 3, f"drain with a frozen Nacos consumer exited {code}: {out} {err}")
        report = json.loads(out)
        check(any(l["id"] == sub_id for l in report["laggards"]), f"not among laggards: {report}")
        print(f"    frozen consumer: drain of {a} timed out (exit 3), laggards {[l['id'] for l in report['laggards']]}")
        c.wait_line(hosts_line([b, c3]), timeout=5)  # thawed, it catches up

        # Live consumer: the drain of B completes once the Python client acked, and lists it.
        since = len(c.lines)
        t0 = time.time()
        code, out, err, t_end = gangway_cli(server, "offline", svc, b, "--wait", "--timeout", "20")
        check(code == 0, f"drain exited {code}: {out} {err}")
        report = json.loads(out)
        check(report["complete"], f"drain not complete: {report}")
        acked = [x for x in report["acked"] if x["id"] == sub_id]
        check(acked and acked[0]["acked_revision"] >= report["revision"], f"acked: {report}")
        t_seen, _ = c.wait_line(hosts_line([c3]), timeout=5, since=since)
        check(t0 <= t_seen <= t_end, "the consumer did not apply the new list while the drain waited")
        print(
            f"    drain of {b} complete after {report['waited_ms']} ms; Python consumer {sub_id} acked "
            f"revision {acked[0]['acked_revision']} >= {report['revision']}; it applied the list without "
            f"{b} {(t_seen - t0) * 1000:.0f} ms after the drain command started, before it returned "
            f"({(t_end - t0) * 1000:.0f} ms)"
        )

        # The last instance: Nacos SDKs ignore empty lists, so the drain must say so.
        code, out, err, _ = gangway_cli(server, "offline", svc, c3, "--wait", "--force", "--timeout", "10")
        check(code == 0, f"forced drain exited {code}: {out} {err}")
        notes = json.loads(out).get("notes", [])
        check(any("ignore an empty instance list" in n for n in notes), f"notes: {notes}")
        print(f"    last instance: drain notes {notes}")
    finally:
        c.kill()


def node_basic(server, scratch):
    """npm nacos (v1): register, beats past the TTL, list, polling subscription, deregister."""
    run_to_end(node_child("basic", server.addr, "node-basic", str(TTL_MS)), 90, "node basic")
    # Its subscribed list calls (udpPort > 0) made it a poller: a gangway subscriber.
    _, body = server.get("/v1/services/node-basic/subscribers")
    pollers = [s for s in json.loads(body)["subscribers"] if s["kind"] == "poller"]
    check(
        len(pollers) == 1 and pollers[0]["client_name"].startswith("nacos-v1-"),
        f"the Node client is not a poller of node-basic: {body}",
    )
    print(f"    the Node client polls as subscriber {pollers[0]['id']} ({pollers[0]['address']})")


def node_killed(server, scratch):
    """A killed Node client's instance: unhealthy after the TTL, deleted after the delete timeout."""
    c = node_child("holder", server.addr, "node-kill", "10.7.0.1", "7101")
    try:
        t_ready, _ = c.wait_line(lambda l: l == "READY")
        c.proc.send_signal(signal.SIGKILL)
        # The registration itself was the last sign of life (the client's first beat comes later).
        t_unhealthy = t_deleted = None
        deadline = time.time() + DELETE_MS / 1000 + 6
        while time.time() < deadline and t_deleted is None:
            # The v3 admin list shows real health: the v1 list would show the lone unhealthy
            # instance as healthy, since the protect threshold (0) fires, as in Nacos.
            status, body = server.get("/nacos/v3/admin/ns/instance/list", {"serviceName": "node-kill"})
            check(status == 200, f"v3 admin list: {status} {body}")
            hosts = json.loads(body)["data"]
            now = time.time()
            if hosts and not hosts[0]["healthy"] and t_unhealthy is None:
                t_unhealthy = now
                status, body = server.get("/nacos/v1/ns/instance/list", {"serviceName": "node-kill"})
                v1 = json.loads(body)
                check(
                    v1["reachProtectionThreshold"] and v1["hosts"][0]["healthy"],
                    f"v1 list of a lone unhealthy instance (threshold 0 fires, as in Nacos): {v1}",
                )
            if not hosts:
                t_deleted = now
            time.sleep(0.05)
        check(t_unhealthy is not None, "never reported unhealthy")
        check(t_deleted is not None, "never deleted")
        u, d = t_unhealthy - t_ready, t_deleted - t_ready
        print(
            f"    killed Node client: unhealthy after {u * 1000:.0f} ms (TTL {TTL_MS}), "
            f"deleted after {d * 1000:.0f} ms (delete timeout {DELETE_MS})"
        )
        check(TTL_MS / 1000 - 0.5 <= u <= TTL_MS / 1000 + 1.5, f"unhealthy at {u:.2f} s")
        check(DELETE_MS / 1000 - 0.5 <= d <= DELETE_MS / 1000 + 1.5, f"deleted at {d:.2f} s")
    finally:
        c.kill()


def rust_sdk(server, scratch):
    """nacos-sdk of the Rust crates registry (gRPC): subscribe, batch register, push, deregister,
    service list."""
    c = Child([RUST_DRIVER, server.addr, str(server.port + 1000), "rust-svc"], HERE,
              dict(os.environ, HOME=scratch), stdin=subprocess.PIPE)
    try:
        c.wait_line(lambda l: l == "HOLD", timeout=60)
        # The consumer's NotifySubscriberResponse acks reached the subscriber table.
        _, body = server.get("/v1/services/rust-svc/subscribers")
        table = json.loads(body)
        subs = [s for s in table["subscribers"] if s["client_name"].startswith("nacos-grpc")]
        check(len(subs) == 1, f"subscribers of rust-svc: {table}")
        check(
            subs[0]["acked_revision"] == table["revision"],
            f"the Rust consumer acked {subs[0]['acked_revision']}, the service is at {table['revision']}",
        )
        print(f"    Rust consumer {subs[0]['id']} ({subs[0]['client_name']}) acked the current revision")
    finally:
        c.proc.stdin.close()
    run_to_end(c, 30, "rust nacos-sdk")


MALFORMED = [
    # (method, path, params, the parameter the error must name)
    ("POST", "/nacos/v1/ns/instance", {"ip": "10.8.0.1", "port": "80"}, "serviceName"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "ip": "10.8.0.1", "port": "abc"}, "port"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "ip": "10.8.0.1", "port": "70000"}, "port"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "ip": "10.8.0.1"}, "port"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "port": "80"}, "ip"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "ip": "10.8.0.1", "port": "80", "weight": "heavy"}, "weight"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "ip": "10.8.0.1", "port": "80", "weight": "-1"}, "weight"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "ip": "10.8.0.1", "port": "80", "metadata": '{"a":'}, "metadata"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "m", "ip": "10.8.0.1", "port": "80", "enabled": "maybe"}, "enabled"),
    ("POST", "/nacos/v1/ns/instance", {"serviceName": "bad name", "ip": "10.8.0.1", "port": "80"}, "service"),
    ("DELETE", "/nacos/v1/ns/instance", {"ip": "10.8.0.9", "port": "80"}, "serviceName"),
    ("DELETE", "/nacos/v1/ns/instance", {"serviceName": "seed", "ip": "10.8.0.9", "port": "x"}, "port"),
    ("PUT", "/nacos/v1/ns/instance", {"ip": "10.8.0.9", "port": "80", "enabled": "false"}, "serviceName"),
    ("PUT", "/nacos/v1/ns/instance", {"serviceName": "seed", "ip": "10.8.0.9", "port": "80", "weight": "x"}, "weight"),
    ("PUT", "/nacos/v1/ns/instance", {"serviceName": "seed", "ip": "10.8.0.9", "port": "80", "metadata": "{broken"}, "metadata"),
    ("PUT", "/nacos/v1/ns/instance", {"serviceName": "seed", "ip": "10.8.0.9", "port": "0"}, "port"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"ip": "10.8.0.9", "port": "80"}, "serviceName"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "seed", "beat": "{broken"}, "beat"),
    ("PUT", "/nacos/v1/ns/instance/beat", {"serviceName": "seed", "ip": "10.8.0.9", "port": "eighty"}, "port"),
    ("GET", "/nacos/v1/ns/instance/list", {}, "serviceName"),
    ("GET", "/nacos/v1/ns/instance/list", {"serviceName": "seed", "healthyOnly": "maybe"}, "healthyOnly"),
    ("GET", "/nacos/v1/ns/instance/list", {"serviceName": "seed", "udpPort": "x"}, "udpPort"),
    ("GET", "/nacos/v1/ns/instance", {"ip": "10.8.0.9", "port": "80"}, "serviceName"),
    ("GET", "/nacos/v1/ns/instance", {"serviceName": "seed", "ip": "10.8.0.9", "port": "-3"}, "port"),
    ("POST", "/nacos/v1/ns/service", {}, "serviceName"),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "m2", "protectThreshold": "high"}, "protectThreshold"),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "m2", "protectThreshold": "2"}, "protect"),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "m2", "metadata": "{oops"}, "metadata"),
    ("POST", "/nacos/v1/ns/service", {"serviceName": "seed"}, "already exists"),
    ("PUT", "/nacos/v1/ns/service", {"protectThreshold": "0.5"}, "serviceName"),
    ("PUT", "/nacos/v1/ns/service", {"serviceName": "seed", "protectThreshold": "x"}, "protectThreshold"),
    ("DELETE", "/nacos/v1/ns/service", {}, "serviceName"),
    ("DELETE", "/nacos/v1/ns/service", {"serviceName": "seed"}, "not empty"),
    ("GET", "/nacos/v1/ns/service", {}, "serviceName"),
    ("GET", "/nacos/v1/ns/service/list", {"pageSize": "10"}, "pageNo"),
    ("GET", "/nacos/v1/ns/service/list", {"pageNo": "1", "pageSize": "ten"}, "pageSize"),
]


def v1_malformed(server, scratch):
    """Every v1 endpoint with malformed input: Nacos-style 400 + `caused: ...;`, state unchanged."""
    status, body = server.request(
        "POST", "/nacos/v1/ns/instance",
        {"serviceName": "seed", "ip": "10.8.0.9", "port": "80", "ephemeral": "false", "metadata": '{"k":"v"}'},
    )
    check((status, body) == (200, "ok"), f"seed register: {status} {body}")

    def state():
        hosts = server.v1_hosts("seed")
        _, services = server.get("/v1/services")
        return json.dumps(hosts, sort_keys=True), json.loads(services)

    before = state()
    n = 0
    for form in (False, True):
        for method, path, params, names in MALFORMED:
            if form and method == "GET":
                continue
            if form:
                status, body = server.request(
                    method, path, body=urllib.parse.urlencode(params),
                    headers={"Content-Type": "application/x-www-form-urlencoded"},
                )
            else:
                status, body = server.request(method, path, params)
            where = f"{method} {path} {params}{' (form)' if form else ''}"
            check(status == 400, f"{where}: status {status} {body}")
            check(body.startswith("caused: ") and body.endswith(";"), f"{where}: body {body!r}")
            check(names in body, f"{where}: body {body!r} does not name {names!r}")
            n += 1
    after = state()
    check(before == after, f"state changed:\nbefore {before}\nafter  {after}")
    status, body = server.request("POST", "/nacos/v3/client/ns/instance", {"ip": "10.8.0.1", "port": "80"})
    check(status == 400 and json.loads(body)["code"] == 10000, f"v3 missing serviceName: {status} {body}")
    print(f"    {n} malformed v1 requests (query and form): 400 + 'caused: ...;' naming the parameter; state unchanged")


def one_registry(server, scratch):
    """A gRPC (Python) and a v1 instance in one service: native view, offline via Nacos and via gangway."""
    svc = "one-reg"
    c = python_child(server, scratch, "holder", server.addr, svc, "10.5.0.5", "9005")
    consumer = python_child(server, scratch, "consumer", server.addr, svc)
    try:
        c.wait_line(lambda l: l == "READY")
        status, body = server.request(
            "POST", "/nacos/v1/ns/instance", {"serviceName": svc, "ip": "10.5.0.6", "port": "9006"}
        )
        check((status, body) == (200, "ok"), f"v1 register: {status} {body}")

        def native():
            _, body = server.get(f"/v1/services/{svc}/instances")
            return sorted((i["ip"], i["liveness"]) for i in json.loads(body)["instances"])

        check(
            native() == [("10.5.0.5", "session"), ("10.5.0.6", "lease")],
            f"native view: {native()}",
        )
        print("    native view lists the gRPC instance (session) and the v1 instance (lease)")

        def pushed(want):
            return lambda l: l.startswith("{") and json.loads(l)["hosts"] == want

        consumer.wait_line(pushed(["10.5.0.5:9005", "10.5.0.6:9006"]))
        # Nacos's manual offline of the gRPC-registered instance: hidden from every protocol.
        status, body = server.request(
            "PUT", "/nacos/v1/ns/instance",
            {"serviceName": svc, "ip": "10.5.0.5", "port": "9005", "enabled": "false"},
        )
        check((status, body) == (200, "ok"), f"v1 offline: {status} {body}")
        check(native() == [("10.5.0.6", "lease")], f"native view after Nacos offline: {native()}")
        check([h["ip"] for h in server.v1_hosts(svc)] == ["10.5.0.6"], "v1 list after offline")
        consumer.wait_line(pushed(["10.5.0.6:9006"]), timeout=5)
        print("    PUT /nacos/v1/ns/instance enabled=false: gone from the native view, the v1 list and the Python push")
        # gangway's online brings it back everywhere.
        since = len(consumer.lines)
        code, out, err, _ = gangway_cli(server, "online", svc, "10.5.0.5:9005")
        check(code == 0, f"gangway online: {code} {out} {err}")
        consumer.wait_line(pushed(["10.5.0.5:9005", "10.5.0.6:9006"]), timeout=5, since=since)
        check(len(server.v1_hosts(svc)) == 2, "v1 list after online")
        print("    gangway online: back in the v1 list and the Python push")
    finally:
        c.kill()
        consumer.kill()


class Wrapped:
    """`gangway run` around `python3 -m http.server` (serving a `ping` file), JSON events on stdout."""

    def __init__(self, server, scratch, service):
        self.port = _free_port()
        root = tempfile.mkdtemp(prefix="www-", dir=scratch)
        with open(os.path.join(root, "ping"), "w") as f:
            f.write("pong")
        # --linger: python's http.server cuts off in-flight requests at SIGTERM.
        argv = [GANGWAY, "run", "--json", "--service", service, "--port", str(self.port),
                "--registry", f"127.0.0.1:{server.port + 1000}", "--linger", "500ms", "--",
                sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1",
                "--directory", root]
        self.events = []
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith('{"event"'):
                self.events.append(json.loads(line))

    def wait_event(self, name, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in list(self.events):
                if e["event"] == name:
                    return e
            time.sleep(0.02)
        raise Failed(f"no {name!r} event from gangway run: {self.events[-5:]}")

    def kill(self):
        """SIGKILL to the wrapper and to the program's own process group (from `started`)."""
        groups = [self.proc.pid] + [e["pid"] for e in list(self.events) if e["event"] == "started"]
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def python_consumer_gangway_run_rollout(server, scratch):
    """Python SDK consumer at 60 req/s; 3 `gangway run` python http.server instances rolled: 0 failed."""
    svc = "py-roll"
    wrapped = []
    consumer = None
    try:
        for _ in range(3):
            w = Wrapped(server, scratch, svc)
            w.wait_event("ready")
            wrapped.append(w)
        consumer = python_child(server, scratch, "load", server.addr, svc, "60", "8")
        consumer.wait_line(lambda l: l == "READY")
        time.sleep(1)  # load runs before the rollout (workload timing)
        steps = []
        for _ in range(3):
            fresh = Wrapped(server, scratch, svc)
            ready = fresh.wait_event("ready")
            old = wrapped.pop(0)
            # The other wrapper's process group leader is the wrapper itself.
            os.kill(old.proc.pid, signal.SIGTERM)
            drained = old.wait_event("drained")
            old.proc.wait(15)
            steps.append((ready["acked"], drained["waited_ms"], drained["complete"]))
            wrapped.append(fresh)
        _, line = consumer.wait_line(lambda l: l.startswith('{"sent"'), timeout=30)
        summary = json.loads(line)
        print(f"    rollout steps (acked by, drain ms, complete): {steps}")
        check(all(c for _, _, c in steps), f"every drain complete: {steps}")
        check(all(a >= 1 for a, _, _ in steps), f"every new instance acked by the Python consumer: {steps}")
        print(f"    Python consumer: {summary['failed']} of {summary['sent']} failed")
        check(summary["sent"] == 480 and summary["failed"] == 0, f"summary: {summary}")
    finally:
        for w in wrapped:
            w.kill()
        if consumer:
            consumer.kill()


def auth_file(scratch, users):
    """An auth file (`gangway auth user add`) with `users`: (name, role); password name + "-pw"."""
    path = os.path.join(scratch, "auth.toml")
    for name, role in users:
        subprocess.run(
            [GANGWAY, "auth", "--file", path, "user", "add", name, "--role", role],
            input=f"{name}-pw\n", capture_output=True, text=True, timeout=60, check=True,
        )
    return path


def python_auth(server, scratch):
    """Python SDK with username/password against `gangway server --auth`: logs in, registers, subscribes, sees pushes."""
    own = tempfile.mkdtemp(prefix="auth-", dir=scratch)
    path = auth_file(own, [("writer", "write"), ("reader", "read")])
    other = Server(own, ["--auth", path])
    try:
        # Auth is on: an anonymous v1 list is refused, the login answers Nacos's shape.
        status, _ = other.get("/nacos/v1/ns/instance/list", {"serviceName": "py-auth"})
        check(status in (401, 403), f"anonymous v1 list with auth on: {status}")
        run_to_end(python_child(other, own, "auth", other.addr, "py-auth"), 120, "python auth")
        _, body = other.request(
            "POST", "/nacos/v1/auth/login", body="username=reader&password=reader-pw",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        token = json.loads(body)["accessToken"]
        def listed():
            status, body = other.get(
                "/nacos/v1/ns/instance/list", {"serviceName": "py-auth", "accessToken": token}
            )
            check(status == 200, f"list with the reader's login token: {status} {body}")
            return json.loads(body)["hosts"]

        took = wait_until(lambda: not listed(), 5, 0.05)
        check(took is not None, f"the SDK clients' instances outlived their connections: {listed()}")
        print("    anonymous list refused; after the SDK clients closed, their instances are gone")
    finally:
        other.stop()


def make_pki(folder):
    """A private CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files
    in `folder` (PyPI `cryptography`, installed by scripts/test.sh)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(cn, key, issuer, issuer_key, extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        for ext, critical in extensions:
            builder = builder.add_extension(ext, critical=critical)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(file, data):
        path = os.path.join(folder, file)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def key_pem(key):
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("nacos-test CA", ca_key, name("nacos-test CA"), ca_key,
               [(x509.BasicConstraints(ca=True, path_length=None), True)])
    files = {"ca": write("ca.pem", ca.public_bytes(serialization.Encoding.PEM))}
    for role, cn, extensions in [
        ("server", "gangway", [
            (x509.SubjectAlternativeName([x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]), False),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        ]),
        ("client", "python-sdk", [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)]),
    ]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue(cn, key, ca.subject, ca_key, extensions)
        files[f"{role}_cert"] = write(f"{role}.crt", cert.public_bytes(serialization.Encoding.PEM))
        files[f"{role}_key"] = write(f"{role}.key", key_pem(key))
    return files


def python_tls(server, scratch):
    """Python SDK with its TLSConfig and username/password against `gangway server --tls-cert --tls-key --tls-client-ca --auth`: logs in over HTTPS, registers, subscribes, sees pushes over TLS."""
    own = tempfile.mkdtemp(prefix="tls-", dir=scratch)
    pki = make_pki(own)
    other = Server(own, [
        "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"],
        "--tls-client-ca", pki["ca"], "--auth", auth_file(own, [("writer", "write")]),
    ], tls=pki)
    try:
        status, body = other.get("/v1/health")
        check(status == 200 and json.loads(body)["tls"] == "mutual", f"health over TLS: {status} {body}")
        run_to_end(
            python_child(other, own, "tls", f"https://{other.addr}", "py-tls",
                         pki["ca"], pki["client_cert"], pki["client_key"]),
            120, "python tls",
        )
        print("    health says tls=mutual")
    finally:
        other.stop()


def server_stop_with_clients(server, scratch):
    """SIGTERM of a server with a Nacos gRPC client connected: it resets the connection and exits."""
    own = tempfile.mkdtemp(prefix="stop-", dir=scratch)
    other = Server(own)
    c = python_child(other, own, "holder", other.addr, "py-stop-server", "10.5.0.3", "9003")
    try:
        c.wait_line(lambda l: l == "READY")
        t0 = time.monotonic()
        other.proc.terminate()
        try:
            other.proc.wait(5)
        except subprocess.TimeoutExpired:
            raise Failed("server still running 5 s after SIGTERM with a Nacos client connected")
        took = time.monotonic() - t0
        print(f"    server exited {took * 1000:.0f} ms after SIGTERM (status {other.proc.returncode})")
        check(other.proc.returncode == 0, f"exit status {other.proc.returncode}")
    finally:
        c.kill()
        other.stop()


SCENARIOS = [
    python_basic,
    python_sigkill,
    python_sigstop,
    cross_protocol_drain,
    one_registry,
    python_consumer_gangway_run_rollout,
    rust_sdk,
    v1_malformed,
    server_stop_with_clients,
    python_auth,
    python_tls,
    node_basic,
    node_killed,
]


def main():
    only = set(sys.argv[2:]) if len(sys.argv) > 2 and sys.argv[1] == "--only" else None
    scratch = tempfile.mkdtemp(prefix="gangway-nacos-")
    server = Server(scratch)
    print(f"gangway server on {server.addr} (gRPC {server.port + 1000}); scratch {scratch}")
    failed = []
    passed = 0
    try:
        for scenario in SCENARIOS:
            if only and scenario.__name__ not in only:
                continue
            print(f"-- {scenario.__name__}: {scenario.__doc__}")
            t0 = time.monotonic()
            try:
                scenario(server, scratch)
                print(f"   PASS {scenario.__name__} ({time.monotonic() - t0:.1f} s)")
                passed += 1
            except Exception as e:  # noqa: BLE001 - report every scenario
                failed.append(scenario.__name__)
                print(f"   FAIL {scenario.__name__}: {e}")
    finally:
        server.stop()
    if failed:
        print(f"FAILED: {', '.join(failed)} (server log: {scratch}/gangway.log)")
    # The plain closing line CI reads.
    print(f"{passed} passed, {len(failed)} failed")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
