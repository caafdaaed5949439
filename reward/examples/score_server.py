#!/usr/bin/python3
"""reward/examples/score_server.py - a vgrpo reward server in Python (pyzmq + numpy), written from reward/PROTOCOL.md.

Copy this file to serve your own reward model (PickScore-style, from PyTorch): add a function to SCORERS that takes
the batch of videos and its items and returns one float per video (see `mean_red`; the comment there says where
the model call goes). Everything else (framing, checks, error replies, idempotent ids, shutdown) can stay as is.

    /usr/bin/python3 reward/examples/score_server.py --bind ipc:///tmp/r.sock --scorers mean_red:1

Requests are scored one at a time in arrival order on the main thread, so there is no queue and never a `busy`
error. SIGTERM, SIGINT or a `shutdown` message end the server with exit status 0 and a stats line on stderr.

With the run's keys (--keys-file PATH, the key text of core/curve.h in a file of mode 0600, e.g. written by the job
for an external reward server) the ROUTER is a CURVE server with the reward key pair, and a ZAP handler admits only
the run's client public key; messages from any other connection are dropped. Without keys it is plain ZeroMQ:
bind it only where its clients are trusted. An ipc:// socket file is created with mode 0600 either way.
"""
import argparse
import collections
import hashlib
import json
import math
import os
import signal
import stat
import sys
import threading
import time

import numpy as np
import zmq
import zmq.utils.z85

VERSION = 1
TYPES = {"hello", "rollout_request", "trajectory", "score_request", "score_reply", "weights_begin",
         "weights_tensor", "weights_end", "weights_ack", "error", "shutdown", "weights_bucket"}
DTYPE_SIZE = {"U8": 1, "F32": 4, "BF16": 2, "F16": 2, "I64": 8}
MAX_HEADER, MAX_TENSORS, MAX_ID, MAX_NAME = 1 << 20, 16, 128, 512
ZAP_DOMAIN, ZAP_USER = b"vgrpo", b"vgrpo-client"  # as core/curve.h


# ---- Scorers: fn(videos uint8 [N, F, H, W, 3], items [{"prompt": str, "metadata": {str: str}}] * N) -> N floats ----

def mean_red(videos, items):
    """Mean of the red channel over all frames and pixels, / 255: in [0, 1]."""
    # A real model goes here, batched over the N videos, e.g. for a PickScore-style image-text model:
    #   with torch.no_grad():
    #       frames = torch.from_numpy(videos[:, videos.shape[1] // 2]).to("cuda")  # middle frame, [N, H, W, 3]
    #       scores = model(processor(frames), [it["prompt"] for it in items])     # [N]
    #   return scores.float().cpu().tolist()
    return (videos[..., 0].reshape(len(videos), -1).mean(axis=1, dtype=np.float64) / 255.0).tolist()


SCORERS = {"mean_red": mean_red}


class BadRequest(Exception):
    """A message that fails a check: answered with an `error` of this code and reason."""

    def __init__(self, reason, code="bad_request"):
        super().__init__(reason)
        self.code = code


def is_int(x):
    return type(x) is int  # JSON integers only: not bool, not 1.0


