"""Drives the published nacos-sdk-python (gRPC) against a running gangway server.

    python scenarios.py basic    HTTP_ADDR SERVICE
    python scenarios.py holder   HTTP_ADDR SERVICE IP PORT   # registers, prints READY, waits
    python scenarios.py consumer HTTP_ADDR SERVICE           # subscribes, prints each change
    python scenarios.py load     HTTP_ADDR SERVICE RATE SECS # GET /ping round robin over the pushed list
    python scenarios.py auth     HTTP_ADDR SERVICE           # username/password against --auth (users
                                                             # writer, reader: password = name + "-pw")

`basic` asserts and exits non-zero on the first failure; the others are steered by
tests/nacos/run.py (signals, timing). Everything printed is one line per event, flushed.
The SDK refuses to start without a non-loopback IPv4 address on the host (run.py/test.sh add
192.0.2.10/32 on lo when missing); it still talks only to HTTP_ADDR.
"""

import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request

from v2.nacos import (
    ClientConfigBuilder,
    DeregisterInstanceParam,
    GRPCConfig,
    ListInstanceParam,
    ListServiceParam,
    NacosNamingService,
    RegisterInstanceParam,
    SubscribeServiceParam,
    TLSConfig,
)

STEP_TIMEOUT = 15.0


def say(*parts):
    print(*parts, flush=True)


def fail(msg):
    say(f"FAIL python nacos-sdk: {msg}")
    sys.exit(1)


async def client(addr, namespace="", username=None, password=None, tls=None):
    scratch = os.environ.get("NACOS_SCRATCH") or tempfile.mkdtemp(prefix="nacos-py-")
    builder = ClientConfigBuilder()
    if username is not None:
        builder = builder.username(username).password(password)
    if tls is not None:
        builder = builder.tls_config(tls)
    cfg = (
        builder
        .server_address(addr)
        .namespace_id(namespace)
        .log_level("WARNING")
        .log_dir(os.path.join(scratch, "logs"))
        .cache_dir(os.path.join(scratch, f"cache-{os.getpid()}-{time.monotonic_ns()}"))
        .grpc_config(GRPCConfig(grpc_timeout=5000))
        .build()
    )
    return await NacosNamingService.create_naming_service(cfg)


def reg(service, ip, port, **kw):
    return RegisterInstanceParam(service_name=service, ip=ip, port=port, **kw)


async def addrs(ns, service):
    got = await ns.list_instances(
        ListInstanceParam(service_name=service, subscribe=False, healthy_only=None)
    )
    return sorted(f"{i.ip}:{i.port}" for i in got), got


async def until(pred, what, timeout=STEP_TIMEOUT):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await pred():
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    fail(f"timed out after {timeout}s waiting for {what}")


