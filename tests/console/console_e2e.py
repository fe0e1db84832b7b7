#!/usr/bin/env python3
"""The web console end to end in headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by PyPI `selenium`), against a real `gangway server --auth FILE` that
crates/cli/tests/console.rs started and filled.

It signs in, reads the service list and its counts, opens a service, takes one instance
offline, drains another while a poller it controls lags (the drain is seen waiting for it,
then complete once the poller fetches), tries to drain the last serving instance of another
service and sees the API's refusal, and signs out. Screenshots go to SHOTS_DIR. The last line of
standard output is a JSON summary; the exit status is 0 only when every step passed.

Configuration: one JSON object in the environment variable CONSOLE_E2E (see the Rust test).
"""

import json
import os
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CFG = json.loads(os.environ["CONSOLE_E2E"])
URL = CFG["url"]
SHOTS = CFG["shots_dir"]
WAIT_S = 15

steps = []
shots = []
started = time.monotonic()


def step(name, **facts):
    facts["at_ms"] = int((time.monotonic() - started) * 1000)
    steps.append({"step": name, **facts})
    print(f"step {name} {json.dumps(facts)}", flush=True)


def shot(driver, name):
    path = os.path.join(SHOTS, f"{name}.png")
    driver.save_screenshot(path)
    shots.append(path)


