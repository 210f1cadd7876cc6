#!/usr/bin/env python3
"""Checks inprof's flame graph page (src/report/flamegraph.html) in headless
Chromium, driven over the DevTools protocol on a pipe: it hovers, clicks and
types with real input events and reads back the drawn frames.

    browser_check.py known PAGE.html [--screenshot OUT.png]
    browser_check.py diff  PAGE.html [--screenshot OUT.png]
    browser_check.py large PAGE.html [--screenshot OUT.png]
    browser_check.py empty PAGE.html         (a profile with no samples)
    browser_check.py escape PAGE.html        (names with <, &, quotes)
    browser_check.py make-page TEMPLATE.html OUT.html (known|diff|large|empty|escape)

known: the known profile of tests/report/data/known.textpb; diff: its
flame graph against base.textpb (Multiply at 300 ms); large: 100,000
distinct stacks (render times are printed, not asserted). make-page writes
such a page itself from the template, for development.

Prints one line per check ("ok: ..." or "FAIL: ..."); exits 0 only when all
passed. Python 3 standard library only. The browser is $INPROF_CHROMIUM, or
the first of chromium, chromium-browser, google-chrome on $PATH."""

import argparse
import base64
import collections
import fcntl
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

PLACEHOLDER = "/*INPROF_DATA*/null"
TITLE_PLACEHOLDER = "INPROF_TITLE"
MS = 1000000  # nanoseconds
TOLERANCE = 1.5  # percentage points

# ---------------------------------------------------------------------------
# Pages for development (the real test writes them with `inprof flamegraph`).


class DataBuilder:
    """The page's data: node, frame, thread and label tables shared by the
    profile and its base."""

    def __init__(self, label_keys=()):
        self.frames, self.frame_index = [], {}
        self.nodes, self.node_index = [], {}
        self.threads, self.thread_index = [], {}
        self.label_keys = list(label_keys)
        self.label_values = [[] for _ in self.label_keys]

    def _frame(self, name):
        i = self.frame_index.get(name)
        if i is None:
            i = self.frame_index[name] = len(self.frames)
            self.frames.append(name)
        return i

    def node(self, stack):
        node = -1
        for name in stack:
            key = (node, self._frame(name))
            n = self.node_index.get(key)
            if n is None:
                n = self.node_index[key] = len(self.nodes) // 2
                self.nodes += key
            node = n
        return node

    def sample(self, stack, thread, labels, values):
        t = -1
        if thread is not None:
            t = self.thread_index.setdefault(thread, len(self.threads))
            if t == len(self.threads):
                self.threads.append(thread)
        lv = []
        for k, key in enumerate(self.label_keys):
            v = labels.get(key)
            if v is None:
                lv.append(-1)
            else:
                if v not in self.label_values[k]:
                    self.label_values[k].append(v)
                lv.append(self.label_values[k].index(v))
        return [self.node(stack), t, lv, list(values)]

    def data(self, title, sample_types, samples, base=None, comments=(), default_type=0):
        return {
            "version": 1,
            "title": title,
            "sampleTypes": [{"type": t, "unit": u} for t, u in sample_types],
            "defaultType": default_type,
            "frames": self.frames,
            "nodes": self.nodes,
            "threads": self.threads,
            "labels": [{"key": k, "values": v}
                       for k, v in zip(self.label_keys, self.label_values)],
            "samples": samples,
            "base": base,
            "comments": list(comments),
        }


TIME_TYPES = [("cpu-time", "nanoseconds"), ("wall-time", "nanoseconds")]
COMMENT = "samples taken=3 recorded=3 dropped=0 (ring full)"


def known_samples(b, multiply_ms):
    # Added in an order unlike the stacks' (the page must not depend on it).
    return [
        b.sample(["WorkerLoop", "ReadInput"], "worker", {}, [200 * MS, 1000 * MS]),
        b.sample(["main", "Compute", "Add"], "main", {"endpoint": "/b"}, [200 * MS, 200 * MS]),
        b.sample(["main", "Compute", "Multiply"], "main", {"endpoint": "/a"},
                 [multiply_ms * MS, multiply_ms * MS]),
    ]