def utf8_len(s):
    """Byte length of a JSON string, or -1 when it is not valid UTF-8 (lone surrogates) or holds a NUL."""
    try:
        return -1 if "\0" in s else len(s.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key %r" % next(k for k in keys if keys.count(k) > 1))
    return dict(pairs)


def reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse(frames, max_frame):
    """Section 1 checks, in order. frames: the message after the routing id. Returns (header, {name: array})."""
    if not 1 <= len(frames) <= MAX_TENSORS + 1:
        raise BadRequest("wire: message has %d frames (1..%d allowed)" % (len(frames), MAX_TENSORS + 1))
    if len(frames[0]) > MAX_HEADER or any(len(f) > max_frame for f in frames[1:]) or \
            sum(len(f) for f in frames) > max_frame + MAX_HEADER:
        raise BadRequest("wire: a frame or the message is over the size limit")
    try:
        hdr = json.loads(bytes(frames[0]).decode("utf-8"), object_pairs_hook=no_duplicates,
                         parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadRequest("wire: header is not valid JSON: %s" % e)
    if not isinstance(hdr, dict):
        raise BadRequest("wire: header is not a JSON object")
    if not is_int(hdr.get("v")) or hdr["v"] != VERSION:
        raise BadRequest("wire: unsupported protocol version %s" % json.dumps(hdr.get("v")))
    t = hdr.get("type")
    if not isinstance(t, str) or t not in TYPES:
        raise BadRequest("wire: unknown message type %s" % json.dumps(t))
    i = hdr.get("id")
    if not isinstance(i, str) or not (0 if t == "error" else 1) <= utf8_len(i) <= MAX_ID:
        raise BadRequest("wire: field \"id\" is missing or not a string of 1..%d bytes" % MAX_ID)
    descs = hdr.get("tensors", [])
    if not isinstance(descs, list) or len(descs) != len(frames) - 1:
        raise BadRequest("wire: \"tensors\" lists %s tensors but the message has %d" %
                         (len(descs) if isinstance(descs, list) else "no", len(frames) - 1))
    tensors = {}
    for k, (d, f) in enumerate(zip(descs, frames[1:])):
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not 1 <= utf8_len(d["name"]) <= MAX_NAME \
                or d.get("dtype") not in DTYPE_SIZE or not isinstance(d.get("shape"), list) or len(d["shape"]) > 8 \
                or not all(is_int(s) and s >= 0 for s in d["shape"]):
            raise BadRequest("wire: tensors[%d] is not {name, dtype, shape} with a known dtype and 0..8 dims" % k)
        if d["name"] in tensors:
            raise BadRequest("wire: tensor name %s is used twice" % json.dumps(d["name"]))
        want = math.prod(d["shape"]) * DTYPE_SIZE[d["dtype"]]
        if len(f) != want:
            raise BadRequest("wire: frame %d (tensor %s) has %d bytes, its descriptor says %d" %
                             (k + 1, json.dumps(d["name"]), len(f), want))
        tensors[d["name"]] = (d, f)
    return hdr, tensors


def check_score_request(hdr, tensors):
    """Section 2 score_request fields. Returns the videos as a uint8 array [N, F, H, W, 3] (no copy)."""
    if list(tensors) != ["videos"]:
        raise BadRequest("score_request: needs exactly one tensor, \"videos\"")
    d, f = tensors["videos"]
    shape = d["shape"]
    if d["dtype"] != "U8" or len(shape) != 5 or shape[4] != 3 or min(shape) < 1:
        raise BadRequest("score_request: tensor \"videos\" must be U8 [N, F, H, W, 3] with every dim >= 1")
    fps = hdr.get("fps")
    if type(fps) not in (int, float) or not 0 < fps < math.inf:
        raise BadRequest("score_request: field \"fps\" is missing or not a number > 0")
    items = hdr.get("items")
    if not isinstance(items, list) or len(items) != shape[0]:
        raise BadRequest("score_request: field \"items\" must be an array of %d objects (one per video)" % shape[0])
    for k, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("prompt"), str):
            raise BadRequest("score_request: field \"items\"[%d].prompt is missing or not a string" % k)
        md = it.setdefault("metadata", {})
        if not isinstance(md, dict) or not all(isinstance(v, str) for v in md.values()):
            raise BadRequest("score_request: field \"items\"[%d].metadata is not an object of strings" % k)
    return np.frombuffer(f, dtype=np.uint8).reshape(shape)


def content_digest(hdr, videos):
    """What scoring reads (fps, items, the videos' shape and bytes): a re-used id with other content is refused."""
    h = hashlib.blake2b(json.dumps({"fps": hdr["fps"], "items": hdr["items"]}, sort_keys=True,
                                   separators=(",", ":")).encode(), digest_size=16)
    h.update(repr(videos.shape).encode())
    h.update(videos.data)
    return h.digest()


def encode(typ, rid, **fields):
    """A header-only message as bytes: ASCII JSON (non-ASCII escaped), so always valid UTF-8."""
    return json.dumps(dict(v=VERSION, type=typ, id=rid, **fields), separators=(",", ":")).encode()


def error_msg(rid, code, reason):
    reason = "".join(c if " " <= c <= "~" else "?" for c in reason)  # printable ASCII, as the protocol asks
    return encode("error", rid, code=code, reason=reason, retryable=code in ("busy", "shutting_down"))


class Server:
    def __init__(self, args, scorers):
        self.scorers, self.max_frame, self.cache_size = scorers, args.max_frame_mb << 20, args.cache
        self.weights = [{"name": n, "weight": w} for n, _, w in scorers]
        self.clients = collections.OrderedDict()  # routing id -> client id from its last hello
        self.cache = collections.OrderedDict()  # (client id, request id) -> (content digest, reply bytes)
        self.stats = dict(received=0, replies=0, errors=0, repeats=0, videos=0, undeliverable=0)
        self.stop = False

    def score(self, rid, hdr, videos):
        """Runs every scorer on the batch; a score_reply, or an error naming the scorer that failed."""
        per = [[] for _ in hdr["items"]]
        for name, fn, w in self.scorers:
            try:
                vals = [float(x) for x in fn(videos, hdr["items"])]
                if len(vals) != len(per) or not all(math.isfinite(x) for x in vals):
                    raise ValueError("returned %d values (want %d finite)" % (len(vals), len(per)))
            except Exception as e:  # a scorer's bug must not stop the server
                return error_msg(rid, "scorer_failed", "scorer %s: %s" % (name, e)), False
            for p, x in zip(per, vals):
                p.append((name, w, x))
        rewards = [{"total": sum(w * x for _, w, x in p), "scores": {n: x for n, _, x in p}} for p in per]
        self.stats["videos"] += len(per)
        return encode("score_reply", rid, rewards=rewards, scorers=self.weights, tensors=[]), True

    def handle(self, route, frames):
        """One message (frames after the routing id) -> (reply bytes, whether it counts as an error)."""
        rid = ""
        try:
            hdr, tensors = parse(frames, self.max_frame)
            rid, t = hdr["id"], hdr["type"]
            if t == "hello":
                c = hdr.get("client")
                if not isinstance(c, str) or not 1 <= utf8_len(c) <= MAX_ID:
                    raise BadRequest("hello: field \"client\" is missing or not a string of 1..%d bytes" % MAX_ID)
                self.clients[route] = c
                self.clients.move_to_end(route)
                if len(self.clients) > 1024:
                    self.clients.popitem(last=False)
                return encode("hello", rid, server="vgrpo-reward", scorers=self.weights,
                              max_videos_bytes=self.max_frame), False
            if t == "shutdown":
                self.stop = True
                return encode("shutdown", rid), False
            if t != "score_request":
                raise BadRequest("a reward server does not serve \"%s\" messages" % t, "unsupported")
            key = (self.clients.get(route, "rid:" + route.hex()), rid)
            videos = check_score_request(hdr, tensors)
            digest = content_digest(hdr, videos)
            if key in self.cache:
                if self.cache[key][0] != digest:
                    raise BadRequest("request id \"%s\" was already used by client \"%s\" for a request with other "
                                     "content (fps, items or videos differ); ids must be unique per client id, and a "
                                     "re-send must repeat the request" % (rid, key[0]))
                self.stats["repeats"] += 1
                return self.cache[key][1], False  # byte for byte the first reply (section 4)
            reply, ok = self.score(rid, hdr, videos)
            self.cache[key] = (digest, reply)
            if len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
            return reply, not ok
        except BadRequest as e:
            if rid == "":  # echo the id when the header at least parses with a sane string id
                try:
                    i = json.loads(bytes(frames[0]).decode("utf-8")).get("id") if len(frames[0]) <= MAX_HEADER else None
                    rid = i if isinstance(i, str) and 0 < utf8_len(i) <= MAX_ID else ""
                except Exception:
                    rid = ""
            return error_msg(rid, e.code, str(e)), True
        except Exception as e:  # never crash on a peer's message
            return error_msg(rid, "internal", "%s: %s" % (type(e).__name__, e)), True

    def run(self, endpoint, keys):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        # RCVHWM 2: two messages wait per connection. No heartbeats of the server's own (PROTOCOL.md section 6: with
        # them, libzmq 4.3.4 can abort when a peer hangs up while its input is stopped at the high-water mark).
        for opt, val in ((zmq.ROUTER_MANDATORY, 1), (zmq.LINGER, 100), (zmq.SNDTIMEO, 1000),
                         (zmq.MAXMSGSIZE, self.max_frame), (zmq.RCVHWM, 2), (zmq.TCP_KEEPALIVE, 1)):
            sock.setsockopt(opt, val)
        zap = None
        if keys:
            zap = ZapHandler(ctx, zmq.utils.z85.decode(keys["client-public"]))  # before the bind, as libzmq needs
            sock.curve_secretkey = keys["reward-secret"]
            sock.curve_publickey = keys["reward-public"]
            sock.curve_server = True
            sock.zap_domain = ZAP_DOMAIN
        bind_private(sock, endpoint)
        t0 = time.monotonic()
        while not self.stop:
            if not sock.poll(100):  # wakes up at least every 100 ms to notice SIGTERM
                continue
            frames = sock.recv_multipart(copy=False)
            self.stats["received"] += 1
            if keys and (len(frames) < 2 or frames[1].get("User-Id") != ZAP_USER.decode()):
                # second line behind the ZAP handler: a connection it did not admit is not read (PROTOCOL.md section 9)
                reply, is_error = error_msg("", "unauthenticated", "the connection is not authenticated with the run's "
                                            "keys"), True
            else:
                reply, is_error = self.handle(frames[0].bytes, [f.buffer for f in frames[1:]])
            self.stats["errors" if is_error else "replies"] += 1
            try:
                sock.send_multipart([frames[0].bytes, reply])
            except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY) or not reading (SNDTIMEO)
                self.stats["undeliverable"] += 1
        sock.close()
        if zap:
            zap.stop()
        ctx.term()
        s = self.stats
        print("score_server: stats: received %d, replies %d, errors %d, repeats %d, videos %d, undeliverable %d, %.1f s"
              % (s["received"], s["replies"], s["errors"], s["repeats"], s["videos"], s["undeliverable"],
                 time.monotonic() - t0), file=sys.stderr)


