"""Tiny decoder LLMs made by the tests themselves, offline: a real transformers architecture
(Qwen2 or Llama) with a few small layers and random weights, saved as *ForCausalLM (as the hub
ships them: the classification head is new), and a real tokenizer: byte-level BPE trained here
on the test texts, with no pad token (as Llama and Qwen ship) and, for the Qwen one, a chat
template. So transformers' and peft's own code paths run: the pad taken from EOS, the score read
at the last real token, LoRA on q/k/v/o and the gated MLP."""

from __future__ import annotations

from pathlib import Path

QWEN_CHAT = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer_for(texts: list[str], chat: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if chat else ["<s>", "</s>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    every_byte = pre_tokenizers.ByteLevel.alphabet()  # as real byte-level vocabularies: newlines, any text
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=specials, initial_alphabet=every_byte, show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    if chat:  # Qwen: no BOS, EOS <|im_end|>, no pad token
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
        fast.chat_template = QWEN_CHAT
    else:  # Llama: BOS added to every text, EOS </s>, no pad token
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    return fast


def write_tiny_llm(folder: Path, texts: list[str], arch: str = "qwen2", layers: int = 2, hidden: int = 64) -> Path:
    """A `arch` (qwen2 | llama) decoder of `layers` blocks in `folder`: config.json,
    model.safetensors, tokenizer files. Deterministic (seed 0)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    tokenizer = tokenizer_for(texts, chat=arch == "qwen2")
    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[
        arch
    ]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model_class(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def write_tiny_encoder(folder: Path, texts: list[str], layers: int = 2, hidden: int = 64) -> Path:
    """A BERT encoder of `layers` blocks in `folder`, with a WordPiece tokenizer trained on `texts`
    ([CLS] text [SEP], a [PAD] token, as BERT-style checkpoints ship): a real encoder architecture
    for the text task where no downloaded model may be carried (a GPU machine's 64 MiB)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = Path(folder)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=600, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )  # fmt: skip
    config = BertConfig(
        vocab_size=len(fast), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=2 * hidden, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    BertModel(config).save_pretrained(str(folder))
    fast.save_pretrained(str(folder))
    return folder
