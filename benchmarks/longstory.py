import sys

sys.path.insert(0, "benchmarks")
from pathlib import Path

from storygen import records, write

# python benchmarks/longstory.py OUT.jsonl: 318 messages, 15 scenes (~21 messages), each with summary and history
recs = records(
    318, seed=11, scene_size=22, history_every=1, summary_sentences=20, message_sentences=(14, 28), cards_at=(5, 140)
)
write(Path(sys.argv[1]), recs)