async def basic(addr, service):
    a = await client(addr)
    b = await client(addr)
    c = await client(addr)
    seen = []

    async def on_change(instances):
        seen.append(sorted(f"{i.ip}:{i.port}" for i in instances))

    # Subscribe before anything is cached: the SDK calls back only on a change of its cache.
    await c.subscribe(SubscribeServiceParam(service_name=service, subscribe_callback=on_change))
    ok = await a.register_instance(reg(service, "10.2.0.1", 8001, metadata={"v": "1"}))
    ok = ok and await b.register_instance(reg(service, "10.2.0.2", 8002))
    if not ok:
        fail("register_instance returned False")
    async def listed_both():
        got, _ = await addrs(c, service)
        return got == ["10.2.0.1:8001", "10.2.0.2:8002"]

    # list_instances answers from the subscription's cache, which the push refreshes.
    took = await until(listed_both, "both instances in list_instances")
    say(f"ok register two ephemeral instances (two clients), list shows both ({took * 1000:.0f} ms)")

    async def pushed_both():
        return any(s == ["10.2.0.1:8001", "10.2.0.2:8002"] for s in seen)

    await until(pushed_both, "the subscription's first list")
    t0 = time.monotonic()
    await b.deregister_instance(
        DeregisterInstanceParam(service_name=service, ip="10.2.0.2", port=8002)
    )

    async def pushed_one():
        return bool(seen) and seen[-1] == ["10.2.0.1:8001"]

    await until(pushed_one, "the push without the deregistered instance")
    say(f"ok subscriber pushed the deregistration ({(time.monotonic() - t0) * 1000:.0f} ms)")

    await a.update_instance(reg(service, "10.2.0.1", 8001, weight=3.0, metadata={"v": "2"}))

    async def updated():
        _, insts = await addrs(c, service)
        return len(insts) == 1 and insts[0].weight == 3.0 and insts[0].metadata.get("v") == "2"

    await until(updated, "weight 3 and metadata v=2")
    say("ok update_instance changed weight and metadata")

    persistent = service + "-persistent"
    await a.register_instance(reg(persistent, "10.2.0.9", 8009, ephemeral=False))
    async def listed_persistent():
        got, insts = await addrs(c, persistent)
        return got == ["10.2.0.9:8009"] and not insts[0].ephemeral

    await until(listed_persistent, "the persistent instance, ephemeral=false, in list_instances")
    say("ok persistent instance registered (ephemeral=false)")

    services = await c.list_services(ListServiceParam(page_size=100))
    if service not in services.services or persistent not in services.services:
        fail(f"list_services: {services}")
    say(f"ok list_services: count={services.count}")

    await a.deregister_instance(
        DeregisterInstanceParam(service_name=persistent, ip="10.2.0.9", port=8009, ephemeral=False)
    )
    def grpc_subscribers():
        url = f"http://{addr}/v1/services/{service}/subscribers"
        with urllib.request.urlopen(url, timeout=5) as r:
            subs = json.loads(r.read())["subscribers"]
        return [x for x in subs if x["client_name"].startswith("nacos-grpc")]

    if len(grpc_subscribers()) != 1:
        fail(f"subscribers before unsubscribe: {grpc_subscribers()}")
    await c.unsubscribe(SubscribeServiceParam(service_name=service, subscribe_callback=on_change))

    async def unsubscribed():
        return not grpc_subscribers()

    await until(unsubscribed, "the subscriber to leave gangway's table after unsubscribe")
    say("ok unsubscribe removes the subscriber from gangway's table")

    # Namespaces and groups are part of the service identity.
    e = await client(addr, namespace="dev")
    await e.register_instance(reg(service, "10.2.0.7", 8007, group_name="G1"))
    f = await client(addr, namespace="dev")
    got = await f.list_instances(
        ListInstanceParam(service_name=service, group_name="G1", subscribe=False, healthy_only=None)
    )
    if sorted(f"{i.ip}:{i.port}" for i in got) != ["10.2.0.7:8007"]:
        fail(f"namespace dev, group G1: {got}")
    got, _ = await addrs(c, service)
    if "10.2.0.7:8007" in got:
        fail(f"an instance of namespace dev / group G1 leaked into public / DEFAULT_GROUP: {got}")
    say("ok namespace dev / group G1 is a separate service")
    await e.shutdown()
    await f.shutdown()

    # The SDK ignores an empty list (update_cache_when_empty=False): ask a fresh client.
    d = await client(addr)
    got, _ = await addrs(d, persistent)
    if got:
        fail(f"persistent instance still listed after deregistration: {got}")
    say("ok persistent instance deregistered")
    for ns in (a, b, c, d):
        await ns.shutdown()
    say("PASS python nacos-sdk basic")


async def holder(addr, service, ip, port):
    ns = await client(addr)
    if not await ns.register_instance(reg(service, ip, int(port))):
        fail("register_instance returned False")
    say("READY")
    while True:
        await asyncio.sleep(3600)


async def consumer(addr, service):
    ns = await client(addr)

    async def on_change(instances):
        hosts = sorted(f"{i.ip}:{i.port}" for i in instances)
        say(json.dumps({"t": time.time(), "hosts": hosts}))

    await ns.subscribe(SubscribeServiceParam(service_name=service, subscribe_callback=on_change))
    say("READY")
    while True:
        await asyncio.sleep(3600)


async def load(addr, service, rate, secs):
    """A Nacos consumer with traffic: subscribes, waits for instances, then sends GET /ping open
    loop at RATE req/s for SECS seconds, round robin over the last pushed list, no retry; prints
    READY when it starts sending and one JSON summary at the end."""
    import concurrent.futures
    import urllib.error

    ns = await client(addr)
    current = []

    async def on_change(instances):
        current[:] = sorted(f"{i.ip}:{i.port}" for i in instances if i.enabled and i.healthy)

    await ns.subscribe(SubscribeServiceParam(service_name=service, subscribe_callback=on_change))
    await until(lambda: asyncio.sleep(0, result=bool(current)), "a first pushed list")

    def fetch(host):
        try:
            with urllib.request.urlopen(f"http://{host}/ping", timeout=1) as r:
                return host, r.status == 200, str(r.status)
        except urllib.error.HTTPError as e:
            return host, False, f"HTTP {e.code}"
        except OSError as e:
            return host, False, type(e).__name__

    rate, total = float(rate), int(float(rate) * float(secs))
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=32)
    say("READY")
    start = loop.time()
    pending = []
    for i in range(total):
        await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
        host = current[i % len(current)] if current else None
        if host is None:
            pending.append(asyncio.sleep(0, result=(None, False, "no instance")))
        else:
            pending.append(loop.run_in_executor(pool, fetch, host))
    results = await asyncio.gather(*pending)
    failures = [{"host": h, "error": e} for h, ok, e in results if not ok]
    say(json.dumps({"sent": len(results), "failed": len(failures), "failures": failures[:20]}))


async def record_pushes(ns, service):
    """Subscribes `ns` to `service` and keeps every pushed view; returns `pushed(want)`, which
    says whether a push held exactly the addresses `want` (sorted `ip:port`)."""
    seen = []

    async def on_change(instances):
        seen.append(sorted(f"{i.ip}:{i.port}" for i in instances))

    await ns.subscribe(SubscribeServiceParam(service_name=service, subscribe_callback=on_change))

    async def pushed(want):
        return any(s == want for s in seen)

    return pushed


