"""The pure core: messages, events, the log and its fold, the codec, history, compaction
planning, session ids. No threads, no I/O, no Pykka: every layer above builds on it."""
