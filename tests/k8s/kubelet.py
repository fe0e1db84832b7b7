#!/usr/bin/env python3
"""Plays the kubelet's part for the Deployments in deploy/k8s/, with real processes on 127.0.0.1.

    python3 tests/k8s/kubelet.py

For each manifest it starts two "pods" from the manifest's own container spec (command, env with
`fieldRef: status.podIP` resolved to 127.0.0.1, the probes), a `gangway demo-client` consumer at
60 req/s, and then terminates one pod the way the kubelet does: the preStop exec hook (with the
container's environment, no shell), then SIGTERM to the container's main process, then SIGKILL to
the whole process tree once terminationGracePeriodSeconds ran out. It checks that nothing was lost,
that the steps came in order, and the grace-period arithmetic of the manifest.

What is replaced, since there is no cluster: the registry's Service name (by a `gangway server`
on loopback), the ports (free ones instead of 8080/9000), the application (python's http.server
for the `gangway run` manifest, `gangway demo-service` for the one that registers itself), and
`--on-drain` (by a command that leaves a mark). Needs PyYAML (scripts/test.sh's venv) and the
built binary (target/debug/gangway or $GANGWAY_BIN). Prints one line per check; exits 1 if one
failed.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
GANGWAY = os.environ.get("GANGWAY_BIN", os.path.join(TARGET, "debug", "gangway"))
DEPLOY = os.path.join(ROOT, "deploy", "k8s")
# The registry answers a drain at most this long after its timeout (crates/cli/src/api.rs).
DRAIN_GRACE_S = 10
# `gangway run` ends its drain step at most this long after --drain-timeout, whatever the
# registry does (DRAIN_ANSWER_SLACK, crates/cli/src/run/mod.rs).
RUN_DRAIN_SLACK_S = 1


class Failed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failed(msg)
    print(f"    ok {msg}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def seconds(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", text)
    if not m:
        raise ValueError(f"not a duration: {text}")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return value / 1000 if unit == "ms" else value * 60 if unit == "m" else value


def flag(command, name, default=None):
    return command[command.index(name) + 1] if name in command else default


def container_of(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


# Secrets the manifests name (secretKeyRef), as `kubectl create secret` would hold them: filled
# by Registry with the tokens it created.
SECRETS = {}


def pod_env(container, overrides):
    """The container's env as the kubelet builds it: values, status.podIP for a fieldRef, and
    the Secrets of SECRETS for a secretKeyRef."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANGWAY_")}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[e["name"]] = "127.0.0.1"
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            if (ref["name"], ref["key"]) not in SECRETS:
                raise Failed(f"env {e['name']}: no Secret {ref['name']} key {ref['key']}")
            env[e["name"]] = SECRETS[(ref["name"], ref["key"])]
        else:
            raise Failed(f"env {e['name']}: no value this test can resolve")
    env.update(overrides)
    return env


