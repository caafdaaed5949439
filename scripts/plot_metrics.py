#!/usr/bin/env python3
"""scripts/plot_metrics.py RUN_DIR/metrics.jsonl OUT.png [--width PX]
   scripts/plot_metrics.py --compare OUT.png RUN [RUN ...] [--labels A,B,...] [--smooth K] [--width PX]

Draws a `vgrpo run`'s metrics.jsonl (fields: recipes/README.md) to a PNG, panels against `step` on one page:
  reward   training reward/mean (line) inside its reward/min .. reward/max band, and the fixed eval's
           eval/reward/mean with +- eval/reward/se error bars (the rows that hold an eval, the final eval row too);
  gold     (runs with guard.gold_scorers) the gold eval apart from the training reward: gold/score/mean with
           +- gold/score/se error bars, a grey line at the best gold eval (gold/best_step of the last row) and a red
           one where the guard stopped the run (guard/stopped);
  drift    (runs with guard.video_stats) stats/<name>/drift_sd of the seven video statistics, in step-0 standard
           deviations, with dashed lines at +- guard.drift_warn_sd (read from config.resolved.yaml beside
           metrics.jsonl; 4 when absent);
  loss     loss (the GRPO loss of the step's first update);
  log-prob log_prob_mean_abs_diff (rollout vs trainer log-probs on the first update: exactly 0 on CPU), and
           offpolicy_last/log_prob_mean_abs_diff when the recipe has optimizer_steps_per_rollout > 1; a run with
           algorithm.loss nft (no log-prob) shows nft/positive_loss and nft/negative_loss there instead, one with
           algorithm.loss dpo its dpo/reward_margin (the mean implicit reward margin z).
--compare draws several runs (RUN: a run folder or its metrics.jsonl; e.g. GRPO, DiffusionNFT and DPO on one recipe)
on one page, one colour per run (legend: --labels, else the run folders' names), in two panels:
  wall time  the training reward/mean (a moving average over K steps with --smooth K; 1 by default) against the
           cumulative seconds of the steps (time/step_s: rollout, reward and training; the in-run evals left out,
           as they cost every run the same), and each eval's eval/reward/mean +- se at the time it ran;
  samples    the same against the cumulative number of rollout samples (prompts_per_step x samples_per_prompt of
           config.resolved.yaml beside metrics.jsonl, else time/samples_per_s x time/step_s per step).
Missing or non-numeric values (and any beyond 1e100 in magnitude: garbled) are skipped; the gold and drift panels appear only when their fields do. Python 3 standard library only: the PNG is written with zlib + struct and
the text with a built-in 5 x 7 pixel font (upper case), so plotting needs no package beyond Debian's python3.
Exit status 0; 1 when the file has no step rows; 2 on a usage error, an unreadable file or an OUT.png that cannot
be written (the PNG is written whole to a temporary file beside it, then renamed).
"""
import json
import math
import os
import re
import struct
import sys
import zlib

# ---- a 5 x 7 pixel font: 7 rows per glyph, bit 4 = leftmost column ----
FONT = {
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E), "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F), "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02), "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E), "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E), "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    "A": (0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11), "B": (0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E),
    "C": (0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E), "D": (0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C),
    "E": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F), "F": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10),
    "G": (0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F), "H": (0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "I": (0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E), "J": (0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C),
    "K": (0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11), "L": (0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F),
    "M": (0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11), "N": (0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11),
    "O": (0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E), "P": (0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10),
    "Q": (0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D), "R": (0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11),
    "S": (0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E), "T": (0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04),
    "U": (0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E), "V": (0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "W": (0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A), "X": (0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11),
    "Y": (0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04), "Z": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F),
    " ": (0, 0, 0, 0, 0, 0, 0), ".": (0, 0, 0, 0, 0, 0x0C, 0x0C), "-": (0, 0, 0, 0x1F, 0, 0, 0),
    "+": (0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0), "/": (0, 0x01, 0x02, 0x04, 0x08, 0x10, 0),
    "_": (0, 0, 0, 0, 0, 0, 0x1F), "(": (0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02),
    ")": (0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08), ":": (0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0),
    ",": (0, 0, 0, 0, 0x0C, 0x04, 0x08), "=": (0, 0, 0x1F, 0, 0x1F, 0, 0),
    "[": (0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E), "]": (0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E),
    "|": (0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04), "?": (0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04),
}

