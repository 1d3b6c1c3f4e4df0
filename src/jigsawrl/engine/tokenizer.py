"""A character-level tokenizer built in code, so the real engine runs with no download.

No PyPI package ships a small causal LM, and the small random-init models of
`jigsawrl.engine.models` need a vocabulary of about a hundred symbols: one token per printable
ASCII character (32..126) plus the newline, and four special tokens with fixed ids:
``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3. Ids are deterministic (a fixed list,
no training), so a model trained in one process decodes the same text in another.

The tokenizer is a `tokenizers` WordLevel model behind a pre-tokenizer that isolates every
character, with a `Fuse` decoder so that ``decode(encode(s)) == s`` (no spaces are inserted
between tokens). Characters outside the vocabulary map to ``<unk>`` instead of raising. Encoding
adds no ``<bos>``/``<eos>``: prompt building is the caller's business. It is wrapped in a
transformers `PreTrainedTokenizerFast`, so ``save_pretrained`` / ``from_pretrained`` work offline.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from jigsawrl.errors import InputError

log = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
CHARACTERS: tuple[str, ...] = tuple(chr(c) for c in range(32, 127)) + ("\n",)


def char_vocab() -> dict[str, int]:
    """The fixed vocabulary: special tokens first (``<pad>`` = 0), then the characters in order."""
    return {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (100 tokens) in code, with no file or network access.

    Returns:
        A transformers fast tokenizer with ``pad/bos/eos/unk`` special tokens set.
    """
    core = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK))
    # `[\s\S]` matches any single character, newline included: every character is one token.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    return tok


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer saved with ``save_pretrained`` from a local directory (never the hub).

    Raises:
        InputError: the directory is missing or holds no loadable tokenizer.
    """
    path = Path(path)
    if not path.is_dir():
        raise InputError(
            "tokenizer directory not found", where=str(path), fix="pass a directory written by "
            "save_pretrained (tokenizer.json + tokenizer_config.json)"
        )
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise InputError(
            "no tokenizer files", where=str(path),
            fix=f"save the tokenizer there (save_pretrained writes {TOKENIZER_FILES[0]})",
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad directory
        raise InputError(
            f"cannot load a tokenizer: {type(exc).__name__}: {exc}",
            where=str(path),
            fix="check tokenizer.json / tokenizer_config.json, or rebuild with "
            "build_char_tokenizer()",
        ) from exc
    if len(tok) < 2:  # transformers builds an empty tokenizer from a config alone
        raise InputError(f"the tokenizer has {len(tok)} token(s)", where=str(path),
                         fix="save the tokenizer's vocabulary files with it")
    log.debug("loaded tokenizer of %d tokens from %s", len(tok), path)
    return tok
