#!/usr/bin/env python3
"""scripts/fixtures_text.py — reference values for the text side: model/text/tokenizer.c, model/text/umt5.c and
`vgrpo encode-prompts` (tests/test_tokenizer.c, tests/test_umt5.c).

Writes, under tests/fixtures/:
  text_tiny/tokenizer/tokenizer.json
      A SentencePiece Unigram model trained here (sentencepiece, normalization_rule_name=nmt_nfkc, byte_fallback,
      700 pieces, pad 0 / eos 1 / unk 2) on a synthetic corpus, converted to the Hugging Face format with
      transformers' T5Converter (convert_slow_tokenizer: the route umT5's tokenizer.json came from; extra_ids 0).
      The file is large for its vocabulary because the nmt_nfkc character map (~240 KB) is embedded in it.
  text_tok_cases.json
      {"cases": [[string, [ids...]], ...]}: >= 1000 strings (ASCII, accents precomposed and decomposed,
      full-width and half-width forms, ligatures, CJK, Hangul, emoji with ZWJ / skin tones / flags, repeated and
      exotic spaces, tabs and newlines, the empty string) and the ids of the fast tokenizer
      (tokenizers.Tokenizer.from_file(...).encode(s).ids: add_special_tokens, so EOS is appended).
  text_tiny/text_encoder/{config.json, model.safetensors}
      A tiny random transformers UMT5EncoderModel (d_model 32, 2 layers, 4 heads, d_kv 8, d_ff 48, vocab 700),
      weights drawn wide (normals / sqrt(fan_in), norm gains 1 + 0.3 z, position biases 0.5 z), saved F32.
  text_umt5_io.safetensors
      input_ids I64 [2, 12], attention_mask I64 [2, 12] (row 1 padded after 7 tokens), hidden_states F32 [2, 12, 32]
      (last_hidden_state, float32 eager, CPU);
      prompt_embeds F32 [3, 16, 32], prompt_lengths I64 [3], negative_embeds F32 [1, 16, 32]: diffusers'
      WanPipeline._get_t5_prompt_embeds(max_sequence_length=16) on the three prompts in __metadata__ "prompts"
      (a JSON list; the third is longer than 16 tokens: truncation) and on "" (the negative prompt).
      buckets I64 [1201]: UMT5Attention._relative_position_bucket of relative positions -600..600 (encoder).
      ftfy is not installed here, so basic_clean skips ftfy.fix_text, as vgrpo does.

Run: .venv/bin/python scripts/fixtures_text.py   (needs sentencepiece, protobuf, tokenizers, transformers,
torch, diffusers, safetensors; CI never runs it)
"""
import json
import math
import os
import random
import tempfile

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
TINY = os.path.join(FIX, "text_tiny")

WORDS = ("the a cat dog runs jumps over lazy fox video of in on with slowly quickly red blue green sunset ocean "
         "city night camera pans left right forest river mountain snow rain light people walking street car").split()
ACCENTS = "café naïve résumé über straße façade piñata Ångström crème brûlée São Paulo élan".split()
CJK = "一只猫在草地上奔跑 夕阳下的海滩 城市夜景 日本の桜 東京タワー 서울의 밤 한국어".split()
SYL = ["ka", "to", "ri", "men", "sho", "lu", "vi", "dre", "pa", "qu", "zen", "xo", "bal", "tor", "ing", "ed", "er"]

