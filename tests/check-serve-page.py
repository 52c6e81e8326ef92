#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/check-serve-page.py: stowage serve's page in a real browser.

Starts `stowage serve` on a free loopback port and headless Chromium, and
drives the page over the DevTools protocol (a websocket; this file speaks
it with the standard library alone): a question in the URL answers itself
on load; a second one is typed into the form and submitted with the Enter
key; a mistyped model is answered with its message beside the field; the
DeepSpeed config is downloaded; and the page is laid out at a phone's
width.  Every number the page shows is checked against the CLI's JSON for
the same question, and screenshots of the answers are kept in OUTDIR.
Exits 77 (skip) without Chromium.

    tests/check-serve-page.py STOWAGE OUTDIR
"""
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

TIMEOUT_S = 60


class WebSocket:
    """A client websocket (RFC 6455), text frames only: enough for CDP."""

    def __init__(self, url):
        assert url.startswith("ws://"), url
        hostport, path = url[len("ws://"):].split("/", 1)
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\n"
             "Upgrade: websocket\r\nConnection: Upgrade\r\n"
             f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
             ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket: closed during the handshake")
            head += chunk
        head, self.buf = head.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n")[0]
        if b" 101 " not in status:
            raise ConnectionError(f"websocket: {status!r}")

    def send(self, text):
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        head = bytearray([0x81])
        if n < 126:
            head.append(0x80 | n)
        elif n < 65536:
            head.append(0x80 | 126)
            head += struct.pack(">H", n)
        else:
            head.append(0x80 | 127)
            head += struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(bytes(head) + mask + masked)

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("websocket: closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._read(2)
            op, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if op == 0x8:
                raise ConnectionError("websocket: closed by the browser")
            if op in (0x9, 0xA):  # ping, pong
                continue
            message += payload
            if b0 & 0x80:
                return message.decode()


class Cdp:
    """Chrome DevTools Protocol calls on one page."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method,
                                 "params": params}))
        while True:
            m = json.loads(self.ws.recv())
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, what):
        end = time.monotonic() + TIMEOUT_S
        while time.monotonic() < end:
            if self.eval(expr):
                return
            time.sleep(0.05)
        raise TimeoutError(f"waited {TIMEOUT_S} s for {what}")

    def screenshot(self, path):
        png = base64.b64decode(self.call("Page.captureScreenshot",
                                         format="png")["data"])
        with open(path, "wb") as f:
            f.write(png)
        return len(png)

    def type_into(self, element_id, text):
        """Focus, select what is there, type over it: as a person would."""
        self.eval(f"(() => {{ const e = document.getElementById('{element_id}');"
                  f" e.focus(); e.select(); }})()")
        self.call("Input.insertText", text=text)

    def press_enter(self):
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter",
                      code="Enter", windowsVirtualKeyCode=13,
                      **({"text": "\r"} if kind == "keyDown" else {}))


failures = []


def check(ok, what):
    print(f"{'ok' if ok else 'FAIL'}: {what}")
    if not ok:
        failures.append(what)


def cli(stowage, *args):
    r = subprocess.run([stowage, *args], capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"stowage {' '.join(args)}: {r.stderr}")
    return r.stdout


def gib(n):
    return f"{n / 2**30:.2f} GiB"


READ_PAGE = """(() => {
  const t = (id) => document.getElementById(id);
  const rows = (id) => [...t(id).tBodies[0].rows];
  return {
    verdict: t('verdict').textContent,
    fits: t('verdict').dataset.fits,
    perGpuBytes: t('per-gpu').dataset.bytes,
    perGpuText: t('per-gpu').textContent,
    capacity: t('capacity').dataset.bytes,
    tokens: t('tokens').dataset.value,
    mfu: t('mfu').dataset.value,
    step: t('step').dataset.s,
    layout: t('layout').textContent,
    terms: rows('terms').map((r) => [r.cells[0].textContent,
                                     r.cells[1].dataset.bytes]),
    plans: rows('plans').map((r) => [r.cells[2] && r.cells[2].dataset.bytes,
                                     r.cells[5] && r.cells[5].dataset.value]),
    offloads: rows('offloads').length,
    chart: !!document.querySelector('#chart svg'),
    search: location.search,
  };
})()"""


