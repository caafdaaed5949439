#!/usr/bin/env python3
"""scripts/fixtures_clip_text.py — reference token ids for the CLIP tokenizer (model/clip/clip_tokenizer.c,
tests/test_clip_tokenizer.c).

The real CLIP vocabulary without a download: open_clip ships OpenAI's BPE merges (bpe_simple_vocab_16e6.txt.gz).
The vocabulary is built from them as CLIP builds it (256 byte symbols, the same with "</w>", one token per merge,
<|startoftext|> 49406, <|endoftext|> 49407: 49,408 tokens), handed to transformers' CLIPTokenizer (5.x: the
tokenizers-backed class, CLIPTokenizerFast in 4.x) and saved; its tokenizer.json is re-written compactly (one line,
the same JSON) and must give the same ids through tokenizers.Tokenizer.from_file (checked here).

Writes, under tests/fixtures/:
  clip_tok/tokenizer.json          the real CLIP tokenizer (compact JSON)
  clip_tok/tokenizer_config.json   pad_token "<|endoftext|>" (openai/clip-*'s choice; laion's folders pad with "!")
  clip_tok_cases.json              {"max_length": 77, "pad_id": 49407, "cases": [[text, ids, full_ids|null], ...]}:
                                   hard strings (unicode, accents, emoji, CJK, apostrophes, punctuation runs,
                                   numbers, whitespace runs, the empty prompt, prompts over 77 tokens); ids are
                                   transformers' tokenizer(text, padding="max_length", truncation=True,
                                   max_length=77).input_ids with the trailing pads dropped (checked: they are pads),
                                   full_ids the ids without truncation when they differ (long prompts).
                                   "open_clip": the indices of the cases where open_clip's SimpleTokenizer (ftfy,
                                   html.unescape; pads with 0) gives other ids than transformers, with its ids.
  clip_tok_vbench.json             {"rows": [ids...], "files": {name: [row per line]}}: the ids (as above, pads
                                   dropped) of every line of every VBench prompt file (*.txt in the data folder
                                   $VGRPO_VBENCH_DIR, default ../shared/data/vbench beside the repository, as the
                                   Makefile finds it), unique id lists stored once.

Run: .venv/bin/python scripts/fixtures_clip_text.py   (needs transformers, tokenizers, open_clip; CI never runs it)
"""
import glob
import gzip
import json
import os
import random
import shutil
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIX, "clip_tok")
VBENCH = os.environ.get("VGRPO_VBENCH_DIR") or os.path.join(ROOT, "..", "shared", "data", "vbench")
MAXLEN = 77


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def clip_vocab_merges():
    import open_clip
    path = os.path.join(os.path.dirname(open_clip.__file__), "bpe_simple_vocab_16e6.txt.gz")
    lines = gzip.open(path).read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1:49152 - 256 - 2 + 1]]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408
    return {t: i for i, t in enumerate(vocab)}, merges


HARD = [
    "", " ", "   ", "\t\n", "a", "A", "a cat", "A Cat On A Mat.", "a  cat\t\tand\n\na dog", "  leading and trailing  ",
    # apostrophes and contractions
    "it's", "IT'S", "don't stop", "we're here", "i've", "i'm", "you'll", "he'd", "''s", "'s", "'", "rock'n'roll",
    "the dog's bone", "o'clock", "it’s curly", "'sam'", "!'s", "a'S",
    # punctuation runs and symbols
    "wow!!!", "what?!?", "...", "a...b", "(hello)", "[x]", "{y}", "a-b_c", "e-mail", "c++", "#hashtag", "@user",
    "50% off", "$100", "a/b\\c", "<html>", "&amp; &lt;", "~~~", "***", "a,b,c", "one; two: three", "\"quoted\"",
    "«guillemets»", "—dash–", "…", "•", "©®™", "§¶",
    # numbers
    "1", "12", "123456789", "3.14159", "1,000,000", "2024-01-01", "v2.1", "4k", "x2", "²³", "½", "Ⅻ", "١٢٣", "①②",
    # accents and unicode letters
    "café", "cafe\u0301", "naïve résumé", "ÜBER STRASSE", "straße", "Ångström", "crème brûlée", "São Paulo",
    "İstanbul", "ΣΟΦΙΑ σοφια", "ὈΔΥΣΣΕΎΣ", "Привет мир", "ǅemal", "ﬁne ﬂow", "Ｈｅｌｌｏ Ｗｏｒｌｄ", "ｶﾀｶﾅ",
    "q\u0301", "a\u0308\u0301", "\u0301", "Ωμέγα", "مرحبا بالعالم", "שלום", "नमस्ते दुनिया", "สวัสดี",
    # CJK
    "一只猫在草地上奔跑", "夕阳下的海滩", "日本の桜", "東京タワー", "서울의 밤", "한국어 텍스트", "猫", "中文English混合",
    # emoji
    "😀", "a 😀 b", "👍🏽", "👨‍👩‍👧", "🇫🇷🇩🇪", "❤️", "I ❤ NY", "🐱🐶🐭", "fire🔥fire",
    # whitespace kinds
    "a\u00a0b", "a\u3000b", "a\u2009b", "a\u200bb", "a\u200db", "a\ufeffb", "a\x85b", "a\u2028b", "a\x0bb\x0cc",
    "a\x1cb\x1fc", "a\r\nb", "\x00a", "a\x7fb", "\u180eab", "a\u205fb\u202fc",
    # special tokens written literally
    "<|startoftext|>", "<|endoftext|>", "a<|endoftext|>b", "<|ENDOFTEXT|>", "!<|endoftext|>", "<|endoftext",
    "<start_of_text>",
    # bytes not in any merge
    "\x01\x02", "\u0378", "\U0010fffd", "\ue000",
]