# Fragments for the test strings: what nmt_nfkc rewrites, what the vocabulary lacks, and whitespace of every kind.
EXOTIC = ["Ｈｅｌｌｏ", "ＡＢＣ１２３", "ｶﾀｶﾅ", "ｶﾞ", "ﬁne", "ﬂow", "①②", "x²", "Ⅻ", "™", "½", "…", "—", "“quoted”",
          "e\u0301", "a\u0308", "n\u0303o", "A\u030a", "\u00e9\u0301", "Z\u0335", "\u3000", "\u00a0", "\u2009", "\u200b",
          "\u200d", "\ufeff", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "©\ufe0f", "a\U0001F3FB", "1\ufe0f\u20e3", "Ωμέγα", "Привет",
          "مرحبا", "שלום", "नमस्ते", "สวัสดี", "ñ", "İstanbul", "ß", "ǅ", "㍿", "㌀", "ｱｲｳ", "\t", "\n", "\r\n", "\r",
          "\x0b", "\x0c", "\x85", "\u2028", "  ", "   ", "\x01", "\x7f", "<b>", "&amp;", "#", "%", "@", "_", "~",
          "(1990)", "3.14", "42", "!", "?", ".", ",", "'", '"', "\\", "/", "猫", "桜", "밤", "한"]


def corpus_lines(rng):
    lines = []
    for _ in range(4000):
        ws = []
        for _ in range(rng.randint(3, 12)):
            if rng.random() < 0.6:
                ws.append(rng.choice(WORDS + ACCENTS + CJK))
            else:
                ws.append("".join(rng.choice(SYL) for _ in range(rng.randint(1, 4))))
        if rng.random() < 0.3:
            ws.append(rng.choice([",", ".", "!", "?", "(1990)", "42", "3.14"]))
        lines.append(" ".join(ws))
    return lines


def test_strings(rng):
    out = ["", " ", "  ", "\t", "\n", "a", "A", " a", "a ", "  a  b  ", "hello world", "hello  world", "a\r\nb",
           "e\u0301", "Ｈｅｌｌｏ　Ｗｏｒｌｄ", "猫", "😀", "ﬁ", "\u00a0x\u00a0", "x\u3000\u3000y"]
    out += EXOTIC
    pool = WORDS + ACCENTS + CJK + EXOTIC
    seps = [" ", " ", " ", "", "  ", "\t", "\n", "\u3000", "\u00a0"]
    while len(out) < 1200:
        n = rng.randint(1, 10)
        s = ""
        for i in range(n):
            r = rng.random()
            if r < 0.55:
                w = rng.choice(pool)
            elif r < 0.8:
                w = "".join(rng.choice(SYL) for _ in range(rng.randint(1, 3)))
            else:
                w = "".join(chr(rng.choice([rng.randint(0x21, 0x7e), rng.randint(0xa0, 0x24f), rng.randint(0x4e00, 0x4fff),
                                            rng.randint(0xff01, 0xff5e), rng.randint(0x1f300, 0x1f64f),
                                            rng.randint(0x300, 0x36f), rng.randint(0xac00, 0xad00)]))
                            for _ in range(rng.randint(1, 4)))
            s += w + (rng.choice(seps) if i + 1 < n else "")
        if rng.random() < 0.15:
            s = " " * rng.randint(1, 3) + s
        if rng.random() < 0.15:
            s = s + " " * rng.randint(1, 3)
        if rng.random() < 0.3:
            s = s.upper()
        out.append(s)
    return out


def gen_tokenizer():
    import sentencepiece as spm
    from tokenizers import Tokenizer
    from transformers.convert_slow_tokenizer import T5Converter

    rng = random.Random(0)
    tdir = os.path.join(TINY, "tokenizer")
    os.makedirs(tdir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "corpus.txt"), "w") as f:
            f.write("\n".join(corpus_lines(rng)))
        spm.SentencePieceTrainer.train(input=os.path.join(tmp, "corpus.txt"), model_prefix=os.path.join(tmp, "m"),
                                       vocab_size=700, model_type="unigram", normalization_rule_name="nmt_nfkc",
                                       byte_fallback=True, character_coverage=0.9995, pad_id=0, eos_id=1, unk_id=2,
                                       bos_id=-1, minloglevel=2, num_threads=1)

        class Slow:  # what T5Converter reads from a slow tokenizer
            vocab_file = os.path.join(tmp, "m.model")
            _extra_ids = 0

            def convert_tokens_to_ids(self, token):
                return 1  # </s>

        T5Converter(Slow()).converted().save(os.path.join(tdir, "tokenizer.json"))
    tok = Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
    cases = [[s, tok.encode(s).ids] for s in test_strings(rng)]
    with open(os.path.join(FIX, "text_tok_cases.json"), "w") as f:
        json.dump({"cases": cases}, f, ensure_ascii=True, separators=(",", ":"))
    print(f"tokenizer: {tok.get_vocab_size()} pieces, {len(cases)} cases")