async def auth(addr, service):
    """Against `gangway server --auth`: the SDK logs in with username/password
    (/nacos/v1/auth/users/login) and sends the accessToken on every gRPC request. A `write` user
    registers, a `read` user subscribes and sees the pushes but cannot register, a wrong password
    registers nothing."""
    writer = await client(addr, username="writer", password="writer-pw")
    reader = await client(addr, username="reader", password="reader-pw")
    pushed = await record_pushes(reader, service)
    if not await writer.register_instance(reg(service, "10.3.0.1", 8001)):
        fail("the write user's register_instance returned False")
    if not await writer.register_instance(reg(service + "-b", "10.3.0.2", 8002)):
        fail("the write user's second register_instance returned False")
    say("ok logged in as writer (username/password), registered")
    took = await until(lambda: pushed(["10.3.0.1:8001"]), "the push of the registration")
    say(f"ok logged in as reader, subscribed, pushed the registration ({took * 1000:.0f} ms)")
    await writer.deregister_instance(
        DeregisterInstanceParam(service_name=service, ip="10.3.0.1", port=8001)
    )
    await writer.register_instance(reg(service, "10.3.0.3", 8003))
    took = await until(lambda: pushed(["10.3.0.3:8003"]), "the push of the change")
    say(f"ok reader pushed the deregistration and the next registration ({took * 1000:.0f} ms)")

    def refused_register(ns, who):
        async def attempt():
            try:
                ok = await ns.register_instance(reg(service, "10.3.0.9", 8009))
            except Exception as e:  # noqa: BLE001 - the SDK raises NacosException
                return str(e)
            if ok:
                fail(f"{who} registered")
            return "register_instance returned False"
        return attempt()

    why = await refused_register(reader, "the read user")
    if "register" not in why:
        fail(f"the read user's refusal does not name the rule: {why}")
    say(f"ok the read user cannot register: {why[:160]}")
    try:
        wrong = await asyncio.wait_for(client(addr, username="writer", password="wrong"), STEP_TIMEOUT)
        why = await asyncio.wait_for(refused_register(wrong, "a wrong password"), STEP_TIMEOUT)
    except asyncio.TimeoutError:
        fail("a client with a wrong password neither registered nor failed")
    except Exception as e:  # noqa: BLE001 - refused while connecting is refused too
        why = f"{type(e).__name__}: {e}"
    say(f"ok a wrong password registers nothing: {why[:160]}")
    got, _ = await addrs(reader, service)
    if got != ["10.3.0.3:8003"]:
        fail(f"the refused registrations changed the list: {got}")
    for ns in (writer, reader):
        await ns.shutdown()
    say("PASS python nacos-sdk auth")


async def tls(addr, service, ca, cert, key):
    """Against `gangway server --tls-cert --tls-key --tls-client-ca --auth` at an https://
    address: the SDK's TLSConfig (CA, client certificate and key; its gRPC channel reads all
    three files) carries the login over HTTPS and the gRPC session. A provider registers, a
    consumer subscribes and is pushed the registration, then the change to another instance."""
    config = TLSConfig(enabled=True, ca_file=ca, cert_file=cert, key_file=key)
    # The login (`/nacos/v1/auth/users/login`) goes over HTTPS, the session over gRPC with TLS.
    provider = await client(addr, username="writer", password="writer-pw", tls=config)
    consumer = await client(addr, username="writer", password="writer-pw", tls=config)
    pushed = await record_pushes(consumer, service)
    if not await provider.register_instance(reg(service, "10.4.0.1", 8001)):
        fail("register_instance over TLS returned False")
    took = await until(lambda: pushed(["10.4.0.1:8001"]), "the push of the registration")
    say(f"ok registered over TLS, the subscriber was pushed it ({took * 1000:.0f} ms)")
    got, _ = await addrs(consumer, service)
    if got != ["10.4.0.1:8001"]:
        fail(f"list over TLS: {got}")
    await provider.deregister_instance(
        DeregisterInstanceParam(service_name=service, ip="10.4.0.1", port=8001)
    )
    await provider.register_instance(reg(service, "10.4.0.2", 8002))
    took = await until(lambda: pushed(["10.4.0.2:8002"]), "the push of the change")
    say(f"ok deregistered and registered another, the subscriber was pushed it ({took * 1000:.0f} ms)")
    for ns in (provider, consumer):
        await ns.shutdown()
    say("PASS python nacos-sdk tls")


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    run = {
        "basic": basic, "holder": holder, "consumer": consumer, "load": load, "auth": auth, "tls": tls,
    }[mode]
    asyncio.run(asyncio.wait_for(run(*args), None if mode not in ("basic", "auth", "tls") else 120))


if __name__ == "__main__":
    main()