WHITE, BLACK, GREY, LIGHT = (255, 255, 255), (0, 0, 0), (120, 120, 120), (225, 225, 225)
BLUE, BAND, ORANGE, GREEN, RED = (31, 119, 180), (198, 219, 239), (230, 110, 0), (44, 160, 44), (200, 40, 40)
PURPLE, PINK = (148, 103, 189), (227, 119, 194)
# the video statistics of media/video_stats.h, with their legend labels and colours
STATS = [("brightness", "bright", ORANGE), ("saturation", "sat", PURPLE), ("contrast", "contrast", BLUE),
         ("black_fraction", "black", BLACK), ("white_fraction", "white", GREY), ("motion", "motion", GREEN),
         ("hf_energy", "hf", PINK)]


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(WHITE * (w * h))

    def set(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i:i + 3] = bytes(c)

    def fill(self, x0, y0, x1, y1, c):
        x0, x1 = max(0, min(x0, x1)), min(self.w - 1, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.h - 1, max(y0, y1))
        row = bytes(c) * (x1 - x0 + 1)
        for y in range(y0, y1 + 1):
            i = 3 * (y * self.w + x0)
            self.px[i:i + len(row)] = row

    def line(self, x0, y0, x1, y1, c, width=1):
        """Bresenham, `width` pixels thick (a square brush)."""
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, lo = dx + dy, -(width // 2)
        while True:
            if width == 1:
                self.set(x0, y0, c)
            else:
                self.fill(x0 + lo, y0 + lo, x0 + lo + width - 1, y0 + lo + width - 1, c)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, c, scale=2, anchor="left"):
        """Draws s (upper-cased; unknown characters as '?') with its top at y; anchor left, right or center."""
        s = s.upper()
        wpx = text_width(s, scale)
        if anchor == "right":
            x -= wpx
        elif anchor == "center":
            x -= wpx // 2
        for ch in s:
            for r, bits in enumerate(FONT.get(ch, FONT["?"])):
                for col in range(5):
                    if bits & (0x10 >> col):
                        self.fill(x + col * scale, y + r * scale, x + col * scale + scale - 1,
                                  y + r * scale + scale - 1, c)
            x += 6 * scale

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[3 * y * self.w:3 * (y + 1) * self.w]) for y in range(self.h))

        def chunk(tag, data):
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
        tmp = f"{path}.tmp{os.getpid()}"  # written whole, then renamed: no half-written PNG at `path`
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            sys.stderr.write(f"plot_metrics: {path}: {e.strerror or e}\n")
            sys.exit(2)


def text_width(s, scale):
    return max(0, 6 * scale * len(s) - scale)


def nice_ticks(lo, hi, n=5):
    """About n round tick values (1, 2, 5 x 10^k steps) covering [lo, hi]; returns (ticks, step)."""
    span = hi - lo
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + 1e-9 * step:
        ticks.append(k * step)
        k += 1
    return ticks, step


def fmt_tick(v, step):
    if v == 0:
        return "0"
    if 1e-3 <= step and abs(v) < 1e6:
        return f"{v:.{max(0, -math.floor(math.log10(step) + 1e-9))}f}"
    return f"{v:.1e}".replace("e-0", "e-").replace("e+0", "e")