def check_answer(cdp, stowage, args, what):
    """The page's numbers against the CLI's JSON for the same question."""
    page = cdp.eval(READ_PAGE)
    fit = json.loads(cli(stowage, "fit", *args, "--json"))
    plan = json.loads(cli(stowage, "plan", *args, "--json"))
    offl = json.loads(cli(stowage, "fit", *args, "--all-offloads", "--json"))
    dev = fit["device"]
    check(page["fits"] == ("true" if fit["fits"] else "false"),
          f"{what}: verdict {page['verdict']!r}")
    check(fit["model"]["name"] in page["verdict"]
          and fit["cluster"]["spec"] in page["verdict"],
          f"{what}: the verdict names the model and the GPUs")
    check(int(page["perGpuBytes"]) == dev["total_bytes"],
          f"{what}: per GPU {page['perGpuBytes']} B = the CLI's "
          f"{dev['total_bytes']}")
    check(page["perGpuText"] == gib(dev["total_bytes"]),
          f"{what}: per GPU shown as {page['perGpuText']}")
    check(int(page["capacity"]) == dev["capacity_bytes"],
          f"{what}: usable per GPU")
    if fit["fits"]:
        pred = fit["predicted"]
        check(float(page["tokens"]) == pred["tokens_per_s"],
              f"{what}: tokens/s {page['tokens']} = {pred['tokens_per_s']}")
        check(float(page["mfu"]) == pred["mfu"], f"{what}: MFU")
        check(float(page["step"]) == pred["step_time_s"], f"{what}: step time")
    stage = next(s for s in dev["stages"] if s["stage"] == dev["peak_stage"])
    want_terms = [[t["name"], str(t["bytes"])] for t in stage["terms"]]
    check(page["terms"] == want_terms,
          f"{what}: {len(page['terms'])} memory terms, each the CLI's bytes")
    want_plans = [[str(p["total_bytes"]), repr(float(p["tokens_per_s"]))]
                  for p in plan["plans"]]
    got_plans = [[b, repr(float(v))] for b, v in page["plans"]]
    check(got_plans == want_plans,
          f"{what}: {len(got_plans)} ranked layouts, bytes and tokens/s the "
          f"CLI's")
    check(page["offloads"] == len(offl["rows"]),
          f"{what}: {page['offloads']} rows of every ZeRO stage and offload")
    return page


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    stowage, outdir = os.path.abspath(sys.argv[1]), sys.argv[2]
    browser = (shutil.which("chromium") or shutil.which("chromium-browser")
               or shutil.which("google-chrome"))
    if browser is None:
        print("check-serve-page: no chromium on PATH; skipping", file=sys.stderr)
        sys.exit(77)
    os.makedirs(outdir, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="stow-chromium-")
    downloads = tempfile.mkdtemp(prefix="stow-downloads-")
    server = subprocess.Popen([stowage, "serve", "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    chrome = None
    t0 = time.monotonic()
    try:
        line = server.stdout.readline()
        url = next(w for w in line.split() if w.startswith("http://127.0.0.1:"))
        print(f"server: {line.strip()}")
        chrome = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu",
             "--hide-scrollbars", "--no-first-run", "--mute-audio",
             f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--window-size=1280,1600", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(profile, "DevToolsActivePort")
        end = time.monotonic() + TIMEOUT_S
        while not (os.path.exists(port_file)
                   and open(port_file).read().count("\n") >= 1):
            if time.monotonic() > end or chrome.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools server")
            time.sleep(0.05)
        port = int(open(port_file).read().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
            targets = json.load(r)
        page_ws = next(t["webSocketDebuggerUrl"] for t in targets
                       if t["type"] == "page")
        cdp = Cdp(WebSocket(page_ws))
        cdp.call("Page.enable")
        cdp.call("Browser.setDownloadBehavior", behavior="allow",
                 downloadPath=downloads)

        # 1. The question in the URL answers itself on load.
        question = "?model=llama-65b&gpus=8xA100-80GB"
        cdp.call("Page.navigate", url=url + question)
        cdp.wait("document.body && document.body.dataset.state === 'done'",
                 "the answer to " + question)
        page = check_answer(cdp, stowage, ["llama-65b", "--gpus", "8xA100-80GB"],
                            "from the URL")
        check(page["chart"], "the report's chart is on the page")
        shot = os.path.join(outdir, "serve-llama-65b-8xA100-80GB.png")
        size = cdp.screenshot(shot)
        check(size > 20000, f"screenshot {shot} ({size} B)")

        # 2. Typed into the form and submitted with Enter; the page says
        # what it waits for, and the question goes into the URL.
        cdp.eval("""(() => { window.sawStatus = [];
          const s = document.getElementById('status');
          new MutationObserver(() => { if (!s.hidden) window.sawStatus.push(
            document.getElementById('status-text').textContent); })
          .observe(s, {attributes: true, childList: true, subtree: true,
                       characterData: true}); })()""")
        cdp.type_into("f-model", "llama-7b")
        cdp.type_into("f-gpus", "8xH100-SXM")
        cdp.type_into("f-micro-batch", "2")
        cdp.press_enter()
        cdp.wait("document.body.dataset.state === 'done' && "
                 "document.getElementById('verdict').textContent"
                 ".includes('llama-7b')", "the typed question's answer")
        page = check_answer(cdp, stowage, ["llama-7b", "--gpus", "8xH100-SXM",
                                           "--micro-batch", "2"], "typed")
        check(page["search"] == "?model=llama-7b&gpus=8xH100-SXM&micro-batch=2",
              f"the URL holds the question: {page['search']}")
        saw = cdp.eval("window.sawStatus")
        check(any(t.startswith("Searching every layout of llama-7b on "
                               "8xH100-SXM") for t in saw)
              and any(t.startswith("Ranking the layouts") for t in saw),
              f"the waiting indicator said {saw[0]!r} ... {saw[-1]!r}")

        # 3. A config downloaded: the CLI's --emit bytes.
        cdp.eval("document.querySelector('button[data-emit=deepspeed]').click()")
        cdp.wait("document.getElementById('download-status').textContent"
                 ".startsWith('Saved')", "the download")
        name = cdp.eval("document.getElementById('download-status').textContent")
        path = os.path.join(downloads, "llama-7b-ds_config.json")
        end = time.monotonic() + TIMEOUT_S
        while not os.path.exists(path) and time.monotonic() < end:
            time.sleep(0.05)
        want = cli(stowage, "fit", "llama-7b", "--gpus", "8xH100-SXM",
                   "--micro-batch", "2", "--emit", "deepspeed")
        got = open(path).read() if os.path.exists(path) else None
        check(got == want, f"{name}: the CLI's --emit deepspeed, byte for byte")

        # 4. A mistyped model: the message, and the keyboard's focus on the
        # field at fault.
        cdp.type_into("f-model", "lama-65b")
        cdp.press_enter()
        cdp.wait("document.body.dataset.state === 'error'", "the error")
        err = cdp.eval("""(() => ({
          text: document.getElementById('error').textContent,
          focus: document.activeElement.id,
          invalid: document.getElementById('f-model')
                     .getAttribute('aria-invalid') }))()""")
        check("did you mean \"llama-65b\"" in err["text"],
              f"the error says {err['text']!r}")
        check(err["focus"] == "f-model" and err["invalid"] == "true",
              "the model field is marked and has the focus")

        # 5. A phone's width: one column, nothing wider than the screen
        # (tables scroll inside their own boxes).
        cdp.call("Emulation.setDeviceMetricsOverride", width=390, height=844,
                 deviceScaleFactor=1, mobile=True)
        cdp.call("Page.navigate", url=url + question)
        cdp.wait("document.body && document.body.dataset.state === 'done'",
                 "the answer at a phone's width")
        width = cdp.eval("document.documentElement.scrollWidth")
        check(width <= 390, f"at 390 px the page is {width} px wide")
        shot = os.path.join(outdir, "serve-phone.png")
        check(cdp.screenshot(shot) > 10000, f"screenshot {shot}")
    finally:
        if chrome is not None:
            chrome.terminate()
            chrome.wait(timeout=TIMEOUT_S)
        server.terminate()
        server.wait(timeout=TIMEOUT_S)
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(downloads, ignore_errors=True)
    check(server.returncode == 0, f"the server stopped cleanly ({server.returncode})")
    print(f"check-serve-page: {time.monotonic() - t0:.1f} s, "
          f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
