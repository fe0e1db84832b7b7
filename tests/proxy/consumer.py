#!/usr/bin/env python3
"""A consumer that knows nothing of gangway: the Python standard library (urllib) sending
GET http://SERVICE/ping through `gangway proxy` as its HTTP proxy, open loop at a fixed rate.

Prints `sending N requests` on stderr when it starts, then one JSON summary on stdout:
{"sent", "failed", "requests": [{"i", "sent_ms", "ok", "status", "instance", "attempts",
"error"}]}. Exit status 0 when nothing failed, 1 otherwise. Used by
crates/cli/tests/e2e_proxy.rs; no package outside the standard library.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--proxy", required=True, help="the proxy's HOST:PORT")
    p.add_argument("--service", required=True)
    p.add_argument("--rate", type=float, default=60.0, help="requests per second")
    p.add_argument("--duration", type=float, default=4.0, help="seconds of load")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per request")
    args = p.parse_args()

    # The proxy as http_proxy, exactly as an application would be configured.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": f"http://{args.proxy}"})
    )
    total = int(args.rate * args.duration)
    results = [None] * total
    start = time.monotonic()

    def one(i):
        sent = time.monotonic()
        row = {"i": i, "sent_ms": round((sent - start) * 1000.0, 1), "ok": False,
               "status": None, "instance": None, "attempts": None, "error": None}
        try:
            with opener.open(f"http://{args.service}/ping", timeout=args.timeout) as r:
                body = json.loads(r.read())
                row.update(ok=r.status == 200, status=r.status, instance=body.get("instance"),
                           attempts=int(r.headers.get("x-gangway-attempts", "0")))
        except urllib.error.HTTPError as e:
            row.update(status=e.code, error=e.headers.get("x-gangway-error") or f"HTTP {e.code}")
            try:
                row["instance"] = json.loads(e.read()).get("instance")
            except ValueError:
                pass
        except Exception as e:  # connection refused, reset, timeout: the proxy failed us
            row["error"] = f"{type(e).__name__}: {e}"
        results[i] = row

    print(f"sending {total} requests at {args.rate:g}/s", file=sys.stderr, flush=True)
    # Open loop: request i leaves at start + i/rate whatever the others are doing.
    with ThreadPoolExecutor(max_workers=128) as pool:
        for i in range(total):
            delay = start + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, i)
    failed = sum(1 for r in results if not r["ok"])
    json.dump({"sent": total, "failed": failed, "requests": results}, sys.stdout)
    print()
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
