"""attnres.data: text corpora -> tokenizer -> cached token streams -> training and evaluation batches.

    config = DataConfig(source="demo", vocab_size=4096)
    data = prepare_data(config, run_dir=Path("runs/x"))
    batches = TokenBatches(data.train_tokens, seq_len=256, batch_size=16, seed=0)
    ids = batches.next_batch()                      # (16, 256) int64
    val = eval_batches(data.val_tokens, 256, 16, max_batches=20)

Flow: config -> sources (+ demo_corpus) -> split -> tokenizer -> packing (cache) -> loader;
prepare ties them together.
"""

from attnres.data.data_config import DataConfig
from attnres.data.demo_corpus import ensure_demo_corpus
from attnres.data.data_error import DataError
from attnres.data.loader import TokenBatches, eval_batches
from attnres.data.prepare import PreparedData, prepare_data
from attnres.data.sources import Document, iter_documents
from attnres.data.split import is_validation, split_of
from attnres.data.tokenizer import Tokenizer, train_bpe

__all__ = [
    "DataConfig",
    "DataError",
    "Document",
    "PreparedData",
    "TokenBatches",
    "Tokenizer",
    "ensure_demo_corpus",
    "eval_batches",
    "is_validation",
    "iter_documents",
    "prepare_data",
    "split_of",
    "train_bpe",
]
