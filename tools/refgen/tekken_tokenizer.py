"""Reference case for Mistral's tekken.json carried inside a safetensors file, as ComfyUI's
FLUX.2 Mistral 3 text encoder files carry it (a 1-D uint8 tensor named tekken_model holding
the file's bytes).

The tiny tekken.json is the golden t2i-flux2 tokenizer written back in tekken's layout: its
20 named special tokens (ranks 0-19; the <SPECIAL_i> fillers up to 1000 implied by
config.default_num_special_tokens), its byte-level vocabulary as base64 token bytes in id
order, its pre-tokenizer regex as config.pattern. The script checks that transformers'
own conversion (integrations/mistral MistralConverter, what AutoTokenizer does with a
tekken.json) gives back the golden tokenizer.json's vocabulary and merges, and stores the
ids that conversion gives a few prompts formatted as Flux2Pipeline formats them (its chat
template, no added specials, left padding to 160 as FLUX.2's folder pads) in expected.txt,
as `diffuse tokenize --template flux2 -n 160` prints them.

Files (tests/cases/te-tekken-comfy/):
  mistral-tiny-tekken.safetensors  the golden Mistral3 encoder in ComfyUI's layout (model.,
                                   bf16) with the tekken_model tensor beside
  bad-*.safetensors                hostile tekken_model tensors (F32, 2-D, not JSON, the old
                                   layout without special_tokens, bad base64, a repeated token)
  prompt-N.txt, expected.txt       the prompts, and on line N + 1 transformers' ids for prompt N
and the seeds of tests/fuzz/fuzz_tekken.c (tests/fuzz/corpus/tekken/).

    /work/venv/bin/python tools/refgen/tekken_tokenizer.py
"""
import base64
import json
import os
import re
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.integrations.mistral.tokenizer import MistralConverter
from transformers import PreTrainedTokenizerFast

import refcase

NAME = "te-tekken-comfy"
GOLDEN_TOK = os.path.join(refcase.ROOT, "tests", "golden", "t2i-flux2", "pipeline", "tokenizer")
COMFY_FILE = os.path.join(refcase.CASES, "te-single-mistral-comfy",
                          "mistral_3_small_flux2-tiny-comfy-bf16.safetensors")
PROMPTS = ["a red fox in the snow",
           "Café naïve: 東京 at 12:45, 3.14159 🦊!!\n\n  two  spaces\tand a tab",
           "[INST] inside </s> a prompt [IMG] <pad> ok",
           "don't WORRY, it's FINE -- https://example.com/path?q=1"]
MAX_LENGTH = 160
# diffusers pipelines/flux2/system_messages.py SYSTEM_MESSAGE
SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured "
                  "responses focusing on object relationships, object\nattribution and actions "
                  "without speculation.")


def tekken_from_golden():
    with open(os.path.join(GOLDEN_TOK, "tokenizer.json")) as f:
        tj = json.load(f)
    specials = [a for a in tj["added_tokens"] if not re.fullmatch(r"<SPECIAL_\d+>", a["content"])]
    assert [a["id"] for a in specials] == list(range(len(specials)))
    n_special = len(tj["added_tokens"])
    decoder = {c: b for b, c in bytes_to_unicode().items()}
    vocab = sorted(((i, s) for s, i in tj["model"]["vocab"].items() if i >= n_special))
    assert [i for i, _ in vocab] == list(range(n_special, n_special + len(vocab)))
    entries = []
    for rank, (_, s) in enumerate(vocab):
        raw = bytes(decoder[c] for c in s)
        entries.append({"rank": rank, "token_bytes": base64.b64encode(raw).decode(),
                        "token_str": raw.decode("utf-8", "replace")})
    pattern = tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    return {"config": {"pattern": pattern, "num_vocab_tokens": len(entries),
                       "default_vocab_size": n_special + len(entries),
                       "default_num_special_tokens": n_special, "version": "v7"},
            "vocab": entries,
            "special_tokens": [{"rank": a["id"], "token_str": a["content"], "is_control": True}
                               for a in specials]}, tj