class Panel:
    """One plot area: pixel box (x0, y0, w, h), data limits, and the drawing of axes, series and legend."""

    def __init__(self, cv, box, xlim, ylim, title):
        self.cv, (self.x0, self.y0, self.w, self.h) = cv, box
        self.xlo, self.xhi = xlim
        lo, hi = ylim
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo, hi = 0.0, 1.0
        if hi - lo <= 1e-300:
            pad = abs(lo) * 0.5 if lo != 0 else 1.0
            lo, hi = lo - pad, hi + pad
        else:
            pad = 0.06 * (hi - lo)
            lo, hi = lo - pad, hi + pad
        self.ylo, self.yhi = lo, hi
        self.title = title
        self.legend_x = self.x0 + self.w

    def px(self, x, y):
        fx = (x - self.xlo) / (self.xhi - self.xlo) if self.xhi > self.xlo else 0.5
        fy = (y - self.ylo) / (self.yhi - self.ylo)
        return self.x0 + fx * (self.w - 1), self.y0 + (1 - fy) * (self.h - 1)

    def axes(self, xlabel, integer_x=True):
        """Grid, ticks and labels; integer_x: the x values are counts (steps, samples), ticked at whole numbers."""
        cv = self.cv
        yt, ys = nice_ticks(self.ylo, self.yhi, 6)
        for v in yt:
            _, py = self.px(self.xlo, v)
            py = int(round(py))
            cv.line(self.x0, py, self.x0 + self.w - 1, py, LIGHT)
            cv.line(self.x0 - 6, py, self.x0 - 1, py, BLACK)
            cv.text(self.x0 - 10, py - 7, fmt_tick(v, ys), BLACK, 2, "right")
        if self.xhi > self.xlo:
            xt, xs = nice_ticks(self.xlo, self.xhi, 8)
            if integer_x and xs < 1:  # a short run: no tick at step 0.5 (it was labelled "0", 1.5 "2")
                xt, xs = [float(k) for k in range(math.ceil(self.xlo), math.floor(self.xhi) + 1)], 1
            for v in xt:
                px, _ = self.px(v, self.ylo)
                px = int(round(px))
                cv.line(px, self.y0, px, self.y0 + self.h - 1, LIGHT)
                cv.line(px, self.y0 + self.h, px, self.y0 + self.h + 5, BLACK)
                cv.text(px, self.y0 + self.h + 10, fmt_tick(v, xs), BLACK, 2, "center")
        cv.line(self.x0 - 1, self.y0 - 1, self.x0 + self.w, self.y0 - 1, BLACK)
        cv.line(self.x0 - 1, self.y0 + self.h, self.x0 + self.w, self.y0 + self.h, BLACK)
        cv.line(self.x0 - 1, self.y0 - 1, self.x0 - 1, self.y0 + self.h, BLACK)
        cv.line(self.x0 + self.w, self.y0 - 1, self.x0 + self.w, self.y0 + self.h, BLACK)
        cv.text(self.x0, self.y0 - 24, self.title, BLACK, 2)
        if xlabel:
            cv.text(self.x0 + self.w // 2, self.y0 + self.h + 32, xlabel, BLACK, 2, "center")

    def legend(self, label, color, kind, row=0):
        """Adds a legend entry right-aligned above the plot area (kind: line, band or bar); row 1 is a second row
        above the first (entries of a row go right to left from the plot's right edge)."""
        cv, y = self.cv, self.y0 - 24 - 22 * row
        if row != getattr(self, "legend_row", 0):
            self.legend_row, self.legend_x = row, self.x0 + self.w
        self.legend_x -= text_width(label, 2)
        cv.text(self.legend_x, y, label, BLACK, 2)
        self.legend_x -= 30
        if kind == "band":
            cv.fill(self.legend_x, y, self.legend_x + 22, y + 13, color)
        elif kind == "bar":
            cv.line(self.legend_x + 11, y, self.legend_x + 11, y + 13, color, 2)
            cv.fill(self.legend_x + 8, y + 4, self.legend_x + 14, y + 10, color)
        else:
            cv.line(self.legend_x, y + 7, self.legend_x + 22, y + 7, color, 3)
        self.legend_x -= 24

    def vline(self, x, color, dashed=False):
        """A vertical line across the plot area at data x (nothing outside the x range)."""
        if not (self.xlo <= x <= self.xhi):
            return
        px, _ = self.px(x, self.ylo)
        px = int(round(px))
        for y in range(self.y0, self.y0 + self.h):
            if not dashed or (y // 6) % 2 == 0:
                self.cv.fill(px, y, px + 1, y, color)

    def hline(self, y, color):
        """A dashed horizontal line across the plot area at data y (nothing outside the y range)."""
        if not (self.ylo <= y <= self.yhi):
            return
        _, py = self.px(self.xlo, y)
        py = int(round(py))
        for x in range(self.x0, self.x0 + self.w):
            if (x // 8) % 2 == 0:
                self.cv.set(x, py, color)

    def clip_y(self, py):
        return min(max(py, self.y0), self.y0 + self.h - 1)

    def series(self, pts, color, width=2):
        """A polyline through pts [(x, y)], broken where a step is missing (None)."""
        prev = None
        for p in pts:
            if p is None:
                prev = None
                continue
            x, y = self.px(*p)
            if prev is not None:
                self.cv.line(prev[0], self.clip_y(prev[1]), x, self.clip_y(y), color, width)
            elif len(pts) == 1:
                self.cv.fill(int(x) - 2, int(y) - 2, int(x) + 2, int(y) + 2, color)
            prev = (x, y)

    def band(self, pts, color):
        """Fills between lo and hi of consecutive pts [(x, lo, hi)], linearly interpolated per pixel column."""
        for a, b in zip(pts, pts[1:]):
            (xa, la, ha), (xb, lb, hb) = a, b
            pxa, _ = self.px(xa, la)
            pxb, _ = self.px(xb, lb)
            c0, c1 = int(round(pxa)), int(round(pxb))
            for c in range(c0, c1 + 1):
                t = (c - pxa) / (pxb - pxa) if pxb != pxa else 0.0
                t = min(max(t, 0.0), 1.0)
                _, ylo = self.px(xa, la + t * (lb - la))
                _, yhi = self.px(xa, ha + t * (hb - ha))
                self.cv.fill(c, int(round(self.clip_y(yhi))), c, int(round(self.clip_y(ylo))), color)

    def errorbars(self, pts, color):
        """Points [(x, mean, se)]: a square marker with a vertical +- se bar and caps."""
        for x, m, se in pts:
            px, py = self.px(x, m)
            _, ylo = self.px(x, m - se)
            _, yhi = self.px(x, m + se)
            px, ylo, yhi = int(round(px)), int(round(self.clip_y(ylo))), int(round(self.clip_y(yhi)))
            self.cv.line(px, yhi, px, ylo, color, 2)
            self.cv.line(px - 5, yhi, px + 5, yhi, color, 2)
            self.cv.line(px - 5, ylo, px + 5, ylo, color, 2)
            self.cv.fill(px - 4, int(py) - 4, px + 4, int(py) + 4, color)


def num(row, key):
    """row[key] as a float; None when missing, not a number, or beyond 1e100 in magnitude (no metric of a run is:
    a garbled value, whose sums and axis spans would overflow to infinity)."""
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > 1e100:
        return None
    return float(v)


def count_arg(argv, i, least):
    """The integer after argv[i] (an option), at least `least`; a usage error (exit 2) when it is not one."""
    try:
        return max(least, int(argv[i + 1]))
    except ValueError:
        sys.stderr.write(f"plot_metrics: {argv[i]} {argv[i + 1]}: expected an integer\n")
        sys.exit(2)


def read_rows(path):
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    o = json.loads(line)
                except ValueError as e:
                    sys.stderr.write(f"plot_metrics: {path}:{i}: not JSON ({e}); stopping there\n")
                    break
                if isinstance(o, dict) and num(o, "step") is not None:
                    rows.append(o)
    except OSError as e:
        sys.stderr.write(f"plot_metrics: {path}: {e}\n")
        sys.exit(2)
    return rows


def pick(rows, *keys):
    """[(step, v1, v2, ...)] for the rows holding every key."""
    out = []
    for r in rows:
        vs = [num(r, k) for k in keys]
        if all(v is not None for v in vs):
            out.append((num(r, "step"), *vs))
    return out


def limits(*groups):
    vals = [v for g in groups for p in g for v in p[1:]]
    return (min(vals), max(vals)) if vals else (0.0, 1.0)


def warn_sd(metrics_path):
    """guard.drift_warn_sd from config.resolved.yaml beside metrics.jsonl (4, the default, when absent)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(metrics_path)), "config.resolved.yaml"),
                  encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return 4.0
    m = re.search(r"^guard:\n(?:  .*\n)*?  drift_warn_sd: *([0-9.eE+-]+)", text, re.M)
    try:
        return float(m.group(1)) if m else 4.0
    except ValueError:
        return 4.0


def samples_per_step(metrics_path):
    """prompts_per_step x samples_per_prompt from config.resolved.yaml beside metrics.jsonl; None when absent."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(metrics_path)), "config.resolved.yaml"),
                  encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"^rollout:\n((?:  .*\n)*)", text, re.M)
    if not m:
        return None
    b = re.search(r"^  prompts_per_step: *([0-9]+)", m.group(1), re.M)
    g = re.search(r"^  samples_per_prompt: *([0-9]+)", m.group(1), re.M)
    return int(b.group(1)) * int(g.group(1)) if b and g else None


def run_curves(path, smooth):
    """One run's curves: ([(seconds, reward)], [(samples, reward)], [(seconds, eval, se)], [(samples, eval, se)]).
    A step row k adds its time/step_s and its samples after its reward; an eval in row k ran before step k."""
    rows = read_rows(path)
    n_fixed = samples_per_step(path)
    t = n = 0.0
    by_time, by_samples, ev_time, ev_samples, window = [], [], [], [], []
    for r in rows:
        em, es = num(r, "eval/reward/mean"), num(r, "eval/reward/se")
        if em is not None and es is not None:
            ev_time.append((t, em, es))
            ev_samples.append((n, em, es))
        rew, dt = num(r, "reward/mean"), num(r, "time/step_s")
        if rew is None or dt is None:
            continue
        sps = num(r, "time/samples_per_s")
        k = n_fixed if n_fixed is not None else (round(sps * dt) if sps is not None else 0)
        t += dt
        n += k
        window = (window + [rew])[-max(1, smooth):]
        avg = sum(window) / len(window)
        by_time.append((t, avg))
        by_samples.append((n, avg))
    return by_time, by_samples, ev_time, ev_samples


def compare(argv):
    """--compare OUT.png RUN [RUN ...] [--labels A,B,...] [--smooth K] [--width PX] (see the file's comment)."""
    runs, labels, smooth, width = [], None, 1, 1000
    i = 0
    while i < len(argv):
        if argv[i] == "--labels" and i + 1 < len(argv):
            labels = argv[i + 1].split(",")
            i += 2
        elif argv[i] == "--smooth" and i + 1 < len(argv):
            smooth = count_arg(argv, i, 1)
            i += 2
        elif argv[i] == "--width" and i + 1 < len(argv):
            width = count_arg(argv, i, 600)
            i += 2
        else:
            runs.append(argv[i])
            i += 1
    if len(runs) < 2:
        sys.stderr.write("usage: plot_metrics.py --compare OUT.png RUN [RUN ...] [--labels A,B,...] [--smooth K] "
                         "[--width PX]\n")
        return 2
    out, runs = runs[0], runs[1:]
    paths = [os.path.join(r, "metrics.jsonl") if os.path.isdir(r) else r for r in runs]
    if labels is None:
        labels = [os.path.basename(os.path.dirname(os.path.abspath(p))) for p in paths]
    if len(labels) != len(paths):
        sys.stderr.write(f"plot_metrics: --labels names {len(labels)} runs, {len(paths)} given\n")
        return 2
    colors = [BLUE, ORANGE, GREEN, RED, PURPLE, PINK, GREY, BLACK]
    curves = [run_curves(p, smooth) for p in paths]
    for p, c in zip(paths, curves):
        if not c[0]:
            sys.stderr.write(f"plot_metrics: {p}: no step rows with reward/mean and time/step_s\n")
            return 1
    left, right, top, ph, gap = 150, 30, 70, 320, 120
    height = top + 2 * ph + gap + 90
    cv = Canvas(width, height)
    pw = width - left - right
    title = "reward of " + ", ".join(f"{lb} ({len(c[0])} steps)" for lb, c in zip(labels, curves))
    if smooth > 1:
        title += f", mean of {smooth} steps"
    cv.text(left, 14, title, BLACK, 2)
    for k, (name, xlabel) in enumerate([("wall time", "seconds (steps only)"), ("samples", "rollout samples")]):
        lines = [c[k] for c in curves]
        evs = [c[2 + k] for c in curves]
        xs = [p[0] for g in lines + evs for p in g]
        ys = [(0, y) for g in lines for _, y in g] + [(0, m - s) for g in evs for _, m, s in g] + \
             [(0, m + s) for g in evs for _, m, s in g]
        p = Panel(cv, (left, top + k * (ph + gap), pw, ph), (min(xs), max(xs)), limits(ys), "reward vs " + name)
        p.axes(xlabel, integer_x=k == 1)  # seconds take fractional ticks; samples are counts
        for j in range(len(paths)):
            color = colors[j % len(colors)]
            p.series(lines[j], color)
            p.errorbars(evs[j], color)
        for j in reversed(range(len(paths))):
            p.legend(labels[j], colors[j % len(colors)], "line")
    cv.png(out)
    print(f"wrote {out} ({width} x {height}): " + ", ".join(
        f"{lb}: {len(c[0])} steps, {c[0][-1][0]:.1f} s, {int(c[1][-1][0])} samples, {len(c[2])} evals"
        for lb, c in zip(labels, curves)))
    return 0


def main(argv):
    if argv and argv[0] == "--compare":
        return compare(argv[1:])
    args, width = [], 1000
    i = 0
    while i < len(argv):
        if argv[i] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if argv[i] == "--width" and i + 1 < len(argv):
            width = count_arg(argv, i, 600)
            i += 2
            continue
        args.append(argv[i])
        i += 1
    if len(args) != 2:
        sys.stderr.write("usage: plot_metrics.py RUN_DIR/metrics.jsonl OUT.png [--width PX]\n")
        return 2
    rows = read_rows(args[0])
    if not rows:
        sys.stderr.write(f"plot_metrics: {args[0]}: no rows with a step\n")
        return 1
    steps = [num(r, "step") for r in rows]
    xlim = (min(steps), max(steps))

    rew = pick(rows, "reward/mean")
    band = pick(rows, "reward/min", "reward/max")
    ev = pick(rows, "eval/reward/mean", "eval/reward/se")
    loss = pick(rows, "loss")
    lpd = pick(rows, "log_prob_mean_abs_diff")
    lpd_off = pick(rows, "offpolicy_last/log_prob_mean_abs_diff")
    gold = pick(rows, "gold/score/mean", "gold/score/se")
    best = [num(r, "gold/best_step") for r in rows if num(r, "gold/best_step") is not None]
    stops = [num(r, "step") for r in rows if num(r, "guard/stopped") == 1]
    drifts = [(name, label, color, pick(rows, f"stats/{name}/drift_sd")) for name, label, color in STATS]
    drifts = [d for d in drifts if d[3]]
    thr = warn_sd(args[0])

    n_panels = 3 + (1 if gold else 0) + (1 if drifts else 0)
    left, right, top, ph, gap = 150, 30, 70, 270, 110
    height = top + n_panels * ph + (n_panels - 1) * gap + 90
    cv = Canvas(width, height)
    pw = width - left - right
    title = f"{args[0]}: {len(rew)} steps, {len(ev)} evals"
    if gold:
        title += f", {len(gold)} gold evals"
    cv.text(left, 14, title, BLACK, 2)
    slot = [0]

    def box():
        y = top + slot[0] * (ph + gap)
        slot[0] += 1
        return (left, y, pw, ph)

    ev_lohi = [(x, m - s, m + s) for x, m, s in ev]
    p = Panel(cv, box(), xlim, limits(rew, band, ev_lohi), "reward")
    p.axes(None)
    p.band([(x, lo, hi) for x, lo, hi in band], BAND)
    p.series(rew, BLUE)
    p.errorbars(ev, ORANGE)
    if ev:
        p.legend("eval mean +- se", ORANGE, "bar")
    p.legend("min..max", BAND, "band")
    p.legend("mean", BLUE, "line")
    for x in stops:
        p.vline(x, RED)

    if gold:
        lohi = [(x, m - s, m + s) for x, m, s in gold]
        p = Panel(cv, box(), xlim, limits(lohi), "gold eval (held out)")
        p.axes(None)
        if best:
            p.vline(best[-1], GREY, dashed=True)
        for x in stops:
            p.vline(x, RED)
        p.series([(x, m) for x, m, _ in gold], GREEN, 1)
        p.errorbars(gold, GREEN)
        if stops:
            p.legend("guard stop", RED, "line")
        if best:
            p.legend(f"best ({int(best[-1])})", GREY, "line")
        p.legend("gold score +- se", GREEN, "bar")

    if drifts:
        p = Panel(cv, box(), xlim, limits(*[d[3] for d in drifts], [(0, -thr, thr)]), "drift (sd from step 0)")
        p.axes(None)
        p.hline(thr, RED)
        p.hline(-thr, RED)
        p.hline(0.0, GREY)
        for _, _, color, pts in drifts:
            p.series(pts, color)
        for i, (_, label, color, _) in enumerate(reversed(drifts)):
            p.legend(label, color, "line", row=0 if i < 4 else 1)

    p = Panel(cv, box(), xlim, limits(loss), "loss")
    p.axes(None)
    p.series(loss, RED)

    pos, neg = pick(rows, "nft/positive_loss"), pick(rows, "nft/negative_loss")
    if not lpd and pos:  # algorithm.loss nft: no log-prob; its implicit positive and negative losses instead
        p = Panel(cv, box(), xlim, limits(pos, neg), "nft: positive and negative loss")
        p.axes("step")
        p.series(neg, ORANGE)
        p.series(pos, BLUE)
        p.legend("L-", ORANGE, "line")
        p.legend("L+", BLUE, "line")
    elif not lpd and pick(rows, "dpo/reward_margin"):  # algorithm.loss dpo: the implicit reward margin instead
        margin = pick(rows, "dpo/reward_margin")
        p = Panel(cv, box(), xlim, limits(margin), "dpo: implicit reward margin (mean z)")
        p.axes("step")
        p.series(margin, BLUE)
        p.legend("dpo/reward_margin", BLUE, "line")
    else:
        p = Panel(cv, box(), xlim, limits(lpd, lpd_off), "log_prob_mean_abs_diff")
        p.axes("step")
        if lpd_off:
            p.series(lpd_off, GREY)
            p.legend("off-policy (last update)", GREY, "line")
        p.series(lpd, GREEN)
        p.legend("first update", GREEN, "line")

    cv.png(args[1])
    print(f"wrote {args[1]} ({width} x {height}): {len(rew)} steps, {len(ev)} evals"
          + (f", {len(gold)} gold evals" if gold else "") + (f", {len(drifts)} drifts" if drifts else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