def page_data(kind):
    if kind == "known":
        b = DataBuilder(["endpoint"])
        return b.data("known.pb", TIME_TYPES, known_samples(b, 600), comments=[COMMENT]), \
            "inprof: known.pb"
    if kind == "diff":
        b = DataBuilder(["endpoint"])
        base = known_samples(b, 300)
        new = known_samples(b, 600)
        return b.data("known.pb", TIME_TYPES, new, base={"title": "base.pb", "samples": base},
                      comments=[COMMENT]), "inprof diff: base.pb -> known.pb"
    if kind == "empty":
        b = DataBuilder()
        return b.data("empty.pb", TIME_TYPES, []), "inprof: empty.pb"
    if kind == "escape":
        b = DataBuilder(["k<&>"])
        samples = [
            b.sample(["main", "<img src=x onerror=alert(1)>"], "t<1>", {"k<&>": "v\"'&"},
                     [5 * MS, 5 * MS]),
            b.sample(["main", "a&b \"dq\" 'sq'", "</script><b>bold</b>"], None, {},
                     [3 * MS, 3 * MS]),
            b.sample(["main", "operator<<(std::ostream&, T const&)"], "t<1>", {},
                     [2 * MS, 2 * MS]),
        ]
        return b.data("<esc> & \"title\"", TIME_TYPES, samples), 'inprof: <esc> & "title"'
    if kind == "large":
        return large_data(), "inprof: large.pb"
    raise SystemExit("unknown page kind %r" % kind)


def large_data(n=100000):
    """n distinct stacks 20 to 40 deep: a few wide levels at the root, then
    paths through 5,000 function names; fixed seed."""
    rng = random.Random(4242)
    kinds = ["Parse", "Encode", "Lookup", "Hash", "Sort", "Read", "Write", "Alloc"]
    functions = ["Fn%04d_%s" % (i, rng.choice(kinds)) for i in range(5000)]
    roots = ["main"] + ["Handler%02d" % i for i in range(30)]
    threads = ["worker-%d" % i for i in range(8)]
    b = DataBuilder()
    samples, seen = [], set()
    while len(samples) < n:
        depth = rng.randint(20, 40)
        stack = [rng.choice(roots)] + [functions[rng.randrange(40)] for _ in range(3)]
        stack += [functions[rng.randrange(len(functions))] for _ in range(depth - 4)]
        key = tuple(stack)
        if key in seen:
            continue
        seen.add(key)
        cpu = rng.randint(1, 50) * MS
        samples.append(b.sample(stack, rng.choice(threads), {},
                                [cpu, cpu + rng.randint(0, 20) * MS]))
    return b.data("large.pb", TIME_TYPES, samples, comments=["%d distinct stacks" % n])


def html_escape(s):
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def fill_template(template, data, title):
    if template.count(PLACEHOLDER) != 1:
        raise SystemExit("the template must hold %s exactly once" % PLACEHOLDER)
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    # Safe inside <script>: these only occur within JSON strings.
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    subs = {PLACEHOLDER: text, TITLE_PLACEHOLDER: html_escape(title)}
    return re.sub(re.escape(PLACEHOLDER) + "|" + TITLE_PLACEHOLDER,
                  lambda m: subs[m.group(0)], template)


def make_page(template_path, out_path, kind):
    with open(template_path, encoding="utf-8") as f:
        template = f.read()
    data, title = page_data(kind)
    page = fill_template(template, data, title)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(page)
    print("wrote %s (%s, %d bytes)" % (out_path, kind, len(page.encode("utf-8"))))


# ---------------------------------------------------------------------------
# PNG decoding (8-bit RGB or RGBA, not interlaced), for the screenshot check.


