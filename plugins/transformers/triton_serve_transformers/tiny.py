"""A tiny random-weight Llama-architecture chat model (a few hundred kB), made locally for tests and the example:
a character-level tokenizer built with ``tokenizers``, with a chat template. No download.

    python -m triton_serve_transformers.tiny <directory>
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def make_tiny_llama(directory: Path | str, *, context: int = 256, seed: int = 0) -> Path:
    """Save the model and its tokenizer into ``directory`` with ``save_pretrained``; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    vocabulary = ["<unk>", "<s>", "</s>"] + [chr(code) for code in range(32, 127)] + ["\n"]
    tokenizer = Tokenizer(models.WordLevel(vocab={token: i for i, token in enumerate(vocabulary)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # one token per character
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(vocabulary), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def ensure_tiny_llama(directory: Path, name: str) -> Path:
    """The directory holding a tiny model: ``directory`` if it has a ``config.json``, else one made there (or,
    where ``directory`` cannot be written, e.g. an installed package, in the user's cache under ``name``).
    The files are made aside and moved in with ``config.json`` last, so a half-made model is never loaded."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "triton-serve" / "tiny-models" / name
    for target in (directory, cache):
        if (target / "config.json").is_file():
            return target
        try:
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".making-", dir=target) as scratch:
                made = make_tiny_llama(scratch)
                files = sorted(made.iterdir(), key=lambda path: path.name == "config.json")
                for path in files:
                    os.replace(path, target / path.name)
            return target
        except OSError:
            continue
    raise OSError(f"cannot write a tiny model into '{directory}' or '{cache}'")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m triton_serve_transformers.tiny <directory>")
    print(make_tiny_llama(sys.argv[1]))