def umt5_random_state(model, gen):
    sd = {}
    for name, p in model.state_dict().items():
        z = torch.randn(tuple(p.shape), generator=gen, dtype=torch.float32)
        if "layer_norm" in name:
            v = 1.0 + 0.3 * z
        elif "relative_attention_bias" in name:
            v = 0.5 * z
        elif "shared" in name or "embed_tokens" in name:
            v = z
        else:
            v = z / math.sqrt(p.shape[1])
        sd[name] = v.contiguous()
    return sd


def gen_umt5():
    from safetensors.torch import save_file
    from transformers import UMT5Config, UMT5EncoderModel, AutoTokenizer, PreTrainedTokenizerFast
    from diffusers.pipelines.wan import pipeline_wan

    torch.manual_seed(5)
    gen = torch.Generator().manual_seed(5)
    cfg = UMT5Config(vocab_size=700, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=32, relative_attention_max_distance=128,
                     feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0)
    model = UMT5EncoderModel(cfg).eval()
    sd = umt5_random_state(model, gen)
    sd["encoder.embed_tokens.weight"] = sd["shared.weight"]
    model.load_state_dict(sd, strict=True)
    model.save_pretrained(os.path.join(TINY, "text_encoder"), safe_serialization=True)

    ids = torch.randint(3, 700, (2, 12), generator=gen, dtype=torch.int64)
    mask = torch.ones((2, 12), dtype=torch.int64)
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    ids[:, -1][mask[:, -1] == 1] = 1
    ids[1, 6] = 1
    with torch.no_grad():
        hs = model(input_ids=ids, attention_mask=mask).last_hidden_state

    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TINY, "tokenizer", "tokenizer.json"),
                                  eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
    prompts = ["A red cat runs over the  lazy dog, slowly.",
               "  caf&amp;eacute; &lt;b&gt; Ｈｅｌｌｏ\tworld\n 夕阳下的海滩  ",
               "the camera pans left over a green forest river at night with snow and rain and light people"]

    class Pipe:  # the parts of WanPipeline that _get_t5_prompt_embeds uses
        tokenizer = tok
        text_encoder = model
        _execution_device = torch.device("cpu")

    assert not pipeline_wan.is_ftfy_available(), "ftfy installed: vgrpo does not reproduce ftfy.fix_text"
    enc = pipeline_wan.WanPipeline._get_t5_prompt_embeds
    with torch.no_grad():
        pe = enc(Pipe(), prompts, max_sequence_length=16, device=torch.device("cpu"), dtype=torch.float32)
        ne = enc(Pipe(), [""], max_sequence_length=16, device=torch.device("cpu"), dtype=torch.float32)
    lens = torch.tensor([min(len(tok(pipeline_wan.prompt_clean(p)).input_ids), 16) for p in prompts], dtype=torch.int64)
    rel = torch.arange(-600, 601, dtype=torch.int64)
    buckets = model.encoder.block[0].layer[0].SelfAttention._relative_position_bucket(rel)
    io = {"buckets": buckets.to(torch.int64).contiguous(), "input_ids": ids, "attention_mask": mask, "hidden_states": hs.contiguous(), "prompt_embeds": pe.contiguous(),
          "prompt_lengths": lens, "negative_embeds": ne.contiguous()}
    save_file(io, os.path.join(FIX, "text_umt5_io.safetensors"), metadata={"prompts": json.dumps(prompts)})
    print(f"umt5: hidden {tuple(hs.shape)}, prompt lengths {lens.tolist()}")


if __name__ == "__main__":
    os.makedirs(FIX, exist_ok=True)
    gen_tokenizer()
    gen_umt5()