class ZapHandler:
    """ZAP (RFC 27) on inproc://zeromq.zap.01: admits CURVE handshakes in domain "vgrpo" with the one client key."""

    def __init__(self, ctx, client_key):
        self.rep = ctx.socket(zmq.REP)
        self.rep.linger = 0
        self.rep.bind("inproc://zeromq.zap.01")
        self.key, self.done = client_key, False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.done:
            if not self.rep.poll(100):
                continue
            f = self.rep.recv_multipart()  # version, request id, domain, address, routing id, mechanism, credentials
            ok = len(f) == 7 and f[0] == b"1.0" and f[2] == ZAP_DOMAIN and f[5] == b"CURVE" and f[6] == self.key
            self.rep.send_multipart([b"1.0", f[1] if len(f) > 1 else b"", b"200" if ok else b"400",
                                     b"OK" if ok else b"not the run's client key", ZAP_USER if ok else b"", b""])

    def stop(self):
        self.done = True
        self.thread.join()
        self.rep.close()


def bind_private(sock, endpoint):
    """Binds; an ipc:// socket file gets mode 0600 whatever the umask (created under umask 0177, then chmod)."""
    if not endpoint.startswith("ipc://"):
        sock.bind(endpoint)
        return
    old = os.umask(0o177)
    try:
        sock.bind(endpoint)
    finally:
        os.umask(old)
    if not endpoint.startswith("ipc://@"):
        os.chmod(endpoint[6:], 0o600)