class Proc:
    """A process whose output lines are collected (with their arrival time) in the background."""

    def __init__(self, argv, env=None, lines_from="stdout", new_session=False):
        """`lines_from`: "stdout" (stderr merged into it), "stderr" (stdout discarded), or
        "stderr+stdout" (stderr lines; stdout kept in a pipe for `stdout.read()`)."""
        self.lines = []
        self.new_session = new_session
        out = {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL,
               "stderr+stdout": subprocess.PIPE}[lines_from]
        err = subprocess.STDOUT if lines_from == "stdout" else subprocess.PIPE
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            text=True, start_new_session=new_session,
        )
        stream = self.proc.stdout if lines_from == "stdout" else self.proc.stderr
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_line(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if pred(line):
                    return t, line
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise Failed(f"no expected line; last lines: {[l for _, l in self.lines][-10:]}")

    def events(self):
        out = []
        for t, line in list(self.lines):
            if line.startswith('{"event"'):
                out.append((t, json.loads(line)))
        return out

    def kill_tree(self):
        """SIGKILL to its process group (a "container") or to it alone, and to the process groups
        of the programs `gangway run` started (its `started` events): in a container they would
        die with its PID namespace; here they are groups of their own."""
        groups = [e["pid"] for _, e in self.events() if e["event"] == "started"]
        if self.new_session:
            groups.append(self.proc.pid)
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_until(pred, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def token_create(auth_file, role, namespace="public"):
    """`gangway auth token create`: the token, printed once."""
    done = subprocess.run([GANGWAY, "auth", "--file", auth_file, "token", "create", "--role", role,
                           "--namespace", namespace], capture_output=True, text=True, timeout=30,
                          check=True)
    return done.stdout.strip()


class Registry:
    """The registry as deploy/k8s/registry.yaml runs it: with --auth (its Secret gangway-auth),
    and the apps' token in the Secret gangway-token."""

    def __init__(self, scratch):
        auth_file = os.path.join(scratch, "auth.toml")
        self.admin = token_create(auth_file, "admin", "*")
        SECRETS[("gangway-token", "token")] = token_create(auth_file, "write")
        self.proc = Proc([GANGWAY, "server", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
                          "--data-dir", os.path.join(scratch, "data"), "--warmup", "0s",
                          "--log", "warn", "--auth", auth_file])
        _, line = self.proc.wait_line(lambda l: l.startswith("gangway server"))
        self.http = re.search(r"http=(\S+)", line).group(1)
        self.grpc = re.search(r"grpc=(\S+)", line).group(1)

    def instances(self, service):
        request = urllib.request.Request(f"http://{self.http}/v1/services/{service}/instances?all=true",
                                         headers={"Authorization": f"Bearer {self.admin}"})
        with urllib.request.urlopen(request) as r:
            return [f"{i['ip']}:{i['port']}" for i in json.loads(r.read())["instances"]]


def kubelet_terminate(pod_spec, container, proc, env):
    """preStop exec (if any), SIGTERM, SIGKILL after the grace period. Returns the step times."""
    grace = pod_spec.get("terminationGracePeriodSeconds", 30)
    start = time.monotonic()
    steps = {"start": start}
    hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    if hook:
        argv = [GANGWAY if a.endswith("/gangway") else a for a in hook]
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=grace)
            steps["prestop_exit"] = done.returncode
            steps["prestop_out"] = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            steps["prestop_exit"] = "timeout"
        steps["prestop_done"] = time.monotonic()
    steps["sigterm"] = time.monotonic()
    os.kill(proc.proc.pid, signal.SIGTERM)
    left = max(0.0, grace - (time.monotonic() - start))
    try:
        proc.proc.wait(left)
        steps["killed"] = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.proc.pid, signal.SIGKILL)
        proc.proc.wait()
        steps["killed"] = True
    steps["exited"] = time.monotonic()
    steps["exit_code"] = proc.proc.returncode
    # The container's other processes go with it.
    proc.kill_tree()
    return steps


def consumer(registry, service):
    c = Proc([GANGWAY, "demo-client", "--registry", registry.grpc, "--service", service,
              "--rate", "60", "--duration", "6s", "--min-instances", "2", "--json",
              "--no-retry", "--no-ejection"], lines_from="stderr+stdout",
             env={**os.environ, "GANGWAY_TOKEN": registry.admin})
    c.wait_line(lambda l: l.startswith("sending "))
    return c


def consumer_report(c):
    out = c.proc.stdout.read()
    c.proc.wait(30)
    return json.loads(out.strip())