def long_prompts(rng):
    words = ("a cinematic shot of a golden retriever running through a sunlit meadow with wildflowers swaying in "
             "the breeze while the camera slowly pans left revealing distant snow capped mountains under a clear "
             "blue sky 4k ultra detailed").split()
    out = [" ".join(words * 3), " ".join(words * 5) + " END", "a " * 76 + "b", "a " * 75, "a " * 74 + "b",
           "x" * 400, "😀" * 60, "猫" * 200, "1234567890" * 20, "!" * 500, ". " * 100]
    for _ in range(6):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(60, 120))))
    return out


def random_mix(rng, n):
    pool = [h for h in HARD if h] + "the a of in red blue cat video slowly camera".split()
    seps = [" ", "", "  ", "\t", "\n", "\u3000", "-", "'"]
    out = []
    for _ in range(n):
        k = rng.randint(1, 8)
        out.append("".join(rng.choice(pool) + rng.choice(seps) for _ in range(k)))
    return out


def main():
    from transformers import CLIPTokenizer
    from tokenizers import Tokenizer
    import open_clip

    vocab, merges = clip_vocab_merges()
    tmp = tempfile.mkdtemp()
    tok = CLIPTokenizer(vocab=vocab, merges=merges, pad_token="<|endoftext|>")
    tok.save_pretrained(tmp)
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(tmp, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "CLIPTokenizer", "pad_token": "<|endoftext|>", "bos_token": "<|startoftext|>",
                   "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": MAXLEN}, f,
                  indent=1)
    shutil.rmtree(tmp)

    ref = CLIPTokenizer.from_pretrained(OUT)
    raw = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    pad = ref.pad_token_id
    assert pad == 49407, pad
    oc = open_clip.tokenizer.SimpleTokenizer()

    def ids_of(text):
        ids = ref(text, padding="max_length", truncation=True, max_length=MAXLEN).input_ids
        assert len(ids) == MAXLEN
        full = ref(text).input_ids
        assert full == raw.encode(text).ids, text
        n = min(len(full), MAXLEN)
        assert ids[n:] == [pad] * (MAXLEN - n), text
        assert ids[:n] == (full if len(full) <= MAXLEN else full[:MAXLEN - 1] + [full[-1]]), text
        return ids[:n], full

    rng = random.Random(0)
    texts = HARD + long_prompts(rng) + random_mix(rng, 150)
    cases, diffs = [], []
    for i, t in enumerate(texts):
        ids, full = ids_of(t)
        cases.append([t, ids, full if full != ids else None])
        o = oc(t)[0].tolist()
        o = o[:len(o) - (len(o) - max(j for j, v in enumerate(o) if v != 0) - 1)]
        # open_clip names its specials <start_of_text>/<end_of_text>, same ids 49406/49407
        if o != ids:
            diffs.append([i, o])
    with open(os.path.join(FIX, "clip_tok_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"max_length": MAXLEN, "pad_id": pad, "cases": cases, "open_clip": diffs}, f, ensure_ascii=False,
                  separators=(",", ":"))
    print(f"clip_tok_cases.json: {len(cases)} cases; open_clip differs on {len(diffs)}:")
    for i, o in diffs:
        print(f"  {texts[i]!r}: transformers {cases[i][1][:12]} open_clip {o[:12]}")

    files = sorted(glob.glob(os.path.join(VBENCH, "*.txt")))
    if not files:
        print(f"clip_tok_vbench.json: not written ({VBENCH} has no prompt files)")
        return
    rows, index, out, nlines = [], {}, {}, 0
    for p in files:
        with open(p, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        per = []
        for line in lines:
            ids, _ = ids_of(line)
            key = tuple(ids)
            if key not in index:
                index[key] = len(rows)
                rows.append(ids)
            per.append(index[key])
        out[os.path.basename(p)] = per
        nlines += len(lines)
    with open(os.path.join(FIX, "clip_tok_vbench.json"), "w") as f:
        json.dump({"max_length": MAXLEN, "rows": rows, "files": out}, f, separators=(",", ":"))
    print(f"clip_tok_vbench.json: {len(files)} files, {nlines} lines, {len(rows)} distinct id lists")


if __name__ == "__main__":
    main()
