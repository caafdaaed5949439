#!/usr/bin/python3
"""reward/examples/score_server.py - a vgrpo reward server in Python (pyzmq + numpy), written from reward/PROTOCOL.md.

Copy this file to serve your own reward model (PickScore-style, from PyTorch): add a function to SCORERS that takes
the batch of videos and its items and returns one float per video (see `mean_red`; the comment there says where
the model call goes). Everything else (framing, checks, error replies, idempotent ids, shutdown) can stay as is.

    /usr/bin/python3 reward/examples/score_server.py --bind ipc:///tmp/r.sock --scorers mean_red:1

Requests are scored one at a time in arrival order on the main thread, so there is no queue and never a `busy`
error. SIGTERM, SIGINT or a `shutdown` message end the server with exit status 0 and a stats line on stderr.
"""
import argparse
import collections
import json
import math
import signal
import sys
import time

import numpy as np
import zmq

VERSION = 1
TYPES = {"hello", "rollout_request", "trajectory", "score_request", "score_reply", "weights_begin",
         "weights_tensor", "weights_end", "weights_ack", "error", "shutdown"}
DTYPE_SIZE = {"U8": 1, "F32": 4, "BF16": 2, "F16": 2, "I64": 8}
MAX_HEADER, MAX_TENSORS, MAX_ID, MAX_NAME = 1 << 20, 16, 128, 512


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
        self.cache = collections.OrderedDict()  # (client id, request id) -> reply bytes
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
            if key in self.cache:
                self.stats["repeats"] += 1
                return self.cache[key], False  # byte for byte the first reply (section 4)
            videos = check_score_request(hdr, tensors)
            reply, ok = self.score(rid, hdr, videos)
            self.cache[key] = reply
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

    def run(self, endpoint):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        for opt, val in ((zmq.ROUTER_MANDATORY, 1), (zmq.LINGER, 100), (zmq.SNDTIMEO, 1000),
                         (zmq.MAXMSGSIZE, self.max_frame), (zmq.HEARTBEAT_IVL, 1000),
                         (zmq.HEARTBEAT_TIMEOUT, 5000), (zmq.HEARTBEAT_TTL, 10000)):
            sock.setsockopt(opt, val)
        sock.bind(endpoint)
        t0 = time.monotonic()
        while not self.stop:
            if not sock.poll(100):  # wakes up at least every 100 ms to notice SIGTERM
                continue
            frames = sock.recv_multipart(copy=False)
            self.stats["received"] += 1
            reply, is_error = self.handle(frames[0].bytes, [f.buffer for f in frames[1:]])
            self.stats["errors" if is_error else "replies"] += 1
            try:
                sock.send_multipart([frames[0].bytes, reply])
            except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY) or not reading (SNDTIMEO)
                self.stats["undeliverable"] += 1
        sock.close()
        ctx.term()
        s = self.stats
        print("score_server: stats: received %d, replies %d, errors %d, repeats %d, videos %d, undeliverable %d, %.1f s"
              % (s["received"], s["replies"], s["errors"], s["repeats"], s["videos"], s["undeliverable"],
                 time.monotonic() - t0), file=sys.stderr)


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
    ap.add_argument("--max-frame-mb", type=int, default=1024, help="largest tensor frame accepted (MiB)")
    ap.add_argument("--cache", type=int, default=4096, help="replies kept for repeated ids")
    args = ap.parse_args()
    try:
        scorers = parse_scorers(args.scorers)
    except ValueError as e:
        ap.error("--scorers: %s" % e)  # exit status 2
    if args.bind.startswith("ipc://") and len(args.bind) - 6 >= 100:
        ap.error("--bind: ipc path must be shorter than 100 bytes")
    server = Server(args, scorers)

    def on_signal(signum, frame):
        server.stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.run(args.bind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