def u8(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def main():
    out = os.path.join(refcase.CASES, NAME)
    os.makedirs(out, exist_ok=True)
    tekken, golden = tekken_from_golden()
    text = json.dumps(tekken, ensure_ascii=False).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tekken.json")
        with open(path, "wb") as f:
            f.write(text)
        tok = MistralConverter(path).converted()
    got = json.loads(tok.to_str())
    assert got["model"]["vocab"] == golden["model"]["vocab"], "vocab differs"
    merges = [list(m) if not isinstance(m, str) else m.split(" ") for m in got["model"]["merges"]]
    assert merges == golden["model"]["merges"], "merges differ"

    # transformers' tokenizer of the tekken.json with FLUX.2's folder settings, against the
    # golden folder's own.
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>", padding_side="left")
    folder = PreTrainedTokenizerFast.from_pretrained(GOLDEN_TOK)
    lines = []
    for p in PROMPTS:
        # Flux2Pipeline's text input: the chat template over [system, user], tokenized
        # without added specials (the template has the <s>), padded to max_length.
        msgs = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_MESSAGE}]},
                {"role": "user", "content": [{"type": "text", "text": p.replace("[IMG]", "")}]}]
        rendered = folder.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
        assert rendered == ("<s>[SYSTEM_PROMPT]" + SYSTEM_MESSAGE + "[/SYSTEM_PROMPT][INST]" +
                            p.replace("[IMG]", "") + "[/INST]"), rendered
        a = fast(rendered, add_special_tokens=False, padding="max_length", truncation=True,
                 max_length=MAX_LENGTH)
        b = folder(rendered, add_special_tokens=False, padding="max_length", truncation=True,
                   max_length=MAX_LENGTH)
        assert a["input_ids"] == b["input_ids"], (p, a, b)
        assert a["input_ids"][-1] != 11, "not left-padded"
        with open(os.path.join(out, f"prompt-{len(lines)}.txt"), "w") as f:
            f.write(p)
        lines.append("input_ids: [" + ", ".join(str(i) for i in a["input_ids"]) + "]")
    with open(os.path.join(out, "expected.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    sd = load_file(COMFY_FILE)
    sd["tekken_model"] = u8(text)
    save_file(sd, os.path.join(out, "mistral-tiny-tekken.safetensors"))

    # The hostile ones start from a small tekken.json: the specials and the first 300 tokens.
    small = json.loads(text)
    small["vocab"] = small["vocab"][:300]
    small["config"]["default_vocab_size"] = small["config"]["default_num_special_tokens"] + 300
    old = dict(small)
    old.pop("special_tokens")
    dup = json.loads(json.dumps(small))
    dup["vocab"][260] = dict(dup["vocab"][258])
    bad64 = json.loads(json.dumps(small))
    bad64["vocab"][7]["token_bytes"] = "not base64!"
    bad = {"f32": {"tekken_model": torch.zeros(4)},
           "2d": {"tekken_model": u8(text[:64]).reshape(8, 8)},
           "notjson": {"tekken_model": u8(b"\x00\xffnot json")},
           "old": {"tekken_model": u8(json.dumps(old).encode())},
           "dup": {"tekken_model": u8(json.dumps(dup).encode())},
           "b64": {"tekken_model": u8(json.dumps(bad64).encode())}}
    for k, v in bad.items():
        save_file(v, os.path.join(out, f"bad-{k}.safetensors"))
    for f in os.listdir(out):
        os.chmod(os.path.join(out, f), 0o644)

    # Seeds of tests/fuzz/fuzz_tekken.c: "TEKKEN \0 PROMPT".
    corpus = os.path.join(refcase.ROOT, "tests", "fuzz", "corpus", "tekken")
    os.makedirs(corpus, exist_ok=True)
    padded = json.loads(json.dumps(small))
    padded["config"]["default_vocab_size"] -= 20  # rows past it are dropped
    clash = json.loads(json.dumps(small))
    clash["special_tokens"][19]["token_str"] = "a"  # a special spelled as a byte token
    seeds = {"small": small, "padded": padded, "clash": clash, "old": old, "dup": dup,
             "b64": bad64}
    for k, v in seeds.items():
        with open(os.path.join(corpus, f"{k}.bin"), "wb") as f:
            f.write(json.dumps(v).encode() + b"\0" + PROMPTS[1].encode())
    print(NAME, "done")


if __name__ == "__main__":
    main()