def png_pixels(png):
    """Returns (width, height, bytes per pixel, rows of raw pixel bytes)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, ihdr = 8, [], None
    while pos + 8 <= len(png):
        length, ctype = struct.unpack(">I4s", png[pos:pos + 8])
        chunk = png[pos + 8:pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif ctype == b"IDAT":
            idat.append(chunk)
        elif ctype == b"IEND":
            break
    if ihdr is None:
        raise ValueError("no IHDR")
    width, height, depth, color, _, _, interlace = ihdr
    if depth != 8 or color not in (2, 6) or interlace != 0:
        raise ValueError("unsupported PNG: depth %d color type %d interlace %d" %
                         (depth, color, interlace))
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    if len(raw) < height * (stride + 1):
        raise ValueError("PNG data too short")
    prev = bytearray(stride)
    rows = []
    i = 0
    for _ in range(height):
        ftype = raw[i]
        line = bytearray(raw[i + 1:i + 1 + stride])
        i += stride + 1
        if ftype == 0:
            pass
        elif ftype == 1:  # Sub
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 0xFF
        elif ftype == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif ftype == 3:  # Average
            for x in range(stride):
                left = line[x - bpp] if x >= bpp else 0
                line[x] = (line[x] + ((left + prev[x]) >> 1)) & 0xFF
        elif ftype == 4:  # Paeth
            for x in range(stride):
                a = line[x - bpp] if x >= bpp else 0
                b = prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 0xFF
        else:
            raise ValueError("bad PNG filter type %d" % ftype)
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def screenshot_stats(png):
    """(width, height, distinct colors, share of pixels unlike the commonest)."""
    width, height, bpp, rows = png_pixels(png)
    counts = collections.Counter()
    for row in rows:
        counts.update(row[x:x + 3] for x in range(0, len(row), bpp))
    total = width * height
    common = counts.most_common(1)[0][1] if counts else 0
    return width, height, len(counts), (total - common) / total if total else 0.0


# ---------------------------------------------------------------------------
# The browser.


class CheckError(Exception):
    """Ends the run: the remaining checks cannot go on."""


class Timeout(CheckError):
    pass


def find_chromium():
    env = os.environ.get("INPROF_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Chromium with --remote-debugging-pipe: commands go to its fd 3,
    replies and events come from its fd 4, NUL-terminated JSON each."""

    def __init__(self, exe, width=1200, height=800):
        self.tmp = tempfile.mkdtemp(prefix="inprof-browser-check-")
        self.proc = None
        self.buf = b""
        self.next_id = 0
        self.replies = {}
        self.exceptions = []     # uncaught page exceptions
        self.errors = []         # console errors, error log entries
        self.requests = []       # URLs the page requested
        self.crashed = None
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # The child's ends, kept away from 3 and 4 until the child moves them there.
        child_in = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)

        def in_child():
            os.setsid()  # its own process group: all of it is killed at the end
            os.dup2(child_in, 3)   # dup2 leaves 3 and 4 inheritable
            os.dup2(child_out, 4)

        self.log_path = os.path.join(self.tmp, "chromium.log")
        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--remote-debugging-pipe", "--user-data-dir=" + os.path.join(self.tmp, "profile"),
                "--window-size=%d,%d" % (width, height), "--no-first-run",
                "--no-default-browser-check", "--disable-dev-shm-usage",
                "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--mute-audio",
                "--hide-scrollbars", "--force-color-profile=srgb", "about:blank"]
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, close_fds=False,
                                             preexec_fn=in_child)
        finally:
            os.close(child_in)
            os.close(child_out)

    # -- transport ------------------------------------------------------------
    def send(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            try:
                n = os.write(self.to_browser, data)
            except BrokenPipeError:
                raise CheckError("the browser exited (%s)" % self.exit_note())
            data = data[n:]
        return self.next_id

    def pump(self, timeout):
        """Reads what the browser wrote within `timeout` seconds."""
        ready, _, _ = select.select([self.from_browser], [], [], max(0.0, timeout))
        if not ready:
            return
        chunk = os.read(self.from_browser, 1 << 20)
        if not chunk:
            raise CheckError("the browser exited (%s)" % self.exit_note())
        self.buf += chunk
        while b"\0" in self.buf:
            raw, self.buf = self.buf.split(b"\0", 1)
            self.dispatch(json.loads(raw.decode("utf-8", "replace")))

    def dispatch(self, msg):
        if "id" in msg:
            self.replies[msg["id"]] = msg
            return
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            text = (d.get("exception") or {}).get("description") or d.get("text", "")
            self.exceptions.append("%s (line %s)" % (text, d.get("lineNumber")))
        elif method == "Runtime.consoleAPICalled":
            if params.get("type") in ("error", "assert"):
                args = [a.get("value", a.get("description", "")) for a in params.get("args", [])]
                self.errors.append("console.%s: %s" % (params["type"],
                                                       " ".join(str(a) for a in args)))
        elif method == "Log.entryAdded":
            e = params.get("entry", {})
            if e.get("level") == "error":
                self.errors.append("log: %s %s" % (e.get("text", ""), e.get("url", "")))
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))
        elif method in ("Inspector.targetCrashed", "Target.targetCrashed"):
            self.crashed = method
        elif method == "Target.detachedFromTarget":
            self.crashed = self.crashed or "detached from the page"

    def call(self, method, params=None, session=None, timeout=30.0):
        i = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while i not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout("no reply to %s within %.0f s" % (method, timeout))
            if self.crashed:
                raise CheckError("the page crashed (%s)" % self.crashed)
            self.pump(left)
        reply = self.replies.pop(i)
        if "error" in reply:
            raise CheckError("%s failed: %s" % (method, reply["error"].get("message")))
        return reply.get("result", {})

    def exit_note(self):
        code = self.proc.poll() if self.proc else None
        tail = ""
        try:
            with open(self.log_path, "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
        except OSError:
            pass
        return "exit status %s; its log ends: %s" % (code, tail.strip() or "(empty)")

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.send("Browser.close")
                self.proc.wait(timeout=5)
            except Exception:  # pylint: disable=broad-except
                pass
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own group (setsid)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for fd in (self.to_browser, self.from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


class Page:
    """One tab, attached with flatten: true."""

    def __init__(self, browser, width=1200, height=800):
        self.b = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call("Target.attachToTarget",
                                    {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Page", "Log", "Network"):
            self.call(domain + ".enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self.url = None

    def call(self, method, params=None, timeout=30.0):
        return self.b.call(method, params, self.session, timeout)

    def eval(self, expr, timeout=30.0):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True}, timeout)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CheckError("evaluating %r: %s" % (
                expr[:80], (d.get("exception") or {}).get("description") or d.get("text")))
        return r.get("result", {}).get("value")

    def navigate(self, path):
        self.url = "file://" + os.path.abspath(path)
        r = self.call("Page.navigate", {"url": self.url}, timeout=60)
        if r.get("errorText"):
            raise CheckError("navigating to %s: %s" % (self.url, r["errorText"]))

    def wait_for(self, expr, timeout=10.0, what=None):
        """Polls `expr` until it is truthy; returns its value, or raises."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                v = self.eval(expr, timeout=max(left, 5.0))
            except Timeout:
                raise
            except CheckError:
                v = None  # e.g. between documents while navigating
            if v:
                return v
            if self.b.exceptions:
                raise CheckError("uncaught exception while waiting for %s" % (what or expr))
            if left <= 0:
                raise Timeout("waited %.0f s for %s" % (timeout, what or expr))
            self.b.pump(min(0.1, max(left, 0)))

    # -- real input -------------------------------------------------------------
    def mouse(self, kind, x, y, **extra):
        params = {"type": kind, "x": x, "y": y}
        params.update(extra)
        self.call("Input.dispatchMouseEvent", params)

    def hover_at(self, x, y):
        self.mouse("mouseMoved", x, y, button="none")

    def click_at(self, x, y):
        self.mouse("mouseMoved", x, y, button="none")
        self.mouse("mousePressed", x, y, button="left", buttons=1, clickCount=1)
        self.mouse("mouseReleased", x, y, button="left", buttons=0, clickCount=1)

    def center(self, js_element):
        """The viewport center of the element `js_element` evaluates to."""
        c = self.eval("(() => { const e = %s; if (!e) return null;"
                      " e.scrollIntoView({block: 'center', inline: 'nearest'});"
                      " const r = e.getBoundingClientRect();"
                      " return [r.left + r.width / 2, r.top + r.height / 2]; })()" % js_element)
        if not c:
            raise CheckError("no element for %s" % js_element)
        return c

    def type_text(self, text):
        self.call("Input.insertText", {"text": text})


HELPERS = r"""
window.__ck = {
  frames() { return Array.from(document.querySelectorAll('#chart .frame')); },
  frame(name) { return this.frames().find((e) => e.dataset.name === name) || null; },
  // Width of each drawn name's first frame, in % of the `all` frame's width.
  widths() {
    const all = this.frame('all');
    if (!all) return null;
    const W = all.getBoundingClientRect().width, out = {};
    for (const e of this.frames()) {
      const n = e.dataset.name;
      if (!(n in out)) out[n] = e.getBoundingClientRect().width / W * 100;
    }
    out['#chart'] = document.getElementById('chart').getBoundingClientRect().width / W * 100;
    return out;
  },
  setSelect(id, value) {
    const s = document.getElementById(id);
    s.value = value;
    if (s.value !== value) return false;
    s.dispatchEvent(new Event('change', {bubbles: true}));
    return true;
  },
  rgb(name) {
    const e = this.frame(name);
    if (!e) return null;
    const m = getComputedStyle(e).backgroundColor.match(/\d+(\.\d+)?/g);
    return m ? m.slice(0, 3).map(Number) : null;
  },
  tooltip() {
    const t = document.getElementById('tooltip');
    return {visible: getComputedStyle(t).display !== 'none' && t.getBoundingClientRect().width > 0,
            text: t.innerText};
  },
  text(id) { const e = document.getElementById(id); return e ? e.textContent : null; },
  renders() { return Number(document.body.dataset.renderCount || 0); },
};
true
"""


class Checker:
    def __init__(self, page):
        self.page = page
        self.failures = 0

    def ok(self, cond, what, detail=""):
        if cond:
            print("ok: " + what, flush=True)
        else:
            self.failures += 1
            print("FAIL: " + what + (" (" + detail + ")" if detail else ""), flush=True)
        return cond

    def js(self, expr, timeout=30.0):
        return self.page.eval(expr, timeout)

    def load(self, path, timeout=60.0):
        t0 = time.monotonic()
        self.page.navigate(path)
        self.page.wait_for("document.body && document.body.dataset.ready === '1'", timeout,
                           "the page's dataset.ready")
        load_s = time.monotonic() - t0
        self.js(HELPERS)
        self.ok(True, "page ready in %.2f s (first render %s ms)" %
                (load_s, self.js("document.body.dataset.renderMs")))
        return load_s

    def widths(self):
        return self.js("__ck.widths()") or {}

    def expect_widths(self, what, expected):
        """expected: name -> % of the `all` frame, or None for not drawn."""
        w = self.widths()
        bad = []
        for name, pct in expected.items():
            got = w.get(name)
            if pct is None:
                if got is not None:
                    bad.append("%s drawn at %.1f%%, expected not drawn" % (name, got))
            elif got is None:
                bad.append("%s not drawn, expected %.1f%%" % (name, pct))
            elif abs(got - pct) > TOLERANCE:
                bad.append("%s %.1f%%, expected %.1f%%" % (name, got, pct))
        desc = ", ".join("%s %s" % (n, "not drawn" if p is None else "%.1f%%" % p)
                         for n, p in expected.items())
        return self.ok(not bad, "%s: %s" % (what, desc), "; ".join(bad))

    def select(self, sel_id, value):
        before = self.js("__ck.renders()")
        if not self.js("__ck.setSelect(%s, %s)" % (json.dumps(sel_id), json.dumps(value))):
            raise CheckError("#%s has no option %r" % (sel_id, value))
        self.page.wait_for("__ck.renders() > %d" % before, 30, "a render after #%s" % sel_id)

    def click_frame(self, name):
        before = self.js("__ck.renders()")
        x, y = self.page.center("__ck.frame(%s)" % json.dumps(name))
        self.page.click_at(x, y)
        self.page.wait_for("__ck.renders() > %d" % before, 30, "a render after clicking " + name)

    def click_id(self, el_id):
        before = self.js("__ck.renders()")
        x, y = self.page.center("document.getElementById(%s)" % json.dumps(el_id))
        self.page.click_at(x, y)
        self.page.wait_for("__ck.renders() > %d" % before, 30, "a render after clicking #" + el_id)

    def hover_frame(self, name):
        x, y = self.page.center("__ck.frame(%s)" % json.dumps(name))
        self.page.hover_at(x, y)
        return self.page.wait_for("__ck.tooltip().visible && __ck.tooltip()", 10,
                                  "the tooltip over " + name)

    def unhover(self):
        x, y = self.page.center("document.getElementById('title')")
        self.page.hover_at(x, y)
        try:
            self.page.wait_for("!__ck.tooltip().visible", 5, "the tooltip to hide")
            return True
        except Timeout:
            return False

    def search(self, text):
        """Clicks into #search and types `text` (replacing what was there)."""
        self.js("(() => { const s = document.getElementById('search'); s.value = '';"
                " s.dispatchEvent(new Event('input', {bubbles: true})); })()")
        self.page.wait_for("document.body.dataset.renderCount && !document.getElementById("
                           "'matched').textContent", 30, "the search to clear")
        before = self.js("__ck.renders()")
        x, y = self.page.center("document.getElementById('search')")
        self.page.click_at(x, y)
        if text:
            self.page.type_text(text)
            self.page.wait_for("__ck.renders() > %d" % before, 30, "a render after typing")
        ok = self.js("document.activeElement === document.getElementById('search')")
        if not ok:
            raise CheckError("#search did not take the focus")

    def clear_search(self):
        before = self.js("__ck.renders()")
        self.js("(() => { const s = document.getElementById('search'); s.value = '';"
                " s.dispatchEvent(new Event('input', {bubbles: true})); })()")
        self.page.wait_for("__ck.renders() > %d" % before, 30, "a render after clearing")

    def screenshot(self, path):
        shot = self.page.call("Page.captureScreenshot", {"format": "png"}, timeout=60)
        png = base64.b64decode(shot["data"])
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(png)
        try:
            w, h, colors, share = screenshot_stats(png)
        except ValueError as e:
            self.ok(False, "screenshot %s decodes" % path, str(e))
            return
        self.ok(colors >= 8 and share >= 0.05,
                "screenshot %s (%dx%d) is not blank: %d colors, %.1f%% of pixels unlike the "
                "commonest" % (path, w, h, colors, share * 100),
                "want at least 8 colors and 5%")

    def final(self):
        b = self.page.b
        self.ok(not b.exceptions, "no uncaught exceptions", "; ".join(b.exceptions))
        self.ok(not b.errors, "no console errors", "; ".join(b.errors))
        others = [u for u in b.requests
                  if u != self.page.url and not u.startswith(("data:", "about:"))]
        self.ok(not others, "the page fetched nothing but itself", ", ".join(others[:5]))


# ---------------------------------------------------------------------------
# The checks.


def check_known(c, path, screenshot):
    c.load(path)
    c.ok("INPROF" not in c.js("document.title"), "the title was filled in",
         c.js("document.title"))
    c.ok(c.js("document.getElementById('sample-type').value") == "cpu-time",
         "default sample type is cpu-time", c.js("document.getElementById('sample-type').value"))
    c.ok(c.js("document.getElementById('comments').textContent").find("samples taken=") >= 0,
         "the comments are shown")
    c.expect_widths("cpu-time widths", {"all": 100, "#chart": 100, "main": 80, "Compute": 80,
                                        "Multiply": 60, "Add": 20, "WorkerLoop": 20,
                                        "ReadInput": 20})
    tip = c.hover_frame("Multiply")
    text = tip.get("text", "") if tip else ""
    c.ok(all(s in text for s in ("Multiply", "600 ms", "60.0%")),
         "hovering Multiply shows a tooltip with Multiply, 600 ms, 60.0%", repr(text))
    c.ok(c.unhover(), "the tooltip hides on mouseout")

    c.search("Multi")
    matches = c.js("Array.from(document.querySelectorAll('#chart .frame.match'))"
                   ".map((e) => e.dataset.name)")
    c.ok(matches == ["Multiply"], "search 'Multi' marks Multiply (and nothing else) as .match",
         repr(matches))
    rgb = c.js("__ck.rgb('Multiply')")
    c.ok(rgb and rgb[0] > 150 and rgb[2] > 150 and rgb[1] < 120,
         "the match is drawn magenta", repr(rgb))
    matched = c.js("__ck.text('matched')")
    c.ok("60.0%" in matched, "#matched says 60.0%", repr(matched))
    c.search("/^(Add|Work)/")
    matches = sorted(c.js("Array.from(document.querySelectorAll('#chart .frame.match'))"
                          ".map((e) => e.dataset.name)"))
    matched = c.js("__ck.text('matched')")
    c.ok(matches == ["Add", "WorkerLoop"] and "40.0%" in matched,
         "regex search /^(Add|Work)/ matches Add and WorkerLoop, 40.0%",
         "%r, %r" % (matches, matched))
    c.clear_search()
    c.ok(c.js("document.querySelectorAll('#chart .frame.match').length") == 0 and
         not c.js("__ck.text('matched')"), "clearing the search clears the matches")

    c.click_frame("Compute")
    c.ok(c.js("document.body.dataset.zoom") == "Compute", "clicking Compute zooms to it",
         repr(c.js("document.body.dataset.zoom")))
    c.expect_widths("zoomed to Compute", {"all": 100, "main": 100, "Compute": 100,
                                          "Multiply": 75, "Add": 25, "WorkerLoop": None})
    tip = c.hover_frame("Multiply")
    c.ok(tip and "60.0%" in tip.get("text", ""), "zoomed, the tooltip still gives the share "
         "of all (60.0%)", repr(tip))
    c.click_id("reset")
    c.ok(c.js("document.body.dataset.zoom") == "", "#reset resets the zoom")
    c.expect_widths("after #reset", {"Compute": 80, "WorkerLoop": 20})
    c.click_frame("Multiply")
    c.expect_widths("zoomed to Multiply", {"Multiply": 100, "Compute": 100, "Add": None})
    c.click_frame("all")
    c.ok(c.js("document.body.dataset.zoom") == "", "clicking all resets the zoom")
    c.expect_widths("after clicking all", {"Compute": 80, "Multiply": 60})

    c.select("sample-type", "wall-time")
    c.expect_widths("wall-time", {"WorkerLoop": 1000 / 18, "Compute": 800 / 18,
                                  "Multiply": 600 / 18})
    c.select("thread", "worker")
    c.expect_widths("wall-time, thread worker", {"WorkerLoop": 100, "ReadInput": 100,
                                                 "Compute": None, "main": None})
    c.select("thread", "")
    c.select("label", "endpoint=/a")
    c.expect_widths("wall-time, endpoint=/a", {"main": 100, "Compute": 100, "Multiply": 100,
                                               "Add": None, "WorkerLoop": None})
    c.select("label", "")
    c.expect_widths("wall-time, no filter", {"WorkerLoop": 1000 / 18})

    c.click_id("orientation")
    tops = c.js("[__ck.frame('all').getBoundingClientRect().top,"
                " __ck.frame('main').getBoundingClientRect().top, document.body.dataset.orientation]")
    c.ok(tops[2] == "icicle" and tops[0] < tops[1], "icicle: all above main", repr(tops))
    c.click_id("orientation")
    tops = c.js("[__ck.frame('all').getBoundingClientRect().top,"
                " __ck.frame('main').getBoundingClientRect().top, document.body.dataset.orientation]")
    c.ok(tops[2] == "flame" and tops[0] > tops[1], "flame: all below main", repr(tops))

    # Back to the defaults for the picture.
    c.select("sample-type", "cpu-time")
    c.expect_widths("back to the defaults", {"Compute": 80, "Multiply": 60, "WorkerLoop": 20})
    if screenshot:
        c.js("window.scrollTo(0, 0)")
        c.screenshot(screenshot)


def check_diff(c, path, screenshot):
    c.load(path)
    text = c.js("document.body.innerText")
    c.ok("diff" in text, "the page says diff", repr(text[:120]))
    c.expect_widths("widths from the new profile", {"Compute": 80, "Multiply": 60, "Add": 20})
    rgb = c.js("__ck.rgb('Multiply')")
    c.ok(rgb and rgb[0] > rgb[2], "Multiply (42.9% -> 60.0%) is red", repr(rgb))
    rgb = c.js("__ck.rgb('Add')")
    c.ok(rgb and rgb[2] > rgb[0], "Add (28.6% -> 20.0%) is blue", repr(rgb))
    tip = c.hover_frame("Multiply")
    text = tip.get("text", "") if tip else ""
    c.ok("300 ms" in text and "600 ms" in text and "+100.0%" in text,
         "the tooltip over Multiply gives 300 ms -> 600 ms (+100.0%)", repr(text))
    c.unhover()
    if screenshot:
        c.screenshot(screenshot)


def check_large(c, path, screenshot):
    c.load(path, timeout=60)
    first = c.js("document.body.dataset.renderMs")
    n = c.js("__ck.frames().length")
    status = c.js("__ck.text('status')")
    c.ok(n >= 100, "%d frames drawn (at least 100)" % n, status)
    print("info: status: %s" % status)
    print("info: first render %s ms (after %s ms turning the data into tables)" %
          (first, c.js("document.body.dataset.prepMs")))
    times = []

    def timed(what, action):
        before = c.js("__ck.renders()")
        t0 = time.monotonic()
        action()
        c.page.wait_for("__ck.renders() > %d" % before, 60, "the render after " + what)
        wall = (time.monotonic() - t0) * 1000
        ms = c.js("document.body.dataset.renderMs")
        # The render the wait above saw must have finished and timed itself.
        c.ok(ms is not None and float(ms) >= 0,
             "re-rendered after %s: renderMs %s (%.0f ms from the input to the end)" %
             (what, ms, wall))
        times.append((what, ms))

    def type_search():
        x, y = c.page.center("document.getElementById('search')")
        c.page.click_at(x, y)
        c.page.type_text("Fn001")

    timed("typing a search", type_search)
    print("info: %s" % c.js("__ck.text('matched')"))
    c.ok("matched" in c.js("__ck.text('matched')"), "#matched reports the search")
    timed("switching the sample type",
          lambda: c.js("__ck.setSelect('sample-type', "
                       "document.getElementById('sample-type').options[1].value)"))
    timed("clearing the search", c.clear_search)

    def zoom():
        name = c.js("(() => { let best = null, w = 0; for (const e of __ck.frames()) {"
                    " const r = e.getBoundingClientRect().width;"
                    " if (e.dataset.name !== 'all' && r > w && r < 1000) { w = r; best = e; } }"
                    " return best ? best.dataset.name : null; })()")
        x, y = c.page.center("__ck.frame(%s)" % json.dumps(name))
        c.page.click_at(x, y)

    timed("zooming to a frame", zoom)
    timed("filtering by a thread",
          lambda: c.js("__ck.setSelect('thread', document.getElementById('thread')"
                       ".options[1].value)"))
    print("info: render times (ms): first %s, %s" % (
        first, ", ".join("%s %s" % (w, ms) for w, ms in times)))
    if screenshot:
        c.screenshot(screenshot)


def check_empty(c, path, screenshot):
    c.load(path)
    status = c.js("__ck.text('status')")
    c.ok("no samples" in status, "#status says no samples", repr(status))
    c.search("x")
    c.ok(True, "searching an empty profile")
    c.click_id("orientation")
    c.ok(c.js("__ck.frames().length") == 0, "no frames drawn")
    if screenshot:
        c.screenshot(screenshot)


ESCAPE_NAMES = ["<img src=x onerror=alert(1)>", "a&b \"dq\" 'sq'", "</script><b>bold</b>",
                "operator<<(std::ostream&, T const&)"]


def check_escape(c, path, screenshot):
    c.load(path)
    c.ok(c.js("document.title") == 'inprof: <esc> & "title"', "the title reads as written",
         repr(c.js("document.title")))
    names = c.js("__ck.frames().map((e) => e.dataset.name)")
    c.ok(all(n in names for n in ESCAPE_NAMES), "names with <, &, quotes are data-name as "
         "written", repr(names))
    c.ok(c.js("document.querySelectorAll('#chart img, #chart b, #chart script').length") == 0,
         "no markup injected from names")
    tip = c.hover_frame("</script><b>bold</b>")
    c.ok(tip and "</script><b>bold</b>" in tip.get("text", ""), "the tooltip shows the name",
         repr(tip))
    c.unhover()
    opts = c.js("Array.from(document.querySelectorAll('#label option, #thread option'))"
                ".map((o) => o.value)")
    c.ok("k<&>=v\"'&" in opts and "t<1>" in opts, "label and thread options as written",
         repr(opts))
    c.search("/^operator<</")
    matches = c.js("Array.from(document.querySelectorAll('#chart .frame.match'))"
                   ".map((e) => e.dataset.name)")
    c.ok(matches == ["operator<<(std::ostream&, T const&)"], "regex search with <", repr(matches))
    c.search("/(/")
    c.ok(True, "an invalid regex is survived: %r" % c.js("__ck.text('matched')"))
    if screenshot:
        c.screenshot(screenshot)


CHECKS = {"known": check_known, "diff": check_diff, "large": check_large,
          "empty": check_empty, "escape": check_escape}


def run_checks(mode, path, screenshot, time_limit):
    if not os.path.isfile(path):
        print("FAIL: no page %s" % path)
        return 1
    exe = find_chromium()
    if exe is None:
        print("FAIL: no chromium found (set INPROF_CHROMIUM)")
        return 1

    def on_alarm(signum, frame):
        raise Timeout("the checks ran past %d s" % time_limit)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(time_limit)
    t0 = time.monotonic()
    browser = None
    checker = None
    try:
        browser = Browser(exe)
        page = Page(browser)
        checker = Checker(page)
        CHECKS[mode](checker, path, screenshot)
        checker.final()
    except Exception as e:  # pylint: disable=broad-except
        what = str(e) if isinstance(e, CheckError) else "%s: %s" % (type(e).__name__, e)
        if checker is None:
            print("FAIL: starting the browser: %s" % what, flush=True)
        else:
            checker.ok(False, "the checks could not go on", what)
    finally:
        signal.alarm(0)
        failures = checker.failures if checker else 1
        if failures and browser is not None:
            report_failure(browser, checker)
        if browser is not None:
            browser.close()
    print("%s: %s mode, %.1f s" % ("passed" if not failures else "FAILED (%d)" % failures,
                                  mode, time.monotonic() - t0))
    return 0 if not failures else 1


def report_failure(browser, checker):
    if checker is not None and browser.proc.poll() is None:
        try:
            status = checker.page.eval(
                "document.getElementById('status') ? "
                "document.getElementById('status').textContent : '(no #status)'", timeout=10)
            print("  #status: %s" % status)
        except Exception as e:  # pylint: disable=broad-except
            print("  #status: unavailable (%s)" % e)
    for e in browser.exceptions:
        print("  exception: %s" % e)
    for e in browser.errors:
        print("  console: %s" % e)
    if browser.proc.poll() is not None:
        print("  browser: %s" % browser.exit_note())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for mode in CHECKS:
        p = sub.add_parser(mode)
        p.add_argument("page")
        p.add_argument("--screenshot", help="write a PNG of the page here")
        p.add_argument("--time-limit", type=int, default=300,
                       help="seconds for the whole run (default 300)")
    p = sub.add_parser("make-page")
    p.add_argument("template")
    p.add_argument("out")
    p.add_argument("kind", choices=sorted(CHECKS))
    args = ap.parse_args()
    if args.mode == "make-page":
        make_page(args.template, args.out, args.kind)
        return 0
    return run_checks(args.mode, args.page, args.screenshot, args.time_limit)


if __name__ == "__main__":
    sys.exit(main())