def gangway_run_pod(registry, scratch, pod_spec, container, marks):
    """One pod of the `gangway run` manifest: its command with the app and ports replaced."""
    port, ready_port = free_port(), free_port()
    root = tempfile.mkdtemp(prefix="pod-", dir=scratch)
    for name in ("ping", "health"):
        with open(os.path.join(root, name), "w") as f:
            f.write("ok")
    command = list(container["command"])
    cut = command.index("--")
    wrapper = [GANGWAY if command[0] == "gangway" else command[0]] + command[1:cut]
    wrapper = [a.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for a in wrapper]
    wrapper[wrapper.index("--readiness-port") + 1] = str(ready_port)
    wrapper[wrapper.index("--on-drain") + 1] = f"echo on-drain >> {marks}"
    # HTTP/1.1 keep-alive: with HTTP/1.0's connection per request and a listen backlog of 5, a
    # loaded machine drops SYNs, and each costs a 1 s retransmission (a timeout of the stand-in).
    app = ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", root,
           "--protocol", "HTTP/1.1"]
    # The stand-in cuts off its in-flight requests at SIGTERM (the JVM app of the manifest
    # finishes them): give them a moment after the drain.
    wrapper += ["--linger", "500ms"]
    env = pod_env(container, {"GANGWAY_GRPC": registry.grpc, "GANGWAY_PORT": str(port)})
    # --json: the steps on stdout (merged with stderr here, as in a container's log).
    proc = Proc(wrapper + ["--json", "--"] + app, env=env, lines_from="stdout", new_session=True)
    probe = container["readinessProbe"]["httpGet"]
    ready_url = f"http://127.0.0.1:{ready_port}{probe['path']}"
    return proc, env, f"127.0.0.1:{port}", ready_url


def scenario_gangway_run(registry, scratch):
    """deploy/k8s/orders-gangway-run.yaml: gangway run as the entrypoint, readinessProbe on /ready."""
    pod_spec, container = container_of(os.path.join(DEPLOY, "orders-gangway-run.yaml"))
    command = container["command"]
    child_grace = seconds(flag(command, "--grace", "10s"))
    budget = (seconds(flag(command, "--drain-timeout", "30s")) + RUN_DRAIN_SLACK_S
              + seconds(flag(command, "--on-drain-timeout", "30s"))
              + seconds(flag(command, "--linger", "0s"))
              + child_grace)
    grace = pod_spec["terminationGracePeriodSeconds"]
    check(grace > budget, f"terminationGracePeriodSeconds {grace} > drain + {RUN_DRAIN_SLACK_S} s + on-drain + linger + grace = {budget:.0f} s")
    env_of = {e["name"]: e.get("value") for e in container.get("env", [])}
    app_stop = seconds(env_of.get("SPRING_LIFECYCLE_TIMEOUT_PER_SHUTDOWN_PHASE", "30s"))
    check(app_stop < child_grace, f"the program's own stop {app_stop:.0f} s < --grace {child_grace:.0f} s (no SIGKILL mid-shutdown)")
    check(pod_spec.get("enableServiceLinks") is False, "enableServiceLinks: false (no GANGWAY_PORT=tcp://...)")
    marks = os.path.join(scratch, "on-drain.marks")
    service = next(e["value"] for e in container["env"] if e["name"] == "GANGWAY_SERVICE")
    pods = []
    try:
        for _ in range(2):
            proc, env, addr, ready_url = gangway_run_pod(registry, scratch, pod_spec, container, marks)
            pods.append((proc, env, addr, ready_url))
            # The kubelet's readinessProbe: the pod is Ready once /ready says 200.
            check(wait_until(lambda: http_status(ready_url) == 200, 30),
                  f"readinessProbe {ready_url} says 200 (every subscriber acked {addr})")
        c = consumer(registry, service)
        time.sleep(1.5)  # load runs before the termination (workload timing)
        proc, env, addr, ready_url = pods[0]
        steps = kubelet_terminate(pod_spec, container, proc, env)
        report = consumer_report(c)
        took = steps["exited"] - steps["sigterm"]
        check(not steps["killed"], f"the pod stopped {took:.2f} s after SIGTERM, within its grace period {pod_spec['terminationGracePeriodSeconds']} s")
        check(steps["exit_code"] == 143, f"exit code 143 (the app's SIGTERM death, passed on): {steps['exit_code']}")
        names = [e["event"] for _, e in proc.events()]
        order = [names.index(n) for n in ("signal", "drained", "on-drain-done", "linger", "child-exited")]
        check(order == sorted(order), f"signal -> drained -> on-drain hook -> app stopped: {names}")
        drained = next(e for _, e in proc.events() if e["event"] == "drained")
        check(drained["complete"], f"drain complete after {drained['waited_ms']} ms")
        check(open(marks).read().strip() == "on-drain", "the --on-drain hook ran once")
        check(addr not in registry.instances(service), f"{addr} left the registry")
        check(report["failed"] == 0, f"consumer: 0 of {report['sent']} requests failed "
              f"(failures: {[r for r in report['requests'] if not r['ok']][:5]})")
    finally:
        for proc, *_ in pods:
            proc.kill_tree()