def poll_as_subscriber():
    """One fetch of the consumer view as the poller `lagging-web`: it acks what it fetched."""
    req = urllib.request.Request(
        f"{URL}/v1/services/{CFG['service']}/instances?subscriber=lagging-web",
        headers={"Authorization": f"Bearer {CFG['poller_token']}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)["revision"]


def css(driver, selector):
    return driver.find_elements(By.CSS_SELECTOR, selector)


# The page renders again on every live update, so an element found a moment ago may be gone:
# every wait looks its elements up again, and a stale one only means "look again".
IGNORED = [StaleElementReferenceException]


def wait_until(driver, condition, what):
    try:
        return WebDriverWait(driver, WAIT_S, ignored_exceptions=IGNORED).until(
            lambda d: condition(d)
        )
    except TimeoutException:
        raise AssertionError(f"{what}: not within {WAIT_S} s")


def wait_css(driver, selector, what):
    """Waits until `selector` matches a visible element; returns its text."""

    def shown(d):
        found = [e for e in css(d, selector) if e.is_displayed()]
        return found[0].text if found else False

    return wait_until(driver, shown, f"{what} ({selector})")


def wait_text(driver, selector, needle, what):
    """Waits until an element matching `selector` shows `needle`; returns its text."""

    def shows(d):
        texts = [e.text for e in css(d, selector)]
        return next((t for t in texts if needle in t), False)

    return wait_until(driver, shows, f"{what}: {needle!r} in {selector}")


def wait_attr(driver, selector, attr, value, what):
    wait_until(
        driver,
        lambda d: any(e.get_attribute(attr) == value for e in css(d, selector)),
        f"{what}: {selector} with {attr}={value!r}",
    )


def click(driver, selector, what):
    """Clicks the first element matching `selector`, looking it up again if it went stale."""

    def clicked(d):
        found = [e for e in css(d, selector) if e.is_displayed() and e.is_enabled()]
        if not found:
            return False
        found[0].click()
        return True

    wait_until(driver, clicked, f"{what} ({selector})")


def row(driver, table, addr):
    return f'#{table} tr[data-addr="{addr}"]'


def confirm(driver, row_selector, action):
    """Clicks the row's button for `action`; returns the confirmation dialog's text (the
    dialog is modal: the page behind it renders on, the dialog stays)."""
    click(driver, f'{row_selector} button[data-action="{action}"]', f"{action} button")
    return wait_css(driver, "#confirm", "confirmation dialog")


def confirm_ok(driver):
    driver.find_element(By.ID, "confirm-ok").click()


def toast_with(driver, needle, kind):
    return wait_text(driver, f".toast.{kind} .toast-text", needle, f"a {kind} toast")


def dismiss_toasts(driver):
    """Closes the toasts shown so far (so that the next screenshot shows what follows)."""

    def closed(d):
        for close in css(d, ".toast .toast-close"):
            close.click()
        return not css(d, ".toast")

    wait_until(driver, closed, "toasts dismissed")


def run(driver):
    driver.get(f"{URL}/ui")
    wait_css(driver, "#login-form", "login form")
    shot(driver, "01-login")
    step("login-form")

    # A wrong password first: the page says so and stays on the form.
    driver.find_element(By.ID, "username").send_keys(CFG["user"])
    driver.find_element(By.ID, "password").send_keys("not-the-password")
    driver.find_element(By.ID, "login-button").click()
    err = wait_css(driver, "#login-error", "login error")
    assert "Wrong user name or password" in err, err
    driver.find_element(By.ID, "password").clear()
    driver.find_element(By.ID, "password").send_keys(CFG["password"])
    driver.find_element(By.ID, "login-button").click()
    step("logged-in", refused_first=err)

    # The service list with its counts.
    svc = f'#services-table tr[data-service="{CFG["service"]}"]'
    svc_text = wait_text(driver, svc, f"{CFG['serving']} serving", "service row")
    who = wait_text(driver, "#who", CFG["user"], "who is signed in")
    live = wait_text(driver, "#live", "live", "live updates")
    names = wait_until(
        driver,
        lambda d: [r.get_attribute("data-service") for r in css(d, "#services-table tbody tr")],
        "service rows",
    )
    for name in CFG["services"]:
        assert name in names, (name, names)
    step("services-listed", services=names, row=svc_text.replace("\n", " | "), who=who, live=live)
    shot(driver, "02-services")

    # One service: its instances and subscribers.
    click(driver, svc, "service row")
    wait_until(driver, lambda d: len(css(d, "#instances-table tbody tr")) == CFG["instances"], "instance rows")
    subs = wait_text(driver, "#subscribers-table", "lagging-web", "subscribers table")
    first = wait_text(driver, "#instances-table tbody tr", "session", "a session-kept instance")
    step("service-opened", instances=CFG["instances"], first_row=first.replace("\n", " | "), subscribers=subs.replace("\n", " | "))

    # Offline one instance: confirmation, then its row says offline.
    off = row(driver, "instances-table", CFG["offline_addr"])
    text = confirm(driver, off, "offline")
    assert CFG["offline_addr"] in text and "offline" in text, text
    confirm_ok(driver)
    wait_attr(driver, off, "data-state", "offline", "offline row")
    toast_with(driver, "is offline", "ok")
    dismiss_toasts(driver)
    step("offlined", addr=CFG["offline_addr"], dialog=text.replace("\n", " | "))

    # Drain another while the poller lags: the drain waits for it...
    poll_as_subscriber()
    drain = row(driver, "instances-table", CFG["drain_addr"])
    text = confirm(driver, drain, "drain")
    assert "Drain" in text and CFG["drain_addr"] in text, text
    clicked = time.monotonic()
    confirm_ok(driver)
    waiting = f'.drain[data-state="waiting"][data-addr="{CFG["drain_addr"]}"]'
    progress = wait_text(driver, waiting, "lagging-web", "drain waiting for the poller")
    shot(driver, "03-drain-waiting")
    step("drain-waiting", progress=progress.replace("\n", " | "), dialog=text.replace("\n", " | "))
    # ... and completes once it fetches the revision without the instance.
    poll_as_subscriber()
    complete = f'.drain[data-state="complete"][data-addr="{CFG["drain_addr"]}"]'
    done = wait_css(driver, complete, "drain complete")
    report = toast_with(driver, "complete", "ok")
    took = int((time.monotonic() - clicked) * 1000)
    wait_attr(driver, drain, "data-state", "offline", "drained row offline")
    shot(driver, "04-drain-complete")
    step("drain-complete", progress=done.replace("\n", " | "), toast=report, click_to_complete_ms=took)

    # The last serving instance of another service: refused, with the API's message.
    dismiss_toasts(driver)
    driver.get(f"{URL}/ui#/public/DEFAULT_GROUP/{CFG['last_service']}")
    last = row(driver, "instances-table", CFG["last_addr"])
    wait_css(driver, last, "last instance row")
    confirm(driver, last, "drain")
    confirm_ok(driver)
    refusal = toast_with(driver, "last serving instance", "error")
    assert "409" in refusal and "refused" in refusal, refusal
    wait_attr(driver, last, "data-state", "serving", "still serving")
    shot(driver, "05-refused")
    step("refused", toast=refusal)

    # Sign out: back to the form, and the cookie no longer works.
    click(driver, "#logout", "sign-out button")
    wait_css(driver, "#login-form", "login form after sign-out")
    status = driver.execute_async_script(
        "const done = arguments[0]; fetch('/v1/services').then(r => done(r.status));"
    )
    assert status == 401, status
    step("signed-out", api_status_after=status)


def main():
    options = webdriver.ChromeOptions()
    options.binary_location = CFG["chromium"]
    for arg in [
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1366,768",
        "--no-first-run",
        "--disable-extensions",
    ]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CFG["chromedriver"]), options=options)
    ok = False
    error = None
    try:
        run(driver)
        ok = True
    except Exception as e:  # noqa: BLE001 - reported in the summary, with a screenshot
        error = f"{type(e).__name__}: {e}"
        shot(driver, "failure")
        print(f"FAILED: {error}", file=sys.stderr, flush=True)
        for entry in driver.get_log("browser"):
            print(f"browser console: {entry}", file=sys.stderr, flush=True)
    finally:
        driver.quit()
    print(json.dumps({"ok": ok, "error": error, "steps": steps, "shots": shots}), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