def load_keys(path):
    """The key text of core/curve.h from a file only its owner may read; needs the reward pair and client-public."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ValueError("%s must be a regular file of yours with mode 0600 or 0400 (chmod 600 %s)" % (path, path))
    with open(path, "rb") as f:
        lines = [ln.strip() for ln in f.read().decode("ascii").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines or lines[0] != "vgrpo-keys 1":
        raise ValueError("%s: the first line must be `vgrpo-keys 1`" % path)
    keys = {}
    for ln in lines[1:]:
        name, _, val = ln.partition(" ")
        if len(val) != 40 or name in keys:
            raise ValueError("%s: line `%s ...` is not one key of 40 Z85 characters" % (path, name))
        keys[name] = val.encode()
    for need in ("reward-public", "reward-secret", "client-public"):
        if need not in keys:
            raise ValueError("%s: no %s" % (path, need))
    if zmq.curve_public(keys["reward-secret"]) != keys["reward-public"]:
        raise ValueError("%s: reward-secret does not match reward-public" % path)
    return keys


def parse_scorers(spec):
    """NAME:WEIGHT,... -> [(name, fn, weight)]; raises ValueError naming the bad entry."""
    out = []
    for entry in spec.split(","):
        name, _, w = entry.partition(":")
        weight = float(w) if w else 1.0
        if name not in SCORERS:
            raise ValueError("unknown scorer %r (known: %s)" % (name, ", ".join(SCORERS)))
        if not math.isfinite(weight) or any(name == n for n, _, _ in out):
            raise ValueError("scorer %r: weight not finite, or named twice" % name)
        out.append((name, SCORERS[name], weight))
    return out


def main():
    ap = argparse.ArgumentParser(description="vgrpo reward server (protocol version 1) in Python")
    ap.add_argument("--bind", required=True, help="ZeroMQ endpoint, e.g. ipc:///tmp/r.sock or tcp://*:5555")
    ap.add_argument("--scorers", default="mean_red:1", help="NAME:WEIGHT,... (known: %s)" % ", ".join(SCORERS))
    ap.add_argument("--max-frame-mb", type=int, default=16, help="largest tensor frame accepted (MiB)")
    ap.add_argument("--cache", type=int, default=4096, help="replies kept for repeated ids")
    ap.add_argument("--keys-file", help="the run's keys (core/curve.h key text, mode 0600): CURVE, only the run's "
                    "client key admitted; without it plain ZeroMQ")
    args = ap.parse_args()
    try:
        scorers = parse_scorers(args.scorers)
    except ValueError as e:
        ap.error("--scorers: %s" % e)  # exit status 2
    if args.bind.startswith("ipc://") and len(args.bind) - 6 >= 100:
        ap.error("--bind: ipc path must be shorter than 100 bytes")
    keys = None
    if args.keys_file:
        if not zmq.has("curve"):
            ap.error("--keys-file: this libzmq has no CURVE")
        try:
            keys = load_keys(args.keys_file)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            print("score_server: --keys-file: %s" % e, file=sys.stderr)
            return 1
    else:
        print("score_server: no keys (--keys-file): the reward channel is not authenticated", file=sys.stderr)
    server = Server(args, scorers)

    def on_signal(signum, frame):
        server.stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.run(args.bind, keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