def scenario_prestop(registry, scratch):
    """deploy/k8s/orders-prestop.yaml: the app registers itself; `gangway offline --wait` in preStop."""
    pod_spec, container = container_of(os.path.join(DEPLOY, "orders-prestop.yaml"))
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    check(not any("$(" in a for a in hook), f"the preStop hook is a plain argv: {hook}")
    env_of = {e["name"]: e.get("value") for e in container["env"]}
    shutdown = seconds(env_of.get("SPRING_LIFECYCLE_TIMEOUT_PER_SHUTDOWN_PHASE", "30s"))
    budget = seconds(flag(hook, "--timeout", "30")) + DRAIN_GRACE_S + shutdown
    grace = pod_spec["terminationGracePeriodSeconds"]
    check(grace > budget, f"terminationGracePeriodSeconds {grace} > drain {flag(hook, '--timeout')} + answer {DRAIN_GRACE_S} s + shutdown {shutdown:.0f} s")
    service = env_of["GANGWAY_SERVICE"]
    pods = []
    try:
        for i in range(2):
            port = free_port()
            env = pod_env(container, {"GANGWAY_SERVER": registry.http, "GANGWAY_PORT": str(port),
                                      "GANGWAY_GRPC": registry.grpc})
            # The application: registers itself on a session as it starts (as a Nacos SDK would).
            app = Proc([GANGWAY, "demo-service", "--service", service, "--name", f"p{i}",
                        "--listen", f"127.0.0.1:{port}", "--delay", "50ms"],
                       env=env, new_session=True)
            app.wait_line(lambda l: l.startswith("ready "))
            pods.append((app, env, f"127.0.0.1:{port}"))
        c = consumer(registry, service)
        time.sleep(1.5)  # load runs before the termination (workload timing)
        app, env, addr = pods[0]
        steps = kubelet_terminate(pod_spec, container, app, env)
        report = consumer_report(c)
        check(steps["prestop_exit"] == 0, f"preStop `{' '.join(hook)}` exited 0 (drain complete): {steps['prestop_out'].strip()}")
        check(steps["prestop_done"] - steps["start"] < 5, f"preStop took {steps['prestop_done'] - steps['start']:.2f} s, not a fixed sleep")
        check(not steps["killed"], f"the app stopped {steps['exited'] - steps['sigterm']:.2f} s after SIGTERM, within the grace period")
        check(addr not in registry.instances(service), f"{addr} left the registry")
        check(report["failed"] == 0, f"consumer: 0 of {report['sent']} requests failed")
    finally:
        for app, *_ in pods:
            app.kill_tree()


SCENARIOS = [scenario_gangway_run, scenario_prestop]


def main():
    scratch = tempfile.mkdtemp(prefix="gangway-kubelet-")
    registry = Registry(scratch)
    failed, passed = [], 0
    try:
        for scenario in SCENARIOS:
            print(f"-- {scenario.__name__}: {scenario.__doc__}")
            t0 = time.monotonic()
            try:
                scenario(registry, scratch)
                passed += 1
                print(f"   PASS {scenario.__name__} ({time.monotonic() - t0:.1f} s)")
            except Exception as e:  # noqa: BLE001 - report every scenario
                failed.append(scenario.__name__)
                print(f"   FAIL {scenario.__name__}: {e}")
    finally:
        registry.proc.kill_tree()
    print(f"{passed} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
