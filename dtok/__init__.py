"""dtok: the exact IDs of Hugging Face ``tokenizers``, faster for long prompts.

>>> import dtok
>>> tok = dtok.Tokenizer.default()
>>> list(tok.encode("Hello")) == tok.reference.encode("Hello").ids
True
"""
from dtok.admission import Admission
from dtok.tokenizer import KNOBS, Tokenizer

__all__ = ["Tokenizer", "Admission", "KNOBS", "__version__"]
__version__ = "0.1.0"
