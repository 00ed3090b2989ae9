"""Build a tiny random-weight Llama chat model for the vLLM conformance tier.

Run with the vLLM venv's python (needs torch, transformers, tokenizers):

    python build_tiny_model.py --out DIR --vocab-size 512 --revision 1

Writes a byte-level BPE tokenizer (exactly ``--vocab-size`` tokens) with a
llama-like chat template, a 2-layer ``LlamaForCausalLM`` (hidden 128, 2 heads
-> head_dim 64; smaller head dims crash vLLM's CPU attention kernel) with the
same vocab size, and ``tiny_model.json`` (written last: marks a complete build).
The model outputs gibberish; what matters is that token counts are exact.
Deterministic and offline.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2

# "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

CORPUS = [
    "You are a helpful assistant.",
    "You are terse. Answer in one word.",
    "Hello, how are you today?",
    "What is the capital of France? The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog.",
    "Tell me a joke about computers and networks.",
    "Envoy external processing filters inspect requests and responses.",
    "Count the tokens in the prompt and in the completion.",
    "<|system|>\n<|user|>\n<|assistant|>\n<|end|>\n",
    "0123456789 !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
]


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    # The corpus is small: top the vocabulary up with filler tokens so that the
    # tokenizer size is exactly vocab_size (== the model's embedding rows).
    missing = vocab_size - tok.get_vocab_size(with_added_tokens=True)
    if missing < 0:
        raise SystemExit(f"tokenizer has more than {vocab_size} tokens")
    if missing:
        tok.add_tokens([f"<|filler_{i}|>" for i in range(missing)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) != vocab_size:
        raise SystemExit(f"tokenizer size {len(fast)} != {vocab_size}")
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast, vocab_size: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--revision", type=int, default=1)
    args = parser.parse_args()

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.vocab_size)
    # Keep the chat template inside tokenizer_config.json (not chat_template.jinja).
    tokenizer.save_pretrained(out, save_jinja_files=False)
    model = build_model(tokenizer, args.vocab_size)
    model.save_pretrained(out, safe_serialization=True)

    # Sanity: the template renders a system prompt and the messages.
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered == "<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\n", rendered

    meta = {
        "revision": args.revision,
        "vocab_size": args.vocab_size,
        "tokenizer_len": len(tokenizer),
        "model_vocab_size": model.config.vocab_size,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tiny_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: v for k, v in meta.items() if k != "chat_template"}))


if __name__ == "__main__":
    main()
